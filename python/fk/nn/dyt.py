import torch
from torch import nn

from ..ops.dyt import dyt


class DyT(nn.Module):
    """Dynamic Tanh, ``gamma * tanh(alpha * x) + beta`` over the last dimension (see
    :func:`fk.dyt`), with the parameters of Liger Kernel's ``LigerDyT``: ``alpha`` (shape
    ``(1,)``, initialised to ``init_alpha``), ``gamma`` (ones) and ``beta`` (zeros, or None
    with ``beta=False``)."""

    def __init__(self, hidden_size: int, beta: bool = True, init_alpha: float = 0.5,
                 device=None, dtype=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.init_alpha = init_alpha
        self.alpha = nn.Parameter(torch.full((1,), float(init_alpha), device=device, dtype=dtype))
        self.gamma = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        if beta:
            self.beta = nn.Parameter(torch.zeros(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("beta", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dyt(x, self.alpha, self.gamma, self.beta)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, init_alpha={self.init_alpha}, beta={self.beta is not None}"
