"""fk.swiglu_linear. Autograd: registered on fk::_swiglu_linear_forward (its backward needs
the factors s, t that only this internal forward returns); fk::swiglu_linear is its
CompositeImplicitAutograd C++ kernel, which calls fk::_swiglu_linear_forward, and
fk.swiglu_linear calls that op directly. The backward calls fk::_swiglu_linear_gate_grads,
or fk::_swiglu_linear_gate_grads_ to write the gate gradients over the saved factors, then
the products through torch.mm (cuBLAS on CUDA)."""
import math

import torch

from . import _autocast, _autograd, _checks as c
from ._glu import can_write_grads_into_inputs
from .swiglu import check_multipliers


def swiglu_linear(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                  recompute: bool = False, gate_multiplier: float = 1.0,
                  down_multiplier: float = 1.0) -> torch.Tensor:
    """Fused SwiGLU projection: ``silu(x @ w_gate.T) * (x @ w_up.T)`` in one GEMM kernel
    (``silu(x @ w_gate.T * gate_multiplier) * (x @ w_up.T) * down_multiplier`` with the
    multipliers).

    The gated half of a Llama MLP (``down_proj`` is applied after it). Both products share
    one pass over ``x``; each output tile keeps two float32 accumulators and applies SiLU
    and the product in float32 before one rounding to ``x``'s dtype.

    Args:
        x: ``(..., K)``, float32, bfloat16 or float16 (float64 on CPU). Any leading dims.
        w_gate: ``(N, K)``, the gate projection's weight as ``nn.Linear`` stores it
            (``gate_proj.weight``), of ``x``'s dtype and device.
        w_up: ``(N, K)``, the up projection's weight (``up_proj.weight``).
        recompute: what the forward keeps for the backward. False (default): two tensors
            of the output's size, ``silu(a)`` and ``b * silu'(a)`` (``a = x @ w_gate.T``,
            ``b = x @ w_up.T``), written by the forward kernel next to the output.
            True: nothing but ``x`` and the weights; the backward first runs the forward
            GEMM again to form them (half again the op's backward work; two output-sized
            tensors less memory held from the forward to the backward).
        gate_multiplier, down_multiplier: Falcon-H1's MLP multipliers, as in
            :func:`fk.swiglu` (the down multiplier belongs after ``down_proj``; here it is
            applied before, which is the same without a ``down_proj`` bias). Applied in
            float32 in the GEMM's epilogue and folded into the saved factors, so the
            backward costs the same; with both 1.0 the kernels are those without them.

    Returns:
        ``(..., N)`` of ``x``'s dtype, contiguous. Differentiable in ``x``, ``w_gate`` and
        ``w_up``. The backward forms ``grad_a = grad_z * silu'(a) * b`` and
        ``grad_b = grad_z * silu(a)`` in one elementwise kernel (float32 products, rounded
        to ``x``'s dtype), writing them over the two saved tensors when nothing can read
        those again (not with ``retain_graph=True`` or ``create_graph=True``: then into
        new memory), and runs the products ``grad_x = grad_a @ w_gate + grad_b @ w_up``,
        ``grad_w_gate = grad_a.T @ x``, ``grad_w_up = grad_b.T @ x`` through
        ``torch.mm`` (cuBLAS on CUDA, float32 accumulation). Only the gradients that are
        needed are computed (frozen weights: no weight products; ``x`` not requiring
        grad: no ``grad_x`` products). Non-contiguous inputs are copied to contiguous
        memory first. On CUDA, the forward's float32 products use three TF32 passes
        (about float32 accuracy).

    Memory and time of ``recompute`` (Llama-3-8B MLP, 8192 tokens, bf16): the default
    holds ``s`` and ``t`` (2 x 224 MiB) from forward to backward; ``recompute=True`` holds
    none of it but runs the fused forward GEMM again in the backward (about 3 ms on an
    H200, a third more work for this op's forward + backward). Within one layer's backward
    the peak is the same; the saving is per layer whose activations wait for the
    backward (activation checkpointing gets the same effect for whole blocks).
    """
    # torch.ops.fk.swiglu_linear is this same call (its composite kernel); calling the
    # forward op directly saves one dispatch, and here the factors are skipped also when
    # grad mode is on but no input requires grad.
    keep_factors = (not recompute and torch.is_grad_enabled()
                    and (x.requires_grad or w_gate.requires_grad or w_up.requires_grad))
    return torch.ops.fk._swiglu_linear_forward(x, w_gate, w_up, [True, keep_factors],
                                               gate_multiplier, down_multiplier)[0]


# --- checks and fake kernels (csrc/ops/swiglu_linear/swiglu_linear.cpp raises the same
# messages) --------------------------------------------------------------------------------

