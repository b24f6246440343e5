from typing import Optional

import torch
from torch import nn


class FusedLinearJSD(nn.Module):
    """Distillation loss of a student's and a frozen teacher's language-model heads without
    their logits: ``forward(student_input, student_weight, teacher_input, teacher_weight,
    shift_labels=None)`` returns :func:`fk.fused_linear_jsd` of them (the call of Liger
    Kernel's ``LigerFusedLinearJSD``). The inputs may have leading dimensions (``(..., H)``
    with ``shift_labels`` ``(...)``); they are flattened.

    Args:
        jsd_beta: ``beta`` of the generalized JSD, in ``[0, 1]`` (0: forward KL, 1: reverse KL).
        ignore_index: label of rows that do not count.
        temperature: positive; both heads' logits are divided by it.
        chunk_size: rows per chunk (see :func:`fk.fused_linear_jsd`).
    """

    def __init__(self, jsd_beta: float = 0.5, ignore_index: int = -100,
                 temperature: float = 1.0, *, chunk_size: Optional[int] = None):
        super().__init__()
        if not 0.0 <= jsd_beta <= 1.0:
            raise ValueError(f"jsd_beta must be in [0, 1], got {jsd_beta}")
        if not temperature > 0.0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.jsd_beta = float(jsd_beta)
        self.ignore_index = ignore_index
        self.temperature = float(temperature)
        self.chunk_size = chunk_size

    def forward(self, student_input: torch.Tensor, student_weight: torch.Tensor,
                teacher_input: torch.Tensor, teacher_weight: torch.Tensor,
                shift_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        if shift_labels is not None:
            shift_labels = shift_labels.reshape(-1)
        return torch.ops.fk.fused_linear_jsd(
            student_input.reshape(-1, student_input.shape[-1]), student_weight,
            teacher_input.reshape(-1, teacher_input.shape[-1]), teacher_weight, shift_labels,
            self.jsd_beta, self.ignore_index, self.temperature, self.chunk_size)

    def extra_repr(self) -> str:
        return (f"jsd_beta={self.jsd_beta}, ignore_index={self.ignore_index}, "
                f"temperature={self.temperature}, chunk_size={self.chunk_size}")
