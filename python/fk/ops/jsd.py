"""fk.jsd.

Autograd: a Python Autograd kernel on the public op fk::jsd (a torch.autograd.Function
around the internal forward, registered with ``torch.library.Library("fk", "IMPL").impl(...,
"Autograd", with_keyset=True)``, as fk.cross_entropy does): the forward computes the
gradient only when the input requires grad, and the backward scales it by grad_output in
place where that is safe (cross entropy's scale_stored_grad, on the same internal ops).
fk::_jsd_forward has fake kernels and no autograd formula.
"""
from typing import Optional

import torch

from . import _checks as c
from .cross_entropy import number_text, scale_stored_grad

_OP = "fk::jsd"


def jsd(input: torch.Tensor, target: torch.Tensor, shift_labels: Optional[torch.Tensor] = None,
        beta: float = 0.5, ignore_index: int = -100) -> torch.Tensor:
    """Generalized Jensen-Shannon divergence between student and teacher distributions
    (Liger Kernel's ``LigerJSD`` semantics), with the gradient computed in the forward pass.

    With ``q = exp(input)`` (student) and ``p = exp(target)`` (teacher), one row a token and
    ``m = beta * p + (1 - beta) * q``, each row contributes
    ``beta * KL(p || m) + (1 - beta) * KL(q || m)``; ``beta = 0`` is exactly the forward KL
    ``KL(p || q)`` and ``beta = 1`` exactly the reverse KL ``KL(q || p)`` (special cases,
    not limits). The loss is the sum over the rows whose ``shift_labels`` entry is not
    ``ignore_index`` (all rows without ``shift_labels``), divided by the number of those
    rows, counted on the device (no host synchronisation; CUDA-graph capturable). When no
    row counts (or the input is empty) the loss and the gradient are 0, as in Liger Kernel.

    Args:
        input: ``(BT, V)`` student log-probabilities ``log q``: float32, bfloat16 or float16
            (float64 on CPU). Non-contiguous inputs are copied once.
        target: ``(BT, V)`` teacher log-probabilities ``log p``, of input's dtype and
            device. It gets no gradient (as in Liger Kernel).
        shift_labels: ``(BT,)`` int64 on input's device, or None; only the comparison with
            ``ignore_index`` is used.
        beta: in ``[0, 1]``.
        ignore_index: the label value of rows that count nothing.

    Returns:
        A 0-dim loss of input's dtype (as Liger Kernel returns it; the math and the sums
        are in float32, rounded once). Differentiable in ``input``: the gradient is computed
        in float32 during the forward, rounded once to input's dtype, and scaled by
        ``grad_output`` in the backward, in place where allowed (nothing to do for the usual
        ``loss.backward()``). A double backward raises. A ``-inf`` log-probability gives a
        NaN term (``0 * -inf``), as the plain formula and Liger Kernel do.

    Raises:
        RuntimeError naming ``fk::jsd`` and the argument: input not 2-D or of an unsupported
        dtype, target of another shape / dtype / device, shift_labels not int64 ``(BT,)``
        on input's device, beta outside ``[0, 1]``.
    """
    return torch.ops.fk.jsd(input, target, shift_labels, beta, ignore_index)


# --- checks and fake kernels (csrc/ops/jsd/jsd.cpp raises the same messages) ---------------

def check_jsd(op, input, target, shift_labels, beta):
    c.check(input.dim() == 2, op, ": input must have shape (BT, V), got ", c.shape_text(input))
    c.check_float(op, "input", input)
    c.check_same_device(op, "input", input, "target", target)
    c.check_same_dtype(op, "input", input, "target", target)
    c.check_same_shape(op, "input", input, "target", target)
    if shift_labels is not None:
        c.check_same_device(op, "input", input, "shift_labels", shift_labels)
        c.check(shift_labels.dtype == torch.int64, op, ": shift_labels must be int64, got ",
                c.dtype_name(shift_labels.dtype))
        c.check(shift_labels.dim() == 1 and shift_labels.shape[0] == input.shape[0], op,
                ": shift_labels must have shape (", input.shape[0], ",) to match input, got ",
                c.shape_text(shift_labels))
    c.check(0.0 <= beta <= 1.0, op, ": beta must be in [0, 1], got ", number_text(beta))


@torch.library.register_fake("fk::_jsd_forward")
def _forward_fake(input, target, shift_labels, beta, ignore_index, compute_grad):
    check_jsd(_OP, input, target, shift_labels, beta)
    grad = input.new_empty(input.shape) if compute_grad else None
    return input.new_empty(()), grad


# --- autograd ------------------------------------------------------------------------------

class _JsdFunction(torch.autograd.Function):
    """The forward computes the gradient of the loss for a grad_output of 1 and keeps it;
    the backward scales it by grad_output."""

    @staticmethod
    def forward(ctx, input, target, shift_labels, beta, ignore_index):
        ctx.set_materialize_grads(False)
        with torch._C._AutoDispatchBelowAutograd():
            loss, grad = torch.ops.fk._jsd_forward(input, target, shift_labels, beta,
                                                   ignore_index, True)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if grad_loss is None:
            return (None,) * 5
        (grad,) = ctx.saved_tensors
        # The scaling takes grad_output in the accumulation dtype (float32; float64 for
        # float64 inputs); the loss, and so grad_output, has input's dtype.
        grad_loss = grad_loss.to(c.acc_dtype(grad))
        return (scale_stored_grad(_OP, grad, grad_loss),) + (None,) * 4


def _jsd_autograd(keyset, input, target, shift_labels=None, beta=0.5, ignore_index=-100):
    # The defaults are the schema's: the dispatcher may leave out arguments equal to them.
    if not (torch.is_grad_enabled() and input.requires_grad):
        # No gradient wanted (the target gets none, as in Liger Kernel): the loss only.
        with torch._C._AutoDispatchBelowAutograd():
            loss, _ = torch.ops.fk._jsd_forward(input, target, shift_labels, beta,
                                                ignore_index, False)
        return loss
    return _JsdFunction.apply(input, target, shift_labels, beta, ignore_index)


_lib = torch.library.Library("fk", "IMPL")
_lib.impl("jsd", _jsd_autograd, "Autograd", with_keyset=True)
