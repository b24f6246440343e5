"""fk.gated_group_rms_norm. Autograd: registered on ``fk::gated_group_rms_norm`` itself (its
backward recomputes the group statistics from x), calling
``fk::_gated_group_rms_norm_backward``."""
from typing import Optional

import torch

from . import _autograd, _checks as c

ACTIVATIONS = ("silu", "sigmoid")


def gated_group_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: Optional[torch.Tensor],
                         group_size: int, eps: float = 1e-6, activation: str = "silu",
                         transpose_out: bool = False) -> torch.Tensor:
    """Gated group RMSNorm, the output gate of linear-attention layers, in one kernel::

        y = (weight * rms_norm_over_groups(x).to(dtype)) * act(gate.float())

    RMSNorm over each group of ``group_size`` consecutive elements of the last dim of x,
    then times the weight, then times the activated gate ("norm before gate"), as Hugging
    Face's ``Qwen3NextRMSNormGated`` computes it: float32 statistics, the normalized x rounded
    to x's dtype and multiplied by the weight in that dtype, the gate's activation in float32,
    one rounding at the end. ``activation="silu"`` is Qwen3-Next's (and FLA's
    ``FusedRMSNormGated``'s default); ``"sigmoid"`` is the sigmoid gate (as Gated DeltaNet /
    Gated Attention papers write it).

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU); copied to contiguous
            memory first where it is not.
        gate: the gate, x's shape and dtype.
        weight: ``(N,)`` or ``(group_size,)`` (shared by every group, e.g. Qwen3-Next's
            per-head weight of ``head_v_dim`` with ``group_size = head_v_dim``) of x's dtype,
            or None.
        group_size: elements per normalized group; divides N.
        eps: added to the mean of squares.
        activation: ``"silu"`` or ``"sigmoid"``.
        transpose_out: for x ``(B, S, H, D)``, return ``(S, B, H * D)`` (the sequence-first
            layout of Megatron's output projection) instead of x's shape.

    Returns:
        ``y`` of x's dtype, contiguous. Differentiable in x, gate and weight (the weight
        gradient summed in float32).
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.gated_group_rms_norm(x, gate, weight, group_size, eps, activation,
                                                 transpose_out)
    return _eager(x, gate, weight, group_size, eps, activation, transpose_out)


@torch.jit.unused
def _eager(x, gate, weight, group_size: int, eps: float, activation: str, transpose_out: bool):
    return _gated_group_rms_norm_eager(x, gate, weight, group_size, eps, activation,
                                       transpose_out)


# --- checks and fake kernels (csrc/ops/gated_group_rms_norm/gated_group_rms_norm.cpp raises
# the same messages) -----------------------------------------------------------------------

def check_gated_group_rms_norm(op, x, gate, weight, group_size, activation, transpose_out):
    c.check(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar")
    c.check_float(op, "x", x)
    c.check_pair(op, "x", x, "gate", gate)
    c.check_same_shape(op, "x", x, "gate", gate)
    c.check(activation in ACTIVATIONS, op, ": activation must be 'silu' or 'sigmoid', got '",
            activation, "'")
    n = x.shape[-1]
    c.check(group_size >= 1 and n % group_size == 0, op, ": group_size (", group_size,
            ") must be positive and divide the last dim of x (", n, ")")
    c.check(not transpose_out or x.dim() == 4, op,
            ": transpose_out needs x of 4 dims (batch, seq, heads, head_dim), got shape ",
            c.shape_text(x))
    if weight is not None:
        c.check_pair(op, "x", x, "weight", weight)
        c.check(weight.dim() == 1 and weight.shape[0] in (n, group_size), op,
                ": weight must have shape (", n, ",) or (group_size,) (", group_size, ",), got ",
                c.shape_text(weight))


def out_shape(x, transpose_out):
    if not transpose_out:
        return tuple(x.shape)
    return (x.shape[1], x.shape[0], x.shape[2] * x.shape[3])


@torch.library.register_fake("fk::gated_group_rms_norm")
def _fake(x, gate, weight, group_size, eps=1e-6, activation="silu", transpose_out=False):
    check_gated_group_rms_norm("fk::gated_group_rms_norm", x, gate, weight, group_size,
                               activation, transpose_out)
    return x.new_empty(out_shape(x, transpose_out))


@torch.library.register_fake("fk::_gated_group_rms_norm_backward")
def _backward_fake(grad_y, x, gate, weight, group_size, eps, activation, transpose_out,
                   weight_grad):
    op = "fk::_gated_group_rms_norm_backward"
    check_gated_group_rms_norm(op, x, gate, weight, group_size, activation, transpose_out)
    c.check_pair(op, "grad_y", grad_y, "x", x)
    want = out_shape(x, transpose_out)
    c.check(tuple(grad_y.shape) == want, op, ": grad_y must have the output's shape [",
            ", ".join(str(v) for v in want), "], got ", c.shape_text(grad_y))
    dw = torch.empty_like(weight) if weight is not None and weight_grad else None
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(gate, memory_format=torch.contiguous_format), dw)


# --- autograd: the forward keeps x, gate and the weight ----------------------------------

def _setup_context(ctx, inputs, output):
    x, gate, weight = inputs[:3]
    ctx.save_for_backward(x, gate, weight)
    ctx.args = inputs[3:]


def _backward(ctx, grad_y):
    x, gate, weight = ctx.saved_tensors
    group_size, eps, activation, transpose_out = ctx.args
    dx, dg, dw = torch.ops.fk._gated_group_rms_norm_backward(
        grad_y, x, gate, weight, group_size, eps, activation, transpose_out,
        weight is not None and ctx.needs_input_grad[2])
    return dx, dg, dw, None, None, None, None


_gated_group_rms_norm_eager = _autograd.register("fk::gated_group_rms_norm", _backward,
                                                 _setup_context)
