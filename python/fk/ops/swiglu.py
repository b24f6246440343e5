"""fk.swiglu. Autograd: registered on fk::swiglu itself (its backward needs only a and b),
by python/fk/ops/_glu.py; the backward calls fk::_swiglu_backward, or fk::_swiglu_backward_
to write the gradients into a's and b's memory (backward_in_place)."""
import math

import torch

from . import _checks as c, _glu
from .cross_entropy import number_text


def swiglu(a: torch.Tensor, b: torch.Tensor, backward_in_place: bool = False,
           gate_multiplier: float = 1.0, down_multiplier: float = 1.0) -> torch.Tensor:
    """SwiGLU gate: ``silu(a * gate_multiplier) * b * down_multiplier``, elementwise
    (``silu(a) * b`` by default).

    Args:
        a: gate pre-activations, any shape. float32, bfloat16 or float16 (float64 on CPU).
        b: up projections, same shape, dtype and device as ``a``.
        backward_in_place: let the backward pass write the gradients of ``a`` and ``b`` into
            ``a``'s and ``b``'s own memory instead of allocating two new tensors. Use it only
            when nothing reads ``a`` or ``b`` after the backward, as inside an MLP where they
            are the gate and up projections (``fk.nn.SwiGLUMLP`` does). It is skipped, and new
            tensors are allocated, when the backward retains the graph, builds a
            higher-order graph, or ``a``/``b`` are non-contiguous or share memory. After an
            in-place backward, an op that saved ``a`` or ``b`` for its own backward raises
            autograd's "modified by an inplace operation" error rather than use them.
        gate_multiplier, down_multiplier: Falcon-H1's MLP multipliers
            (``config.mlp_multipliers``): its MLP is ``down_proj(up_proj(x) *
            silu(gate_proj(x) * gate_multiplier)) * down_multiplier``, which is
            ``down_proj(swiglu(gate_proj(x), up_proj(x), gate_multiplier=...,
            down_multiplier=...))`` when ``down_proj`` has no bias (``mlp_bias=False``, its
            default; with a bias, multiply its output instead). Applied in float32 inside
            the kernel; with both 1.0 the kernels are those without multipliers.

    Returns:
        A new contiguous tensor of ``a``'s shape and dtype. ``silu(a)`` and the product are
        computed in float32 and rounded once. Non-contiguous inputs are copied to contiguous
        memory first. Differentiable in ``a`` and ``b``; the backward recomputes ``silu``.
    """
    return torch.ops.fk.swiglu(a, b, backward_in_place, gate_multiplier, down_multiplier)


# --- fake kernels (same checks and messages as csrc/ops/glu/glu.h) and autograd ----------

NAMES = _glu.OpNames("swiglu")


def check_multipliers(op, gate_multiplier=1.0, down_multiplier=1.0):
    """csrc/ops/swiglu/swiglu.cpp check_swiglu_multipliers: the same messages."""
    for name, v in (("gate_multiplier", gate_multiplier), ("down_multiplier", down_multiplier)):
        c.check(math.isfinite(v), op, ": ", name, " must be finite, got ", number_text(v))


_glu.register_fakes(NAMES, lambda *m: check_multipliers(NAMES.op, *m))
_glu.register_autograd(NAMES)
