"""fk.dyt. Autograd is registered on ``fk::dyt`` itself: its backward recomputes
tanh(alpha * x) from the saved x (``fk::_dyt_backward``)."""
from typing import Optional

import torch

from . import _autograd, _checks as c


def dyt(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor,
        beta: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dynamic Tanh over the last dimension: ``gamma * tanh(alpha * x) + beta``.

    The normalization-free replacement of LayerNorm from "Transformers without Normalization"
    (Zhu et al., 2025), with the semantics of Liger Kernel's ``LigerDyT``.

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU). A non-contiguous
            ``x`` is copied to contiguous memory first.
        alpha: one element (shape ``(1,)`` or ``()``), the learned scale inside the tanh.
        gamma: ``(N,)``, the per-channel scale.
        beta: ``(N,)`` or None (no shift).
        The parameters share one dtype, float32 or ``x``'s dtype (modules created in float32
        and used under autocast, or cast with the model), and live on ``x``'s device.

    Returns:
        ``y`` of ``x``'s shape and dtype, contiguous, computed in float32 (float64 for
        float64 ``x``) and rounded once. Differentiable in ``x``, ``alpha``, ``gamma`` and
        ``beta``; each parameter's gradient (a sum over all rows) is accumulated in float32
        and returned in the parameter's dtype and shape.

    Raises:
        RuntimeError naming ``fk::dyt`` and the argument for a wrong shape, dtype or device.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.dyt(x, alpha, gamma, beta)
    return _eager_dyt(x, alpha, gamma, beta)


@torch.jit.unused
def _eager_dyt(x, alpha, gamma, beta):
    return _dyt_eager(x, alpha, gamma, beta)


# --- checks and fake kernels (csrc/ops/dyt/dyt.cpp raises the same messages) -------------

def _check_param(op, name, p, x):
    c.check_same_device(op, name, p, "x", x)
    c.check_float(op, name, p)


def check_dyt(x, alpha, gamma, beta, op="fk::dyt"):
    c.check(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar")
    c.check_float(op, "x", x)
    _check_param(op, "alpha", alpha, x)
    c.check(alpha.numel() == 1 and alpha.dim() <= 1, op,
            ": alpha must have shape (1,) (one element), got ", c.shape_text(alpha))
    _check_param(op, "gamma", gamma, x)
    c.check_same_dtype(op, "alpha", alpha, "gamma", gamma)
    c.check(gamma.dim() == 1 and gamma.shape[0] == x.shape[-1], op, ": gamma must have shape (",
            x.shape[-1], ",) to match the last dim of x, got ", c.shape_text(gamma))
    if beta is not None:
        _check_param(op, "beta", beta, x)
        c.check_same_dtype(op, "gamma", gamma, "beta", beta)
        c.check(beta.dim() == 1 and beta.shape[0] == x.shape[-1], op,
                ": beta must have shape (", x.shape[-1], ",) to match the last dim of x, got ",
                c.shape_text(beta))
    c.check(alpha.dtype in (torch.float32, x.dtype), op,
            ": alpha, gamma and beta must be float32 or x's dtype (", c.dtype_name(x.dtype),
            "), got ", c.dtype_name(alpha.dtype))


def check_dyt_backward(grad_y, x, alpha, gamma, beta):
    op = "fk::_dyt_backward"
    check_dyt(x, alpha, gamma, beta)
    c.check_pair(op, "grad_y", grad_y, "x", x)
    c.check_same_shape(op, "grad_y", grad_y, "x", x)


@torch.library.register_fake("fk::dyt")
def _dyt_fake(x, alpha, gamma, beta=None):
    check_dyt(x, alpha, gamma, beta)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fk::_dyt_backward")
def _backward_fake(grad_y, x, alpha, gamma, beta, output_mask):
    check_dyt_backward(grad_y, x, alpha, gamma, beta)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else None
    da = torch.empty_like(alpha, memory_format=torch.contiguous_format) if output_mask[1] else None
    dg = torch.empty_like(gamma, memory_format=torch.contiguous_format) if output_mask[2] else None
    db = (torch.empty_like(beta, memory_format=torch.contiguous_format)
          if output_mask[3] and beta is not None else None)
    return dx, da, dg, db


# --- autograd: the forward keeps x and the parameters -------------------------------------

def _setup_context(ctx, inputs, output):
    x, alpha, gamma, beta = inputs
    ctx.save_for_backward(x, alpha, gamma, beta)


def _backward(ctx, grad_y):
    x, alpha, gamma, beta = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], need[1], need[2], beta is not None and need[3]]
    if not any(mask):
        return None, None, None, None
    dx, da, dg, db = torch.ops.fk._dyt_backward(grad_y, x, alpha, gamma, beta, mask)
    return dx, da, dg, db


_dyt_eager = _autograd.register("fk::dyt", _backward, _setup_context)
