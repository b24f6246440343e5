from typing import Sequence, Union

import torch
from torch import nn

from ..ops.layer_norm import layer_norm


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, with the constructor, parameter names (``weight``,
    ``bias``) and initialisation of ``torch.nn.LayerNorm``, so its state dict loads as is.

    Only a single normalized dimension is supported (``normalized_shape`` an int or a
    one-element sequence). See :func:`fk.layer_norm` for the numerics.
    """

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device=None, dtype=None):
        super().__init__()
        shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                 else tuple(normalized_shape))
        if len(shape) != 1:
            raise ValueError(f"fk.nn.LayerNorm normalizes the last dimension only; got "
                             f"normalized_shape={shape}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        kw = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(shape, **kw))
            if bias:
                self.bias = nn.Parameter(torch.zeros(shape, **kw))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    # torch.nn.LayerNorm's own, which reads the same attributes (its text differs between
    # torch versions: 2.13 added the bias flag).
    extra_repr = nn.LayerNorm.extra_repr
