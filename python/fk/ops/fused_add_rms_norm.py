"""fk.fused_add_rms_norm. Autograd is registered on ``fk::_fused_add_rms_norm_forward`` (its
backward needs the rstd that op returns); ``fk::fused_add_rms_norm`` is a
CompositeImplicitAutograd kernel that calls it, so it is differentiable through that
registration."""
from typing import Optional, Tuple

import torch

from . import _autograd, _checks as c
from .rms_norm import check_rms_norm, check_rms_norm_backward, rstd_like

_OP = "fk::fused_add_rms_norm"
_BACKWARD_OP = "fk::_fused_add_rms_norm_backward"


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor,
                       weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                       offset: float = 0.0,
                       casting_mode: str = "llama") -> Tuple[torch.Tensor, torch.Tensor]:
    """Residual add fused with RMSNorm, as in a decoder layer::

        residual_out = x + residual
        y = fk.rms_norm(residual_out, weight, eps, offset, casting_mode)

    One kernel reads ``x``, ``residual`` and ``weight`` once and writes ``y`` and
    ``residual_out``; the backward is one kernel too (plus a small reduction for the weight
    gradient).

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU), e.g. an attention or
            MLP output.
        residual: the residual stream, same shape, dtype and device as ``x``.
        weight, eps, offset, casting_mode: as in :func:`fk.rms_norm` (``weight`` of shape
            ``(N,)`` or None; ``offset=1`` with Gemma's ``weight - 1``; ``"llama"``,
            ``"gemma"`` or ``"none"``).
        Non-contiguous inputs are copied to contiguous memory first.

    Returns:
        ``(y, residual_out)``, both of ``x``'s shape and dtype, contiguous.
        ``residual_out`` is ``x + residual`` added in float32 and rounded once to ``x``'s
        dtype, exactly what ``residual + hidden_states`` gives in torch; ``y`` is
        ``fk.rms_norm`` of it (the same arithmetic). Differentiable in ``x``, ``residual``
        and ``weight``, with gradients flowing from either output or both: the gradient of
        ``residual_out`` adds into that of ``x``, computed in float32 with one rounding.
        One gradient tensor serves ``x`` and ``residual`` (autograd copies it where both
        are leaves). Work for an unused output or a frozen weight is skipped: with ``y``
        unused no kernel runs and the gradient of ``residual_out`` passes through.
    """
    # torch.ops.fk.fused_add_rms_norm is this same call (its composite kernel); calling the
    # forward op directly saves one dispatch, and its eager form the register_autograd
    # machinery.
    if torch.jit.is_scripting() or not _autograd.eager():
        y, residual_out, _rstd = torch.ops.fk._fused_add_rms_norm_forward(
            x, residual, weight, eps, offset, casting_mode)
    else:
        y, residual_out, _rstd = _eager_forward(x, residual, weight, eps, offset, casting_mode)
    return y, residual_out


@torch.jit.unused
def _eager_forward(x, residual, weight, eps: float, offset: float, casting_mode: str):
    return _fused_add_rms_norm_forward_eager(x, residual, weight, eps, offset, casting_mode)


# --- checks and fake kernels (csrc/ops/fused_add_rms_norm/fused_add_rms_norm.cpp raises the
# same messages) -----------------------------------------------------------------------------

def check_fused_add_rms_norm(x, residual, weight, casting_mode):
    check_rms_norm(x, weight, casting_mode, _OP)
    c.check_pair(_OP, "x", x, "residual", residual)
    c.check_same_shape(_OP, "x", x, "residual", residual)


def check_fused_add_rms_norm_backward(grad_y, grad_residual_out, residual_out, weight, rstd,
                                      casting_mode):
    # residual_out is the x of the norm: rms_norm's backward checks name it so.
    check_rms_norm_backward(grad_y, residual_out, weight, rstd, casting_mode, _BACKWARD_OP, _OP)
    if grad_residual_out is not None:
        c.check_pair(_BACKWARD_OP, "grad_residual_out", grad_residual_out, "residual_out",
                     residual_out)
        c.check_same_shape(_BACKWARD_OP, "grad_residual_out", grad_residual_out,
                           "residual_out", residual_out)


@torch.library.register_fake("fk::_fused_add_rms_norm_forward")
def _forward_fake(x, residual, weight, eps, offset, casting_mode):
    check_fused_add_rms_norm(x, residual, weight, casting_mode)
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format), rstd_like(x))


@torch.library.register_fake("fk::_fused_add_rms_norm_backward")
def _backward_fake(grad_y, grad_residual_out, residual_out, weight, rstd, offset, casting_mode,
                   output_mask):
    check_fused_add_rms_norm_backward(grad_y, grad_residual_out, residual_out, weight, rstd,
                                      casting_mode)
    dx = (torch.empty_like(residual_out, memory_format=torch.contiguous_format)
          if output_mask[0] else None)
    dw = torch.empty_like(weight) if output_mask[1] and weight is not None else None
    return dx, dw


# --- autograd: the forward keeps residual_out (an output), weight and the fp32 rstd per row.
# Both outputs may receive a gradient; either may be absent. ---------------------------------

def _setup_context(ctx, inputs, output):
    _x, _residual, weight, _eps, offset, casting_mode = inputs
    _y, residual_out, rstd = output
    # An unused output's gradient stays None instead of a tensor of zeros.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(residual_out, weight, rstd)
    ctx.offset, ctx.casting_mode = offset, casting_mode


def _backward(ctx, grad_y, grad_residual_out, _grad_rstd):
    residual_out, weight, rstd = ctx.saved_tensors
    need_dx = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
    need_dw = weight is not None and ctx.needs_input_grad[2]
    dx = dw = None
    if grad_y is not None:
        if need_dx or need_dw:
            dx, dw = torch.ops.fk._fused_add_rms_norm_backward(
                grad_y, grad_residual_out, residual_out, weight, rstd, ctx.offset,
                ctx.casting_mode, [need_dx, need_dw])
    else:
        # y unused: only the add is differentiated, and it passes the gradient through.
        dx = grad_residual_out
    # The add gives x and residual the same gradient: one tensor serves both.
    return (dx if ctx.needs_input_grad[0] else None, dx if ctx.needs_input_grad[1] else None,
            dw, None, None, None)


_fused_add_rms_norm_forward_eager = _autograd.register("fk::_fused_add_rms_norm_forward",
                                                       _backward, _setup_context)
