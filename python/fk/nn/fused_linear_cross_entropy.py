from typing import Optional

import torch
from torch import nn

from ..ops.cross_entropy import REDUCTIONS


class FusedLinearCrossEntropyLoss(nn.Module):
    """The loss of a language-model head without its logits: ``forward(lin_weight, x,
    target, bias=None)`` returns ``cross_entropy(x @ lin_weight.T + bias, target)`` (the
    call of Liger Kernel's module of the same name). ``x`` may have leading dimensions
    (``(..., H)`` with ``target`` ``(...)``); they are flattened. Constructor arguments as
    ``torch.nn.CrossEntropyLoss`` (``ce_weight`` is its ``weight``) plus fk's
    ``lse_square_scale``, ``softcap``, ``chunk_size``, ``accum_dtype``, ``loss_dtype`` and
    ``use_token_scaling``; see :func:`fk.fused_linear_cross_entropy`.
    """

    def __init__(self, ce_weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0, *,
                 lse_square_scale: float = 0.0, softcap: Optional[float] = None,
                 chunk_size: Optional[int] = None, accum_dtype: Optional[torch.dtype] = None,
                 loss_dtype: Optional[torch.dtype] = None, use_token_scaling: bool = False):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.register_buffer("ce_weight", ce_weight)
        self.ce_weight: Optional[torch.Tensor]
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = float(label_smoothing)
        self.lse_square_scale = float(lse_square_scale)
        self.softcap = None if softcap is None else float(softcap)
        self.chunk_size = chunk_size
        self.accum_dtype = accum_dtype
        self.loss_dtype = loss_dtype
        self.use_token_scaling = use_token_scaling

    def forward(self, lin_weight: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        out = torch.ops.fk.fused_linear_cross_entropy(
            x.reshape(-1, x.shape[-1]), lin_weight, target.reshape(-1), bias, self.ce_weight,
            self.ignore_index, self.label_smoothing, self.reduction, self.lse_square_scale,
            self.softcap, self.chunk_size, self.accum_dtype, self.loss_dtype,
            self.use_token_scaling)
        return out[0]

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, lse_square_scale="
                f"{self.lse_square_scale}, softcap={self.softcap}, chunk_size="
                f"{self.chunk_size}, accum_dtype={self.accum_dtype}, use_token_scaling="
                f"{self.use_token_scaling}")
