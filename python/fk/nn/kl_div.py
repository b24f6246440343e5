from typing import Optional

import torch
from torch import nn

from ..ops.kl_div import REDUCTIONS


class KLDivLoss(nn.Module):
    """KL divergence loss with the constructor of ``torch.nn.KLDivLoss`` (``size_average``,
    ``reduce``, ``reduction``, ``log_target``; the deprecated ``size_average`` / ``reduce``
    map to a reduction as torch maps them, with torch's deprecation warning), plus Liger
    Kernel's ``eps`` (see :func:`fk.kl_div`). The default reduction is torch's ``"mean"``
    (sum / numel); ``"batchmean"`` is the KL divergence per row. ``forward(input, target)``
    takes log-probabilities and (log-)probabilities of one shape and dtype."""

    def __init__(self, size_average: Optional[bool] = None, reduce: Optional[bool] = None,
                 reduction: str = "mean", log_target: bool = False, eps: float = 1e-10):
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = nn.modules.loss._Reduction.legacy_get_string(size_average, reduce)
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be non-negative, got {eps!r}")
        self.reduction = reduction
        self.log_target = log_target
        self.eps = float(eps)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.ops.fk.kl_div(input, target, self.reduction, self.log_target, self.eps)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, log_target={self.log_target}, eps={self.eps}"
