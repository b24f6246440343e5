"""fk.softmax. Autograd is registered on ``fk::softmax`` itself: its backward needs only the
op's output y (``fk::_softmax_backward``)."""
import torch

from . import _autograd, _checks as c


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


# --- checks and fake kernels (csrc/ops/softmax/softmax.cpp raises the same messages) -------

def check_softmax(x, dim):
    op = "fk::softmax"
    c.check_float(op, "x", x)
    ndim = max(x.dim(), 1)
    c.check(-ndim <= dim < ndim, op, ": dim ", dim, " is out of range for x with ", x.dim(),
            " dimensions (expected a value in [", -ndim, ", ", ndim - 1, "])")


def check_softmax_backward(grad_y, y, dim):
    op = "fk::_softmax_backward"
    c.check_pair(op, "grad_y", grad_y, "y", y)
    c.check_same_shape(op, "grad_y", grad_y, "y", y)
    check_softmax(y, dim)


@torch.library.register_fake("fk::softmax")
def _softmax_fake(x, dim=-1):
    check_softmax(x, dim)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fk::_softmax_backward")
def _backward_fake(grad_y, y, dim):
    check_softmax_backward(grad_y, y, dim)
    return torch.empty_like(y, memory_format=torch.contiguous_format)


# --- autograd: the forward keeps its output y ----------------------------------------------

def _setup_context(ctx, inputs, output):
    _x, dim = inputs
    ctx.save_for_backward(output)
    ctx.dim = dim


def _backward(ctx, grad_y):
    (y,) = ctx.saved_tensors
    return torch.ops.fk._softmax_backward(grad_y, y, ctx.dim), None


_softmax_eager = _autograd.register("fk::softmax", _backward, _setup_context)
