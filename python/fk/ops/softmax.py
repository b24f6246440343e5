"""fk.softmax. Autograd is registered on ``fk::softmax`` itself: its backward needs only the
op's output y (``fk::_softmax_backward``)."""
import torch

from . import _autograd, _over_dim


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax over ``dim``: ``exp(x - max) / sum(exp(x - max))``, like ``torch.softmax``.

    Args:
        x: any shape, float32, bfloat16 or float16 (float64 on CPU).
        dim: the dimension to normalize over (negative counts from the end). The last
            dimension is the fast path: on CUDA, rows of up to 32768 elements are read once
            and written once, forward and backward (up to 16384 when the row length is not
            a multiple of 16 or the data is not 16-byte aligned, and in the float32
            backward); longer rows are read twice, the second time mostly from L2. Any
            other ``dim`` is moved last with one copy in and one copy out. A non-contiguous
            ``x`` is copied to contiguous memory first.

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype, computed in float32 (float64
        for float64 ``x``) and rounded once. Like torch, a slice of only ``-inf`` (fully
        masked) gives NaN, and a ``+inf`` or NaN makes its whole slice NaN. Differentiable
        in ``x``: the backward uses only the output,
        ``grad_x = y * (grad_y - sum(grad_y * y, dim))``, likewise in float32.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.softmax(x, dim)
    return _eager_softmax(x, dim)


@torch.jit.unused
def _eager_softmax(x, dim: int):
    return _softmax_eager(x, dim)


# --- checks, fake kernels and autograd (the forward keeps its output y) ---------------------

check_softmax, _softmax_eager = _over_dim.register("softmax")