def check_swiglu_linear(x, w_gate, w_up):
    op = "fk::swiglu_linear"
    c.check(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar")
    c.check_pair(op, "x", x, "w_gate", w_gate)
    c.check_pair(op, "x", x, "w_up", w_up)
    c.check(w_gate.dim() == 2 and w_gate.shape[1] == x.shape[-1], op,
            ": w_gate must have shape (N, ", x.shape[-1], ") to match the last dim of x, got ",
            c.shape_text(w_gate))
    c.check_same_shape(op, "w_gate", w_gate, "w_up", w_up)


def check_swiglu_linear_gate_grads(grad_out, t, s):
    op = "fk::_swiglu_linear_gate_grads"
    c.check_pair(op, "grad_out", grad_out, "t", t)
    c.check_pair(op, "s", s, "t", t)
    c.check_same_shape(op, "grad_out", grad_out, "t", t)
    c.check_same_shape(op, "s", s, "t", t)


def check_swiglu_linear_gate_grads_in_place(grad_out, t, s):
    op = "fk::_swiglu_linear_gate_grads_"
    check_swiglu_linear_gate_grads(grad_out, t, s)
    c.check(t.is_contiguous() and s.is_contiguous(), op, ": t and s must be contiguous")
    c.check(t.numel() == 0 or not torch._C._is_alias_of(t, s), op,
            ": t and s must not share memory")


@torch.library.register_fake("fk::_swiglu_linear_forward")
def _forward_fake(x, w_gate, w_up, output_mask, gate_multiplier=1.0, down_multiplier=1.0):
    check_swiglu_linear(x, w_gate, w_up)
    check_multipliers("fk::swiglu_linear", gate_multiplier, down_multiplier)
    shape = (*x.shape[:-1], w_gate.shape[0])

    def make(want):
        return x.new_empty(shape) if want else None

    return make(output_mask[0]), make(output_mask[1]), make(output_mask[1])


@torch.library.register_fake("fk::_swiglu_linear_gate_grads")
def _gate_grads_fake(grad_out, t, s):
    check_swiglu_linear_gate_grads(grad_out, t, s)
    return (torch.empty_like(t, memory_format=torch.contiguous_format),
            torch.empty_like(s, memory_format=torch.contiguous_format))


@torch.library.register_fake("fk::_swiglu_linear_gate_grads_")
def _gate_grads_in_place_fake(grad_out, t, s):
    check_swiglu_linear_gate_grads_in_place(grad_out, t, s)


# --- autograd: the forward keeps x, the weights and the factors s, t (only x and the
# weights with recompute: the backward forms s, t again first) ------------------------------

def _rows(t):
    """(rows, last dim) view of t (a copy only when t's layout does not allow one); also for
    empty tensors, where -1 would be ambiguous."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _setup_context(ctx, inputs, output):
    x, w_gate, w_up, _output_mask, gate_multiplier, down_multiplier = inputs
    _z, s, t = output
    ctx.save_for_backward(x, w_gate, w_up, s, t)
    ctx.multipliers = (gate_multiplier, down_multiplier)
    # s and t are the backward's factors, not differentiable results; their gradients are
    # never formed (no zero tensors of z's size in the backward).
    ctx.mark_non_differentiable(*(f for f in (s, t) if f is not None))
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_z, _grad_s, _grad_t):
    x, w_gate, w_up, s, t = ctx.saved_tensors
    need_x, need_wg, need_wu = ctx.needs_input_grad[:3]
    if grad_z is None or not (need_x or need_wg or need_wu):
        return None, None, None, None, None, None
    if s is None:  # recompute
        _, s, t = torch.ops.fk._swiglu_linear_forward(x, w_gate, w_up, [False, True],
                                                      *ctx.multipliers)
    # The gate gradients go over the saved (or recomputed) factors only where the backward may
    # overwrite what it saved and the factors allow it (plain, contiguous, separate tensors).
    if _autograd.may_overwrite_saved(ctx) and can_write_grads_into_inputs(t, s):
        torch.ops.fk._swiglu_linear_gate_grads_(grad_z, t, s)
        # Anything else that saved s or t for its backward now fails loudly on unpacking
        # instead of reading gradients as if they were activations.
        torch.autograd.graph.increment_version((t, s))
        da, db = t.detach(), s.detach()
    else:
        da, db = torch.ops.fk._swiglu_linear_gate_grads(grad_z, t, s)
    da2, db2 = _rows(da), _rows(db)
    dx = dwg = dwu = None
    if need_x:  # one product, the other added onto it in place
        dx = torch.mm(da2, w_gate).addmm_(db2, w_up).view(x.shape)
    if need_wg or need_wu:
        x2 = _rows(x)
        if need_wg:
            dwg = torch.mm(da2.t(), x2)
        if need_wu:
            dwu = torch.mm(db2.t(), x2)
    return dx, dwg, dwu, None, None, None


_autograd.register("fk::_swiglu_linear_forward", _backward, _setup_context)

# Under autocast: x and both weights in the autocast dtype (as the two F.linear it replaces);
# fk::swiglu_linear reaches this rule through its composite kernel.
_autocast.lower_precision("_swiglu_linear_forward", ("x", "w_gate", "w_up"))
