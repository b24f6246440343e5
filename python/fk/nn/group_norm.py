import torch
from torch import nn

from ..ops.group_norm import group_norm


class GroupNorm(nn.Module):
    """GroupNorm over (N, C, *) (see :func:`fk.group_norm`), with the constructor arguments,
    parameter names and initialisation of ``torch.nn.GroupNorm``: ``weight`` (ones) and
    ``bias`` (zeros) of shape (num_channels,) when ``affine``, else none; ``eps`` defaults
    to torch's 1e-5 (the functional :func:`fk.group_norm` defaults to 1e-6)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None):
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.ones(num_channels, device=device, dtype=dtype))
            self.bias = nn.Parameter(torch.zeros(num_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.weight, self.bias, self.num_groups, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
