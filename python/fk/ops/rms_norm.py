from typing import Optional

import torch

from . import _autograd, _checks as c

CASTING_MODES = ("llama", "gemma", "none")


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
             offset: float = 0.0, casting_mode: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dimension: ``x * rsqrt(mean(x**2, -1) + eps) * (offset + weight)``.

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU). Any leading dims;
            non-contiguous inputs are copied to contiguous memory first.
        weight: ``(N,)`` of ``x``'s dtype and device, or None (then the normalized ``x`` is
            returned and ``offset`` is unused).
        eps: added to the mean of squares.
        offset: added to ``weight`` (Gemma stores ``weight - 1`` and uses ``offset=1``).
        casting_mode: where values are rounded to ``x``'s dtype, following the model:
            ``"llama"``: rstd in float32, the normalized ``x`` rounded to ``x``'s dtype, then
            multiplied by ``offset + weight`` (Hugging Face Llama, Mistral, Qwen ...);
            ``"gemma"``: everything in float32, one rounding at the end (Hugging Face Gemma);
            ``"none"``: rstd, normalized ``x`` and ``offset + weight`` each rounded to
            ``x``'s dtype.
            The mean of squares is accumulated in float32 in every mode.

    Returns:
        ``y`` of ``x``'s shape and dtype, contiguous. Differentiable in ``x`` and
        ``weight``; the weight gradient is summed in float32.
    """
    # torch.ops.fk.rms_norm is this same call (its composite kernel); calling the forward op
    # directly saves one dispatch, and its eager form the register_autograd machinery.
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk._rms_norm_forward(x, weight, eps, offset, casting_mode)[0]
    return _eager_forward(x, weight, eps, offset, casting_mode)[0]


@torch.jit.unused
def _eager_forward(x, weight, eps: float, offset: float, casting_mode: str):
    return _rms_norm_forward_eager(x, weight, eps, offset, casting_mode)


# --- checks and fake kernels (csrc/ops/rms_norm/rms_norm.cpp raises the same messages) ---

def check_rms_norm(x, weight, casting_mode, op="fk::rms_norm"):
    c.check(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar")
    c.check_float(op, "x", x)
    if weight is not None:
        c.check_pair(op, "x", x, "weight", weight)
        c.check(weight.dim() == 1 and weight.shape[0] == x.shape[-1], op,
                ": weight must have shape (", x.shape[-1], ",) to match the last dim of x, got ",
                c.shape_text(weight))
    c.check(casting_mode in CASTING_MODES, op,
            ": casting_mode must be one of 'llama', 'gemma', 'none', got '", casting_mode, "'")


def check_rms_norm_backward(grad_y, x, weight, rstd, casting_mode,
                            op="fk::_rms_norm_backward", forward_op="fk::rms_norm"):
    check_rms_norm(x, weight, casting_mode, forward_op)
    c.check_pair(op, "grad_y", grad_y, "x", x)
    c.check_same_shape(op, "grad_y", grad_y, "x", x)
    c.check_same_device(op, "rstd", rstd, "x", x)
    c.check(rstd.dtype in (torch.float32, torch.float64), op,
            ": rstd must be float32 (float64 for float64 x), got ", c.dtype_name(rstd.dtype))
    c.check(rstd.numel() * x.shape[-1] == x.numel() or x.shape[-1] == 0, op,
            ": rstd must hold one value per row of x")


def rstd_like(x):
    return x.new_empty(x.shape[:-1], dtype=c.acc_dtype(x))


@torch.library.register_fake("fk::_rms_norm_forward")
def _forward_fake(x, weight, eps, offset, casting_mode):
    check_rms_norm(x, weight, casting_mode)
    return torch.empty_like(x, memory_format=torch.contiguous_format), rstd_like(x)


@torch.library.register_fake("fk::_rms_norm_backward")
def _backward_fake(grad_y, x, weight, rstd, offset, casting_mode, output_mask):
    check_rms_norm_backward(grad_y, x, weight, rstd, casting_mode)
    dw = torch.empty_like(weight) if output_mask[1] and weight is not None else None
    return torch.empty_like(x, memory_format=torch.contiguous_format), dw


# --- autograd: the forward keeps x, weight and the fp32 rstd per row ----------------------

def _setup_context(ctx, inputs, output):
    x, weight, _eps, offset, casting_mode = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.offset, ctx.casting_mode = offset, casting_mode
    ctx.set_materialize_grads(False)  # rstd's gradient is never read: no zeros for it


def _backward(ctx, grad_y, _grad_rstd):
    if grad_y is None:
        return None, None, None, None, None
    x, weight, rstd = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    dx, dw = torch.ops.fk._rms_norm_backward(grad_y, x, weight, rstd, ctx.offset,
                                             ctx.casting_mode, [True, need_dw])
    return dx, dw, None, None, None


_rms_norm_forward_eager = _autograd.register("fk::_rms_norm_forward", _backward,
                                             _setup_context)
