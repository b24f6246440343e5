import torch
from torch import nn

from ..ops.poly_norm import poly_norm


class PolyNorm(nn.Module):
    """PolyNorm over the last dimension (see :func:`fk.poly_norm`), with the parameters of
    Liger Kernel's ``LigerPolyNorm`` and the PolyCom reference: ``weight`` (3,) initialised to
    1/3 each and a scalar ``bias`` (shape ``()``) initialised to 1; ``variance_epsilon`` is
    ``eps``."""

    def __init__(self, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.ones((), device=device, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return poly_norm(x, self.weight, self.bias, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"eps={self.variance_epsilon}"
