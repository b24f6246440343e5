from typing import Optional

import torch
from torch import nn


class JSD(nn.Module):
    """Generalized Jensen-Shannon divergence with Liger Kernel's ``LigerJSD`` constructor
    (``beta``, ``ignore_index``); ``forward(log_q, log_p, shift_labels=None)`` takes the
    student's and the teacher's ``(BT, V)`` log-probabilities and returns the 0-dim loss
    (see :func:`fk.jsd`)."""

    def __init__(self, beta: float = 0.5, ignore_index: int = -100):
        super().__init__()
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.beta = float(beta)
        self.ignore_index = ignore_index

    def forward(self, log_q: torch.Tensor, log_p: torch.Tensor,
                shift_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.ops.fk.jsd(log_q, log_p, shift_labels, self.beta, self.ignore_index)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}"
