import torch
from torch import nn

from ..ops.softmax import softmax


class Softmax(nn.Module):
    """Softmax over ``dim`` (see :func:`fk.softmax`), like ``torch.nn.Softmax``.

    ``dim`` defaults to -1; torch's implicit choice of dim for ``dim=None`` is deprecated
    there and not supported here.
    """

    __constants__ = ["dim"]
    dim: int

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        if dim is None:
            raise ValueError("fk.nn.Softmax needs an explicit dim (torch's implicit dim for "
                             "dim=None is deprecated)")
        self.dim = int(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
