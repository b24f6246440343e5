"""fk.fused_linear_jsd.

Autograd: a Python Autograd kernel on the public op fk::fused_linear_jsd (a
torch.autograd.Function around the internal op, registered with
``torch.library.Library("fk", "IMPL").impl(..., "Autograd", with_keyset=True)``), as for
fk.fused_linear_cross_entropy: the forward computes the gradients of the student's input and
weight (only those that require grad) and the backward scales them by grad_output on the
device. The internal op fk::_fused_linear_jsd_forward has a fake kernel and no autograd
formula.
"""
import math
from typing import Optional

import torch

from . import _autocast, _checks as c
from .cross_entropy import number_text, scale_stored_grad

_OP = "fk::fused_linear_jsd"


def fused_linear_jsd(student_input: torch.Tensor, student_weight: torch.Tensor,
                     teacher_input: torch.Tensor, teacher_weight: torch.Tensor,
                     shift_labels: Optional[torch.Tensor] = None, beta: float = 0.5,
                     ignore_index: int = -100, temperature: float = 1.0, *,
                     chunk_size: Optional[int] = None) -> torch.Tensor:
    """Distillation loss of two language-model heads without their logits: the generalized
    Jensen-Shannon divergence between the student's ``log q = log_softmax(student_input @
    student_weight.T / temperature)`` (the input) and the teacher's ``log p =
    log_softmax(teacher_input @ teacher_weight.T / temperature)`` (the target)::

        beta * KL(p || m) + (1 - beta) * KL(q || m),   m = beta * p + (1 - beta) * q

    with ``beta = 0`` the forward KL ``KL(p || q)`` and ``beta = 1`` the reverse KL
    ``KL(q || p)`` (Liger Kernel's ``LigerFusedLinearJSD``). Rows whose ``shift_labels``
    equal ``ignore_index`` count nothing; the loss is the sum over the counted rows divided
    by their number, over all rows (0 when no row counts; no ``temperature ** 2`` factor).

    Rows are processed in chunks: the student's and the teacher's logits in float32 (a
    float32 matmul output, not rounded to 16 bits; a quarter of a chunk's rows at a time for
    16-bit inputs), the divergence and the gradient of the student's logits (fk's kernel,
    float32 math), then ``grad_student_input`` and ``grad_student_weight`` from that
    gradient (two matmuls, the weight's summed over chunks in the weight's dtype). So the
    forward computes the gradients and the backward only scales them by ``grad_output``
    on the device. The teacher is frozen: its tensors get no gradient.

    Args:
        student_input: ``(N, H)`` float32, bfloat16 or float16 (float64 on CPU).
        student_weight: ``(V, H)`` the student's head (``nn.Linear(H, V).weight``).
        teacher_input: ``(N, H')`` the teacher's hidden states (``H'`` may differ from H).
        teacher_weight: ``(V, H')`` the teacher's head. All four of one dtype and device.
        shift_labels: ``(N,)`` int64 or None (every row counts).
        beta: in ``[0, 1]``.
        ignore_index: the label of rows that do not count.
        temperature: positive; both logits are divided by it.
        chunk_size: rows per chunk of the gradient products. Default: logits of about the
            size of ``student_input`` but at least 1024 rows (every chunk reads and writes
            all of ``grad_student_weight``). Transient memory: ``chunk_size * V`` elements
            of the input dtype for the gradient plus as many bytes of float32 logits.

    Returns:
        The float32 loss (float64 for float64 inputs), differentiable in ``student_input``
        and ``student_weight``; a double backward raises. No host synchronisation.

    Raises:
        RuntimeError naming the op and the argument for mismatched shapes, dtypes or
        devices, labels that are not int64 ``(N,)``, ``beta`` outside ``[0, 1]``, a
        temperature that is not positive, or ``chunk_size < 1``.
    """
    return torch.ops.fk.fused_linear_jsd(student_input, student_weight, teacher_input,
                                         teacher_weight, shift_labels, beta, ignore_index,
                                         temperature, chunk_size)


# --- checks and fake kernel (csrc/ops/fused_linear_jsd/fused_linear_jsd.cpp raises the same
# messages) ------------------------------------------------------------------------------

