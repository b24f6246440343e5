"""fk.layer_norm. Autograd is registered on ``fk::_layer_norm_forward`` (its backward needs
the mean and rstd that op returns); ``fk::layer_norm`` is a CompositeImplicitAutograd kernel
that calls it, so it is differentiable through that registration."""
from typing import Optional

import torch

from . import _autograd, _checks as c


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
    # torch.ops.fk.layer_norm is this same call (its composite kernel); calling the forward
    # op directly saves one dispatch, and its eager form the register_autograd machinery.
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk._layer_norm_forward(x, weight, bias, eps)[0]
    return _eager_forward(x, weight, bias, eps)[0]


@torch.jit.unused
def _eager_forward(x, weight, bias, eps: float):
    return _layer_norm_forward_eager(x, weight, bias, eps)


# --- checks and fake kernels (csrc/ops/layer_norm/layer_norm.cpp raises the same messages) --

def _check_affine(op, name, x, t):
    c.check_pair(op, "x", x, name, t)
    c.check(t.dim() == 1 and t.shape[0] == x.shape[-1], op, ": ", name, " must have shape (",
            x.shape[-1], ",) to match the last dim of x, got ", c.shape_text(t))


def _check_stat(op, name, x, t):
    c.check_same_device(op, name, t, "x", x)
    acc = c.acc_dtype(x)
    c.check(t.dtype == acc, op, ": ", name, " must be ", c.dtype_name(acc), " for ",
            c.dtype_name(x.dtype), " x, got ", c.dtype_name(t.dtype))
    c.check(t.numel() * x.shape[-1] == x.numel() or x.shape[-1] == 0, op, ": ", name,
            " must hold one value per row of x")


def check_layer_norm(x, weight, bias):
    op = "fk::layer_norm"
    c.check(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar")
    c.check_float(op, "x", x)
    if weight is not None:
        _check_affine(op, "weight", x, weight)
    if bias is not None:
        _check_affine(op, "bias", x, bias)


def check_layer_norm_backward(grad_y, x, weight, mean, rstd):
    op = "fk::_layer_norm_backward"
    check_layer_norm(x, weight, None)
    c.check_pair(op, "grad_y", grad_y, "x", x)
    c.check_same_shape(op, "grad_y", grad_y, "x", x)
    _check_stat(op, "mean", x, mean)
    _check_stat(op, "rstd", x, rstd)


def _stat_like(x):
    return x.new_empty(x.shape[:-1], dtype=c.acc_dtype(x))


@torch.library.register_fake("fk::_layer_norm_forward")
def _forward_fake(x, weight, bias, eps):
    check_layer_norm(x, weight, bias)
    return (torch.empty_like(x, memory_format=torch.contiguous_format), _stat_like(x),
            _stat_like(x))


@torch.library.register_fake("fk::_layer_norm_backward")
def _backward_fake(grad_y, x, weight, mean, rstd, output_mask):
    check_layer_norm_backward(grad_y, x, weight, mean, rstd)
    n = x.shape[-1]
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else None
    dw = x.new_empty((n,)) if output_mask[1] else None
    db = x.new_empty((n,)) if output_mask[2] else None
    return dx, dw, db


# --- autograd: the forward keeps x, weight and the fp32 mean and rstd per row; the backward
# asks only for the gradients autograd needs ------------------------------------------------

def _setup_context(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.has_bias = bias is not None
    ctx.set_materialize_grads(False)  # mean's and rstd's gradients are never read


def _backward(ctx, grad_y, _grad_mean, _grad_rstd):
    if grad_y is None:
        return None, None, None, None
    x, weight, mean, rstd = ctx.saved_tensors
    needs = ctx.needs_input_grad
    mask = [needs[0], weight is not None and needs[1], ctx.has_bias and needs[2]]
    dx, dw, db = torch.ops.fk._layer_norm_backward(grad_y, x, weight, mean, rstd, mask)
    return dx, dw, db, None


_layer_norm_forward_eager = _autograd.register("fk::_layer_norm_forward", _backward,
                                               _setup_context)
