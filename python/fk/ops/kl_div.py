"""fk.kl_div.

Autograd: a Python Autograd kernel on the public op fk::kl_div (a torch.autograd.Function
around the internal ops, registered with ``torch.library.Library("fk", "IMPL").impl(...,
"Autograd", with_keyset=True)``), as for fk.cross_entropy: for a reduction the forward
computes the gradient (only when input requires grad), which the backward scales by
grad_output with cross entropy's scaling op (in place where safe, nothing to do for a
grad_output of 1); for "none" the backward is fk::_kl_div_backward(grad_output, target).
The internal ops have fake kernels and no autograd formula.
"""
import math

import torch

from . import _checks as c
from .cross_entropy import raise_when_differentiated, scale_stored_grad

REDUCTIONS = ("none", "sum", "mean", "batchmean")
_OP = "fk::kl_div"


def kl_div(input: torch.Tensor, target: torch.Tensor, reduction: str = "batchmean",
           log_target: bool = False, eps: float = 1e-10) -> torch.Tensor:
    """KL divergence loss: ``torch.nn.functional.kl_div(input, target, reduction=...,
    log_target=...)`` with the target clamped before its log, as Liger Kernel's kl_div.

    Pointwise, with ``input`` log-probabilities and ``target`` probabilities::

        loss = target * (log(max(target, eps)) - input)      # log_target=False
        loss = exp(target) * (target - input)                # log_target=True

    where ``target * log(...)`` is taken as 0 where ``target == 0`` (torch's ``xlogy``), so
    a zero target adds ``-0 * input`` (0, or NaN where input is -inf or NaN, as in torch).
    With ``eps = 0`` this is torch's formula for every ``target >= 0``. With ``eps > 0`` it
    differs from torch only where ``0 < target < eps`` (by ``target * log(eps / target)``,
    at most ``eps / e`` an element: ``t log t`` is replaced by ``t log eps``) and for negative
    targets (not probabilities: torch gives NaN, fk ``target * (log(eps) - input)``, as
    Liger). With ``log_target`` eps is not used.

    Args:
        input: log-probabilities, any shape (usually ``(BT, V)``); float32, bfloat16 or
            float16 (float64 on CPU). Non-contiguous tensors are copied once.
        target: the same shape, device and dtype as ``input`` (no broadcasting, no type
            promotion: both are checked). It gets no gradient: a ``target`` that requires
            grad while grad mode is on raises (detach it; ``torch.nn.functional.kl_div``
            differentiates it).
        reduction: ``"none"`` (the pointwise losses, ``input``'s shape and dtype),
            ``"sum"``, ``"mean"`` (sum / numel, torch's ``"mean"``), ``"batchmean"`` (sum /
            ``input.size(0)``; the mathematically proper KL divergence per row for
            ``(BT, V)``; the sum for a 0-dim input, as torch). Note the default is
            ``"batchmean"`` (as Liger Kernel's functional), where torch's is ``"mean"``.
        log_target: ``target`` holds log-probabilities.
        eps: the clamp of ``target`` before its log, >= 0.

    Returns:
        For a reduction a float32 scalar (float64 for float64 input; accumulated in float32
        on every dtype; torch returns ``input``'s dtype); empty inputs give torch's values
        (sum 0, mean NaN, batchmean 0 / size(0)). For ``"none"`` a tensor of ``input``'s
        shape and dtype. Differentiable in ``input``: for a reduction the gradient
        ``scale * (-target)`` (``-exp(target)`` with ``log_target``) is computed in the
        forward pass, in float32, and rounded once to ``input``'s dtype, then multiplied by
        ``grad_output`` on the device in the backward (nothing to do for a grad_output of
        1); for ``"none"`` the backward computes ``grad_output * (-target)``. A double
        backward raises. No host synchronisation: the op can be captured in a CUDA graph.
    """
    return torch.ops.fk.kl_div(input, target, reduction, log_target, eps)


# --- checks and fake kernels (csrc/ops/kl_div/kl_div.cpp raises the same messages) ---------

