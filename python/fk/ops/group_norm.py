"""fk.group_norm. Autograd is registered on the internal ``fk::_group_norm_forward``, whose
mean and rstd per (sample, group) the backward reads."""
from typing import Optional

import torch

from . import _autograd, _checks as c


def group_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               num_groups: int, eps: float = 1e-6) -> torch.Tensor:
    """Group normalization (Wu and He, 2018) with the numbers of
    ``torch.nn.functional.group_norm`` and the argument order of Liger Kernel's
    ``LigerGroupNorm``: the C channels of ``x`` form ``num_groups`` groups of
    ``C / num_groups`` consecutive channels; per (sample, group),
    ``y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c]`` with the mean and the biased
    variance over the group's channels and every trailing position.

    Args:
        x: ``(N, C, *)``, float32, bfloat16 or float16 (float64 on CPU). A 2-D ``(N, C)``
            ``x`` is taken as torch does (one position per channel). A non-contiguous ``x``
            is copied to contiguous memory first. On CUDA a group holds fewer than 2^31
            elements.
        weight: ``(C,)`` or None (a scale of 1).
        bias: ``(C,)`` or None (no shift).
        Given parameters share one dtype, float32 or ``x``'s dtype, and live on ``x``'s
        device.
        num_groups: divides C.
        eps: added to the variance. The default 1e-6 follows Liger Kernel's functional
            form; ``torch.nn.functional.group_norm`` and :class:`fk.nn.GroupNorm` default to
            1e-5.

    Returns:
        ``y`` of ``x``'s shape and dtype, contiguous, computed in float32 (float64 for
        float64 ``x``) and rounded once. Differentiable in ``x``, ``weight`` and ``bias``;
        the parameter gradients are summed in float32 and returned in the parameters' dtype.

    Raises:
        RuntimeError naming ``fk::group_norm`` and the argument for a wrong shape, dtype,
        device or ``num_groups``.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk._group_norm_forward(x, weight, bias, num_groups, eps)[0]
    return _eager_forward(x, weight, bias, num_groups, eps)[0]


@torch.jit.unused
def _eager_forward(x, weight, bias, num_groups: int, eps: float):
    return _group_norm_forward_eager(x, weight, bias, num_groups, eps)


# --- checks and fake kernels (csrc/ops/group_norm/group_norm.cpp raises the same messages) --

def _check_param(op, name, p, x):
    c.check_same_device(op, name, p, "x", x)
    c.check_float(op, name, p)
    c.check(p.dim() == 1 and p.shape[0] == x.shape[1], op, ": ", name, " must have shape (",
            x.shape[1], ",) to match the channel dim of x, got ", c.shape_text(p))
    c.check(p.dtype in (torch.float32, x.dtype), op,
            ": weight and bias must be float32 or x's dtype (", c.dtype_name(x.dtype),
            "), got ", c.dtype_name(p.dtype))


def check_group_norm(x, weight, bias, num_groups):
    op = "fk::group_norm"
    c.check(x.dim() >= 2, op, ": x must have at least two dimensions (N, C, *), got ",
            c.shape_text(x))
    c.check_float(op, "x", x)
    c.check(num_groups > 0, op, ": num_groups must be positive, got ", num_groups)
    c.check(x.shape[1] % num_groups == 0, op, ": num_groups (", num_groups,
            ") must divide the number of channels (", x.shape[1], ")")
    if weight is not None:
        _check_param(op, "weight", weight, x)
    if bias is not None:
        _check_param(op, "bias", bias, x)
    if weight is not None and bias is not None:
        c.check_same_dtype(op, "weight", weight, "bias", bias)


def check_group_norm_backward(grad_y, x, weight, bias, mean, rstd, num_groups):
    op = "fk::_group_norm_backward"
    check_group_norm(x, weight, bias, num_groups)
    c.check_pair(op, "grad_y", grad_y, "x", x)
    c.check_same_shape(op, "grad_y", grad_y, "x", x)
    for name, t in (("mean", mean), ("rstd", rstd)):
        c.check_same_device(op, name, t, "x", x)
        c.check(t.dtype in (torch.float32, torch.float64), op, ": ", name,
                " must be float32 (float64 for float64 x), got ", c.dtype_name(t.dtype))
        c.check(t.numel() == x.shape[0] * num_groups, op, ": ", name,
                " must hold one value per (sample, group) of x (", x.shape[0] * num_groups,
                "), got ", c.shape_text(t))


@torch.library.register_fake("fk::_group_norm_forward")
def _forward_fake(x, weight, bias, num_groups, eps):
    check_group_norm(x, weight, bias, num_groups)
    stats = x.new_empty((x.shape[0], num_groups), dtype=c.acc_dtype(x))
    return (torch.empty_like(x, memory_format=torch.contiguous_format), stats,
            torch.empty_like(stats))


@torch.library.register_fake("fk::_group_norm_backward")
def _backward_fake(grad_y, x, weight, bias, mean, rstd, num_groups, output_mask):
    check_group_norm_backward(grad_y, x, weight, bias, mean, rstd, num_groups)
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if output_mask[0] else None
    dw = (torch.empty_like(weight, memory_format=torch.contiguous_format)
          if output_mask[1] and weight is not None else None)
    db = (torch.empty_like(bias, memory_format=torch.contiguous_format)
          if output_mask[2] and bias is not None else None)
    return dx, dw, db


# --- autograd: the forward keeps x, the parameters and the per-group mean and rstd --------

def _setup_context(ctx, inputs, output):
    x, weight, bias, num_groups, _eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.num_groups = num_groups
    ctx.set_materialize_grads(False)  # mean / rstd gradients are never read: no zeros


def _backward(ctx, grad_y, _grad_mean, _grad_rstd):
    if grad_y is None:
        return None, None, None, None, None
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[1], bias is not None and need[2]]
    if not any(mask):
        return None, None, None, None, None
    dx, dw, db = torch.ops.fk._group_norm_backward(grad_y, x, weight, bias, mean, rstd,
                                                   ctx.num_groups, mask)
    return dx, dw, db, None, None


_group_norm_forward_eager = _autograd.register("fk::_group_norm_forward", _backward,
                                               _setup_context)
