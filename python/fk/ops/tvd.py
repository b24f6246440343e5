"""fk.tvd.

Autograd: a Python Autograd kernel on the public op fk::tvd (a torch.autograd.Function
around the internal ops, registered for the Autograd key as cross_entropy's is): the
forward computes the gradient only when p requires grad, and the backward scales it by
grad_output in place only when the graph is not retained. The internal ops
fk::_tvd_forward and fk::_tvd_backward(_) have fake kernels and no autograd formula.
"""
from typing import Optional

import torch

from . import _checks as c
from .cross_entropy import grad_in_place_or_new

REDUCTIONS = ("none", "sum", "mean", "batchmean")
_OP = "fk::tvd"


def tvd(p: torch.Tensor, q: torch.Tensor, shift_labels: Optional[torch.Tensor] = None,
        reduction: str = "batchmean", ignore_index: int = -100) -> torch.Tensor:
    """Total variation distance between rows of probabilities, as Liger Kernel's
    ``LigerTVDLoss``: ``0.5 * |p - q|`` per element, with the gradient with respect to ``p``
    computed in the forward pass.

    Args:
        p, q: ``(BT, V)`` probabilities, float32, bfloat16 or float16 (float64 on CPU), of
            the same dtype and device. Non-contiguous inputs are copied once.
        shift_labels: ``(BT,)`` int64, or None. Rows whose label equals ``ignore_index``
            contribute 0 to the loss, get a zero gradient and are not counted.
        reduction: ``"none"`` (the ``(BT, V)`` elementwise loss, ignored rows 0),
            ``"sum"`` (the sum of all elements), ``"mean"`` (the sum divided by ``n * V``)
            or ``"batchmean"`` (the sum divided by ``n``), ``n`` the number of rows not
            ignored (``BT`` without labels). ``n`` is counted on the device: no host
            synchronisation, so the op can be captured in a CUDA graph. With ``n == 0`` a
            ``"mean"`` / ``"batchmean"`` is NaN (0 / 0; Liger Kernel raises
            ZeroDivisionError there) and the gradient is 0.

    Returns:
        The float32 loss (float64 for float64 ``p``): a scalar, or ``(BT, V)`` for
        ``"none"``. Computed in float32 from the exact differences. Differentiable in ``p``
        only (any ``grad_output``, per element for ``"none"``): the gradient is
        ``0.5 * s * sign(p - q)`` with ``s`` the reduction's factor (``1``, ``1 / n`` or
        ``1 / (n * V)``), 0 where ``p == q`` and ``-0.5 * s`` where either is NaN (as
        Liger Kernel's kernel), rounded once to ``p``'s dtype, then scaled by
        ``grad_output`` in the backward (a second rounding unless it is 1; on the device).
        ``q`` gets no gradient, also when it requires grad (its ``.grad`` stays None, as
        with Liger Kernel). A double backward raises.
    """
    return torch.ops.fk.tvd(p, q, shift_labels, reduction, ignore_index)


# --- checks and fake kernels (csrc/ops/tvd/tvd.cpp raises the same messages) ---------------

def check_tvd(op, p, q, shift_labels, reduction):
    c.check(p.dim() == 2, op, ": p must have shape (BT, V), got ", c.shape_text(p))
    c.check_pair(op, "p", p, "q", q)
    c.check_same_shape(op, "p", p, "q", q)
    if shift_labels is not None:
        c.check_same_device(op, "p", p, "shift_labels", shift_labels)
        c.check(shift_labels.dtype == torch.int64, op, ": shift_labels must be int64, got ",
                c.dtype_name(shift_labels.dtype))
        c.check(shift_labels.dim() == 1 and shift_labels.shape[0] == p.shape[0], op,
                ": shift_labels must have shape (", p.shape[0], ",) to match p, got ",
                c.shape_text(shift_labels))
    c.check(reduction in REDUCTIONS, op, ": reduction must be one of 'none', 'sum', 'mean', "
            "'batchmean', got '", reduction, "'")


def check_tvd_backward(op, grad, grad_loss):
    c.check(grad.dim() == 2, op, ": grad must have shape (BT, V), got ", c.shape_text(grad))
    c.check_float(op, "grad", grad)
    c.check_same_device(op, "grad", grad, "grad_loss", grad_loss)
    loss_dtype = c.acc_dtype(grad)
    c.check(grad_loss.dtype == loss_dtype, op, ": grad_loss must be ", c.dtype_name(loss_dtype),
            ", got ", c.dtype_name(grad_loss.dtype))
    c.check(grad_loss.dim() == 0 or grad_loss.shape == grad.shape, op,
            ": grad_loss must be a scalar or have grad's shape ", c.shape_text(grad), ", got ",
            c.shape_text(grad_loss))


@torch.library.register_fake("fk::_tvd_forward")
def _forward_fake(p, q, shift_labels, reduction, ignore_index, compute_grad):
    check_tvd(_OP, p, q, shift_labels, reduction)
    shape = p.shape if reduction == "none" else ()
    loss = p.new_empty(shape, dtype=c.acc_dtype(p))
    grad = p.new_empty(p.shape) if compute_grad else None
    return loss, grad


@torch.library.register_fake("fk::_tvd_backward")
def _backward_fake(grad, grad_loss):
    check_tvd_backward("fk::_tvd_backward", grad, grad_loss)
    return grad.new_empty(grad.shape)


@torch.library.register_fake("fk::_tvd_backward_")
def _backward_inplace_fake(grad, grad_loss):
    check_tvd_backward("fk::_tvd_backward_", grad, grad_loss)


# --- autograd -------------------------------------------------------------------------------

def _scale_stored_grad(stored: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """The gradient the forward stored (for a grad_output of 1) times grad_loss, in place
    where that is safe (cross entropy's grad_in_place_or_new)."""
    return grad_in_place_or_new(_OP, stored, grad_loss, torch.ops.fk._tvd_backward,
                                torch.ops.fk._tvd_backward_, (stored, grad_loss))


class _TvdFunction(torch.autograd.Function):
    """The forward computes the gradient with respect to p for a grad_output of 1 into a new
    buffer and keeps it; the backward scales it by grad_output. q gets no gradient."""

    @staticmethod
    def forward(ctx, p, q, shift_labels, reduction, ignore_index):
        ctx.set_materialize_grads(False)
        with torch._C._AutoDispatchBelowAutograd():
            loss, grad = torch.ops.fk._tvd_forward(p, q, shift_labels, reduction, ignore_index,
                                                   True)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if grad_loss is None:
            return (None,) * 5
        (grad,) = ctx.saved_tensors
        return (_scale_stored_grad(grad, grad_loss),) + (None,) * 4


def _tvd_autograd(keyset, p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
    # The defaults are the schema's: the dispatcher may leave out arguments equal to them.
    if not (torch.is_grad_enabled() and p.requires_grad):
        with torch._C._AutoDispatchBelowAutograd():
            loss, _ = torch.ops.fk._tvd_forward(p, q, shift_labels, reduction, ignore_index,
                                                False)
        return loss
    return _TvdFunction.apply(p, q, shift_labels, reduction, ignore_index)


_lib = torch.library.Library("fk", "IMPL")
_lib.impl("tvd", _tvd_autograd, "Autograd", with_keyset=True)
