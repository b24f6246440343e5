import torch
from torch import nn

from ..ops.sparsemax import sparsemax


class Sparsemax(nn.Module):
    """Sparsemax over ``dim`` (see :func:`fk.sparsemax`): the projection of each slice onto
    the probability simplex."""

    __constants__ = ["dim"]
    dim: int

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = int(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sparsemax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