def check_fused_linear_jsd(xs, ws, xt, wt, shift_labels, beta, temperature, chunk_size):
    op = _OP
    c.check(xs.dim() == 2, op, ": student_input must have shape (N, H), got ", c.shape_text(xs))
    c.check_pair(op, "student_input", xs, "student_weight", ws)
    c.check(ws.dim() == 2 and ws.shape[1] == xs.shape[1], op,
            ": student_weight must have shape (V, ", xs.shape[1],
            ") to match student_input, got ", c.shape_text(ws))
    c.check(ws.shape[0] >= 1, op,
            ": student_weight must have at least one class (row), got shape ", c.shape_text(ws))
    c.check_pair(op, "student_input", xs, "teacher_input", xt)
    c.check(xt.dim() == 2 and xt.shape[0] == xs.shape[0], op,
            ": teacher_input must have shape (", xs.shape[0],
            ", H') to match student_input, got ", c.shape_text(xt))
    c.check_pair(op, "student_input", xs, "teacher_weight", wt)
    c.check(wt.dim() == 2 and wt.shape[0] == ws.shape[0] and wt.shape[1] == xt.shape[1], op,
            ": teacher_weight must have shape (", ws.shape[0], ", ", xt.shape[1],
            ") to match student_weight and teacher_input, got ", c.shape_text(wt))
    if shift_labels is not None:
        c.check_same_device(op, "student_input", xs, "shift_labels", shift_labels)
        c.check(shift_labels.dtype == torch.int64, op, ": shift_labels must be int64, got ",
                c.dtype_name(shift_labels.dtype))
        c.check(shift_labels.dim() == 1 and shift_labels.shape[0] == xs.shape[0], op,
                ": shift_labels must have shape (", xs.shape[0],
                ",) to match student_input, got ", c.shape_text(shift_labels))
    c.check(0.0 <= beta <= 1.0, op, ": beta must be in [0, 1], got ", number_text(beta))
    c.check(temperature > 0.0 and math.isfinite(temperature), op,
            ": temperature must be positive and finite, got ", number_text(temperature))
    c.check(chunk_size is None or chunk_size >= 1, op, ": chunk_size must be positive, got ",
            0 if chunk_size is None else chunk_size)


@torch.library.register_fake("fk::_fused_linear_jsd_forward")
def _forward_fake(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                  beta, ignore_index, temperature, chunk_size, grad_mask):
    check_fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                           shift_labels, beta, temperature, chunk_size)
    loss = student_input.new_empty((), dtype=c.acc_dtype(student_input))
    gx = student_input.new_empty(student_input.shape) if grad_mask[0] else None
    gw = student_weight.new_empty(student_weight.shape) if grad_mask[1] else None
    return loss, gx, gw


# --- autograd --------------------------------------------------------------------------------

class _FusedLinearJSDFunction(torch.autograd.Function):
    """The forward computes grad_student_input and grad_student_weight for a grad_output of 1
    (those in grad_mask) and keeps them; the backward scales them by grad_output (in place
    where safe: cross_entropy.scale_stored_grad). The teacher gets no gradient."""

    @staticmethod
    def forward(ctx, xs, ws, xt, wt, shift_labels, beta, ignore_index, temperature, chunk_size,
                grad_mask):
        ctx.set_materialize_grads(False)
        with torch._C._AutoDispatchBelowAutograd():
            loss, gx, gw = torch.ops.fk._fused_linear_jsd_forward(
                xs, ws, xt, wt, shift_labels, beta, ignore_index, temperature, chunk_size,
                grad_mask)
        ctx.save_for_backward(gx, gw)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        out = [None] * 10
        if grad_loss is None:
            return tuple(out)
        gx, gw = ctx.saved_tensors
        if gx is not None:
            out[0] = scale_stored_grad(_OP, gx, grad_loss)
        if gw is not None:
            out[1] = scale_stored_grad(_OP, gw, grad_loss)
        return tuple(out)


def _fused_linear_jsd_autograd(keyset, student_input, student_weight, teacher_input,
                               teacher_weight, shift_labels=None, beta=0.5, ignore_index=-100,
                               temperature=1.0, chunk_size=None):
    # The defaults are the schema's: the dispatcher may leave out arguments equal to them.
    grad_mode = torch.is_grad_enabled()
    mask = [grad_mode and student_input.requires_grad,
            grad_mode and student_weight.requires_grad]
    if not any(mask):
        with torch._C._AutoDispatchBelowAutograd():
            loss, _, _ = torch.ops.fk._fused_linear_jsd_forward(
                student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                beta, ignore_index, temperature, chunk_size, [False, False])
        return loss
    return _FusedLinearJSDFunction.apply(student_input, student_weight, teacher_input,
                                         teacher_weight, shift_labels, beta, ignore_index,
                                         temperature, chunk_size, mask)


_lib = torch.library.Library("fk", "IMPL")
_lib.impl("fused_linear_jsd", _fused_linear_jsd_autograd, "Autograd", with_keyset=True)

# Under autocast: both heads' matmul inputs in the autocast dtype, the loss in float32.
_autocast.lower_precision("fused_linear_jsd", ("student_input", "student_weight",
                                               "teacher_input", "teacher_weight"),
                          float32_outputs=(0,))
