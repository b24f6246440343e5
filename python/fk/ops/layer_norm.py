from typing import Optional

import torch


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension:
    ``(x - mean(x, -1)) / sqrt(var(x, -1) + eps) * weight + bias``.

    The same as ``torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)``: the
    mean and the biased variance are computed in float32 (the variance from the centred
    values), the affine transform too, and the result is rounded once to ``x``'s dtype.

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU). Any leading dims;
            non-contiguous inputs are copied to contiguous memory first.
        weight: ``(N,)`` of ``x``'s dtype and device, or None (a weight of ones).
        bias: ``(N,)`` of ``x``'s dtype and device, or None (no bias).
        eps: added to the variance.

    Returns:
        ``y`` of ``x``'s shape and dtype, contiguous. Differentiable in ``x``, ``weight`` and
        ``bias``; only the gradients autograd asks for are computed (a frozen weight or bias
        costs nothing in the backward), and the weight and bias gradients are summed over
        rows in float32.
    """
    return torch.ops.fk.layer_norm(x, weight, bias, eps)
