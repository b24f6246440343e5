from typing import Callable, Optional

import torch
from torch import nn

from ..ops.fp8_linear import BLOCK, fp8_linear


def _fits(in_features: int, out_features: int) -> bool:
    return (in_features > 0 and out_features > 0 and in_features % BLOCK == 0
            and out_features % BLOCK == 0)


class FP8Linear(nn.Linear):
    """``nn.Linear`` whose forward and both backward GEMMs run in blockwise FP8 through
    :func:`fk.fp8_linear` (1 x 128 activations / gradients, 128 x 128 weights).

    The constructor, parameters (``weight`` (out, in) and ``bias``), initialisation and
    state dict are ``nn.Linear``'s (it is a subclass): the weight stays in its dtype
    (bf16 or fp32) as the optimizer's master copy and is quantized once per change (cached,
    see :mod:`fk.ops.fp8_linear`). ``in_features`` and ``out_features`` must be multiples
    of 128. Keywords: ``pow2_scales`` (power-of-two scales), ``cache_weight`` (reuse the
    quantized weight while the weight is unchanged; default True).

        layer = fk.nn.FP8Linear(4096, 14336, bias=False, device="cuda", dtype=torch.bfloat16)
        model = fk.nn.convert_to_fp8_linear(model, lambda name, m: "lm_head" not in name)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, pow2_scales: bool = False, cache_weight: bool = True):
        if not _fits(in_features, out_features):
            raise ValueError(f"fk.nn.FP8Linear: in_features and out_features must be positive "
                             f"multiples of 128 (128 x 128 weight blocks), got {in_features} "
                             f"and {out_features}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.pow2_scales = pow2_scales
        self.cache_weight = cache_weight

    def forward(self, x: torch.Tensor, x_fp8=None) -> torch.Tensor:
        """``x_fp8``: ``x`` already quantized (see :func:`fk.fp8_linear`)."""
        return fp8_linear(x, self.weight, self.bias, x_fp8=x_fp8, pow2_scales=self.pow2_scales,
                          cache_weight=self.cache_weight)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, pow2_scales: bool = False,
                    cache_weight: bool = True) -> "FP8Linear":
        """An FP8Linear that shares ``linear``'s parameters (the same ``Parameter``
        objects: an optimizer built before the swap keeps working)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                      pow2_scales=pow2_scales, cache_weight=cache_weight)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def extra_repr(self) -> str:
        return super().extra_repr() + f", pow2_scales={self.pow2_scales}"


def convert_to_fp8_linear(model: nn.Module,
                          filter_fn: Optional[Callable[[str, nn.Linear], bool]] = None, *,
                          pow2_scales: bool = False, cache_weight: bool = True) -> nn.Module:
    """Replaces, in place, every ``nn.Linear`` of ``model`` (itself excluded) whose
    in_features and out_features are multiples of 128 by :class:`FP8Linear` sharing its
    parameters; returns ``model``.

    ``filter_fn(name, module)`` (qualified name as in ``named_modules``), when given, must
    also return True for a layer to be converted: e.g. ``lambda name, m: "lm_head" not in
    name`` keeps the output head in high precision, as FP8 training recipes usually do.
    Layers of other sizes are left as they are. Subclasses of ``nn.Linear`` (FP8Linear
    included) are not converted.
    """
    todo = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if (type(child) is nn.Linear and _fits(child.in_features, child.out_features)
                    and (filter_fn is None or filter_fn(full, child))):
                todo.append((module, child_name, child))
    for parent, child_name, child in todo:
        setattr(parent, child_name, FP8Linear.from_linear(child, pow2_scales=pow2_scales,
                                                          cache_weight=cache_weight))
    return model
