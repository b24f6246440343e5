from typing import Optional, Sequence, Union

import torch
from torch import nn

from ..ops.rms_norm import CASTING_MODES, rms_norm


def _machine_eps(dtype: torch.dtype) -> float:
    """torch.finfo(dtype).eps, written out so that TorchScript can compile it."""
    if dtype == torch.bfloat16:
        return 0.0078125
    if dtype == torch.float16:
        return 0.0009765625
    if dtype == torch.float64:
        return 2.220446049250313e-16
    return 1.1920928955078125e-07


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, with the constructor of ``torch.nn.RMSNorm``.

    Extra arguments: ``offset`` (Gemma: 1.0, with the weight initialised to zeros) and
    ``casting_mode`` (``"llama"``, ``"gemma"``, ``"none"``; see :func:`fk.rms_norm`).
    ``eps=None`` uses ``torch.finfo(x.dtype).eps`` like torch. Only a single normalized
    dimension is supported.
    """

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: Optional[float] = None,
                 elementwise_affine: bool = True, device=None, dtype=None, *,
                 offset: float = 0.0, casting_mode: str = "llama"):
        super().__init__()
        shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                 else tuple(normalized_shape))
        if len(shape) != 1:
            raise ValueError(f"fk.nn.RMSNorm normalizes the last dimension only; got "
                             f"normalized_shape={shape}")
        if casting_mode not in CASTING_MODES:
            raise ValueError(f"casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.offset = float(offset)
        self.casting_mode = casting_mode
        if elementwise_affine:
            init = torch.zeros if offset else torch.ones
            self.weight = nn.Parameter(init(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps
        if eps is None:
            eps = _machine_eps(x.dtype)
        return rms_norm(x, self.weight, eps, self.offset, self.casting_mode)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine="
                f"{self.elementwise_affine}, offset={self.offset}, "
                f"casting_mode={self.casting_mode!r}")