def _number_text(v: float) -> str:
    """A float as C++'s ostream prints it (6 significant digits, no trailing zeros)."""
    return "%g" % v


def check_kl_div(op, input, target, reduction, eps):
    c.check_pair(op, "input", input, "target", target)
    c.check_same_shape(op, "input", input, "target", target)
    c.check(reduction in REDUCTIONS, op, ": reduction must be one of 'none', 'sum', 'mean', "
            "'batchmean', got '", reduction, "'")
    c.check(eps >= 0.0, op, ": eps must be non-negative, got ", _number_text(eps))


@torch.library.register_fake("fk::_kl_div_forward")
def _forward_fake(input, target, reduction, log_target, eps, compute_grad):
    check_kl_div(_OP, input, target, reduction, eps)
    if reduction == "none":
        return input.new_empty(input.shape), None
    loss = input.new_empty((), dtype=c.acc_dtype(input))
    grad = input.new_empty(input.shape) if compute_grad else None
    return loss, grad


@torch.library.register_fake("fk::_kl_div_backward")
def _backward_fake(grad_output, target, log_target):
    op = "fk::_kl_div_backward"
    c.check_pair(op, "grad_output", grad_output, "target", target)
    c.check_same_shape(op, "grad_output", grad_output, "target", target)
    return target.new_empty(target.shape)


# --- autograd --------------------------------------------------------------------------------

def _rows(t: torch.Tensor) -> torch.Tensor:
    """The (rows, last dim) view of a contiguous tensor (1 x 1 for a 0-dim one): the 2-D
    form cross entropy's scaling op takes."""
    if t.dim() == 0:
        return t.view(1, 1)
    return t.view(math.prod(t.shape[:-1]), t.shape[-1])


class _KlDivFunction(torch.autograd.Function):
    """For a reduction the forward keeps the gradient for a grad_output of 1 and the
    backward scales it; for "none" the forward keeps the target."""

    @staticmethod
    def forward(ctx, input, target, reduction, log_target, eps):
        ctx.set_materialize_grads(False)
        with torch._C._AutoDispatchBelowAutograd():
            loss, grad = torch.ops.fk._kl_div_forward(input, target, reduction, log_target, eps,
                                                      True)
        ctx.none = reduction == "none"
        ctx.log_target = log_target
        ctx.save_for_backward(target if ctx.none else grad)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        if grad_output is None:
            return (None,) * 5
        (saved,) = ctx.saved_tensors
        if not ctx.none:
            grad = scale_stored_grad(_OP, _rows(saved), grad_output).view(saved.shape)
            return (grad, None, None, None, None)
        if torch.is_grad_enabled():  # create_graph
            with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
                grad = torch.ops.fk._kl_div_backward(grad_output, saved, ctx.log_target)
            grad = raise_when_differentiated(_OP, grad)[0]
        else:
            with torch._C._AutoDispatchBelowAutograd():
                grad = torch.ops.fk._kl_div_backward(grad_output, saved, ctx.log_target)
        return (grad, None, None, None, None)


def _kl_div_autograd(keyset, input, target, reduction="batchmean", log_target=False,
                     eps=1e-10):
    # The defaults are the schema's: the dispatcher may leave out arguments equal to them.
    grad_mode = torch.is_grad_enabled()
    c.check(not (grad_mode and target.requires_grad), _OP, ": target requires grad, but fk "
            "differentiates kl_div with respect to input only; pass target.detach() (or use "
            "torch.nn.functional.kl_div for a gradient with respect to target)")
    if not (grad_mode and input.requires_grad):
        with torch._C._AutoDispatchBelowAutograd():
            loss, _ = torch.ops.fk._kl_div_forward(input, target, reduction, log_target, eps,
                                                   False)
        return loss
    return _KlDivFunction.apply(input, target, reduction, log_target, eps)


_lib = torch.library.Library("fk", "IMPL")
_lib.impl("kl_div", _kl_div_autograd, "Autograd", with_keyset=True)
