from typing import Optional

import torch
from torch import nn

from ..ops.tvd import REDUCTIONS


class TVDLoss(nn.Module):
    """Total variation distance with the constructor of Liger Kernel's ``LigerTVDLoss``
    (``reduction``, ``ignore_index``); ``forward(p, q, shift_labels=None)`` takes ``(BT, V)``
    probabilities and returns the loss (see :func:`fk.tvd`; the gradient flows to ``p``)."""

    def __init__(self, reduction: str = "batchmean", ignore_index: int = -100):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.ignore_index = ignore_index

    def forward(self, p: torch.Tensor, q: torch.Tensor,
                shift_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.ops.fk.tvd(p, q, shift_labels, self.reduction, self.ignore_index)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"
