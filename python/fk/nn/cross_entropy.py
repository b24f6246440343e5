from typing import Optional

import torch
from torch import nn

from ..ops.cross_entropy import REDUCTIONS


class CrossEntropyLoss(nn.Module):
    """Cross entropy with the constructor of ``torch.nn.CrossEntropyLoss`` (``weight``,
    ``ignore_index``, ``reduction``, ``label_smoothing``; the deprecated ``size_average`` /
    ``reduce`` are not taken), plus fk's ``lse_square_scale``, ``softcap``,
    ``grad_in_logits``, ``loss_dtype`` and ``defer_grad`` (see :func:`fk.cross_entropy`: by
    default the forward writes the gradient into the logits' memory; with ``defer_grad``,
    for a loss scaled before ``backward()``, the backward does). ``forward(logits,
    target)`` takes ``(N, V)`` logits and returns the loss.

    In TorchScript the gradient always goes into a separate buffer: the JIT takes the op
    to leave the logits unchanged and may, for one, merge two identical logits
    computations into one tensor, which a second loss would then read as gradients.
    """

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0, *,
                 lse_square_scale: float = 0.0, softcap: Optional[float] = None,
                 grad_in_logits: bool = True, loss_dtype: Optional[torch.dtype] = None,
                 defer_grad: bool = False):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.register_buffer("weight", weight)
        self.weight: Optional[torch.Tensor]
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = float(label_smoothing)
        self.lse_square_scale = float(lse_square_scale)
        self.softcap = None if softcap is None else float(softcap)
        self.grad_in_logits = grad_in_logits
        self.loss_dtype = loss_dtype
        self.defer_grad = defer_grad

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = torch.ops.fk.cross_entropy(logits, target, self.weight, self.ignore_index,
                                         self.label_smoothing, self.reduction,
                                         self.lse_square_scale, self.softcap,
                                         self.grad_in_logits and not torch.jit.is_scripting(),
                                         self.loss_dtype, False, False, None, self.defer_grad)
        return out[0]

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, lse_square_scale="
                f"{self.lse_square_scale}, softcap={self.softcap}, "
                f"grad_in_logits={self.grad_in_logits}, defer_grad={self.defer_grad}")
