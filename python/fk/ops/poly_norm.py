"""fk.poly_norm. Autograd is registered on the internal ``fk::_poly_norm_forward``, whose
second output (three rsqrt values per row) the backward reads."""
import torch

from . import _autograd, _checks as c


def poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              eps: float = 1e-6) -> torch.Tensor:
    """PolyNorm over the last dimension (PolyCom, Zhuo et al. 2024), with the semantics of
    Liger Kernel's ``LigerPolyNorm``:
    ``weight[0] * norm(x**3) + weight[1] * norm(x**2) + weight[2] * norm(x) + bias``,
    ``norm(u) = u * rsqrt(mean(u**2, -1) + eps)``.

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU). A non-contiguous
            ``x`` is copied to contiguous memory first. On CUDA N is at most 16384 (one pass
            per row on chip); a longer row is an error.
        weight: ``(3,)``.
        bias: one element, shape ``(1,)`` or ``()``.
        The parameters share one dtype, float32 or ``x``'s dtype, and live on ``x``'s device.
        eps: added to each mean of squares.

    Returns:
        ``y`` of ``x``'s shape and dtype, contiguous, computed in float32 (float64 for
        float64 ``x``; the mean squares of x, x^2 and x^3 summed in that precision) and
        rounded once. Differentiable in ``x``, ``weight`` and ``bias``; the parameter
        gradients are summed in float32 and returned in the parameters' dtype and shape.

    Raises:
        RuntimeError naming ``fk::poly_norm`` and the argument for a wrong shape, dtype or
        device.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk._poly_norm_forward(x, weight, bias, eps)[0]
    return _eager_forward(x, weight, bias, eps)[0]


@torch.jit.unused
def _eager_forward(x, weight, bias, eps: float):
    return _poly_norm_forward_eager(x, weight, bias, eps)


# --- checks and fake kernels (csrc/ops/poly_norm/poly_norm.cpp raises the same messages) --

def check_poly_norm(x, weight, bias):
    op = "fk::poly_norm"
    c.check(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar")
    c.check_float(op, "x", x)
    c.check_same_device(op, "weight", weight, "x", x)
    c.check_float(op, "weight", weight)
    c.check(weight.dim() == 1 and weight.shape[0] == 3, op,
            ": weight must have shape (3,), got ", c.shape_text(weight))
    c.check_same_device(op, "bias", bias, "x", x)
    c.check_same_dtype(op, "weight", weight, "bias", bias)
    c.check(bias.numel() == 1 and bias.dim() <= 1, op,
            ": bias must have shape (1,) or () (one element), got ", c.shape_text(bias))
    c.check(weight.dtype in (torch.float32, x.dtype), op,
            ": weight and bias must be float32 or x's dtype (", c.dtype_name(x.dtype),
            "), got ", c.dtype_name(weight.dtype))


def check_poly_norm_backward(grad_y, x, weight, bias, rstd):
    op = "fk::_poly_norm_backward"
    check_poly_norm(x, weight, bias)
    c.check_pair(op, "grad_y", grad_y, "x", x)
    c.check_same_shape(op, "grad_y", grad_y, "x", x)
    c.check_same_device(op, "rstd", rstd, "x", x)
    c.check(rstd.dtype in (torch.float32, torch.float64), op,
            ": rstd must be float32 (float64 for float64 x), got ", c.dtype_name(rstd.dtype))
    c.check(rstd.numel() * x.shape[-1] == 3 * x.numel() or x.shape[-1] == 0, op,
            ": rstd must hold three values per row of x")


@torch.library.register_fake("fk::_poly_norm_forward")
def _forward_fake(x, weight, bias, eps):
    check_poly_norm(x, weight, bias)
    rstd = x.new_empty((*x.shape[:-1], 3), dtype=c.acc_dtype(x))
    return torch.empty_like(x, memory_format=torch.contiguous_format), rstd


@torch.library.register_fake("fk::_poly_norm_backward")
def _backward_fake(grad_y, x, weight, bias, rstd, output_mask):
    check_poly_norm_backward(grad_y, x, weight, bias, rstd)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else None
    dw = (torch.empty_like(weight, memory_format=torch.contiguous_format) if output_mask[1]
          else None)
    db = torch.empty_like(bias, memory_format=torch.contiguous_format) if output_mask[2] else None
    return dx, dw, db


# --- autograd: the forward keeps x, the parameters and the fp32 rstd per row ---------------

def _setup_context(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1])
    ctx.set_materialize_grads(False)  # rstd's gradient is never read: no zeros for it


def _backward(ctx, grad_y, _grad_rstd):
    if grad_y is None:
        return None, None, None, None
    x, weight, bias, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = torch.ops.fk._poly_norm_backward(grad_y, x, weight, bias, rstd,
                                                  [need[0], need[1], need[2]])
    return dx, dw, db, None


_poly_norm_forward_eager = _autograd.register("fk::_poly_norm_forward", _backward,
                                              _setup_context)
