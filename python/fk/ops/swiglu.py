import torch


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate: ``silu(a) * b``, elementwise.

    Args:
        a: gate pre-activations, any shape. float32, bfloat16 or float16 (float64 on CPU).
        b: up projections, same shape, dtype and device as ``a``.

    Returns:
        A new contiguous tensor of ``a``'s shape and dtype. ``silu(a)`` and the product are
        computed in float32 and rounded once. Non-contiguous inputs are copied to contiguous
        memory first. Differentiable in ``a`` and ``b``; the backward recomputes ``silu``.
    """
    return torch.ops.fk.swiglu(a, b)
