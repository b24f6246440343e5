"""Fake kernels and autograd of the ops over one dim of a float tensor whose backward needs
only the op's output (softmax, sparsemax): ``fk::<name>(Tensor x, int dim)`` and
``fk::_<name>_backward(Tensor grad_y, Tensor y, int dim)``, with the messages of their C++
checks (``csrc/ops/<name>/<name>.cpp``)."""
import torch

from . import _autograd, _checks as c


def register(name: str):
    """Registers the fake kernels of fk::<name> and fk::_<name>_backward and the autograd
    formula on fk::<name> (the forward keeps its output y). Returns (check, eager): the
    forward's input check and the eager autograd function (``_autograd.register``)."""
    op, backward_op = f"fk::{name}", f"fk::_{name}_backward"
    backward = getattr(torch.ops.fk, f"_{name}_backward")

    def check(x, dim):
        c.check_float(op, "x", x)
        ndim = max(x.dim(), 1)
        c.check(-ndim <= dim < ndim, op, ": dim ", dim, " is out of range for x with ",
                x.dim(), " dimensions (expected a value in [", -ndim, ", ", ndim - 1, "])")

    def check_backward(grad_y, y, dim):
        c.check_pair(backward_op, "grad_y", grad_y, "y", y)
        c.check_same_shape(backward_op, "grad_y", grad_y, "y", y)
        check(y, dim)

    @torch.library.register_fake(op)
    def _fake(x, dim=-1):
        check(x, dim)
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake(backward_op)
    def _backward_fake(grad_y, y, dim):
        check_backward(grad_y, y, dim)
        return torch.empty_like(y, memory_format=torch.contiguous_format)

    def _setup_context(ctx, inputs, output):
        _x, dim = inputs
        ctx.save_for_backward(output)
        ctx.dim = dim

    def _backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        return backward(grad_y, y, ctx.dim), None

    return check, _autograd.register(op, _backward, _setup_context)
