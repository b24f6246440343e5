"""fk.geglu. Autograd: registered on fk::geglu itself (its backward needs only a and b),
by python/fk/ops/_glu.py; the backward calls fk::_geglu_backward, or fk::_geglu_backward_
to write the gradients into a's and b's memory (backward_in_place)."""
import torch

from . import _checks as c, _glu

APPROXIMATE = ("tanh", "none")


def geglu(a: torch.Tensor, b: torch.Tensor, approximate: str = "tanh",
          backward_in_place: bool = False) -> torch.Tensor:
    """GeGLU gate: ``gelu(a, approximate) * b``, elementwise.

    Args:
        a: gate pre-activations, any shape. float32, bfloat16 or float16 (float64 on CPU).
        b: up projections, same shape, dtype and device as ``a``.
        approximate: ``"tanh"`` (the default: Gemma's ``gelu_pytorch_tanh``,
            ``0.5 * a * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 * a**3)))``) or ``"none"``
            (exact: ``0.5 * a * (1 + erf(a / sqrt(2)))``), as in
            ``torch.nn.functional.gelu``.
        backward_in_place: let the backward pass write the gradients of ``a`` and ``b`` into
            ``a``'s and ``b``'s own memory instead of allocating two new tensors. Use it only
            when nothing reads ``a`` or ``b`` after the backward, as inside an MLP where they
            are the gate and up projections (``fk.nn.GEGLUMLP`` does). It is skipped, and new
            tensors are allocated, when the backward retains the graph, builds a
            higher-order graph, or ``a``/``b`` are non-contiguous or share memory. After an
            in-place backward, an op that saved ``a`` or ``b`` for its own backward raises
            autograd's "modified by an inplace operation" error rather than use them.

    Returns:
        A new contiguous tensor of ``a``'s shape and dtype: ``gelu(a.float()) * b.float()``
        rounded once to the dtype. Non-contiguous inputs are copied to contiguous memory
        first. Differentiable in ``a`` and ``b``; the backward recomputes ``gelu``.
    """
    return torch.ops.fk.geglu(a, b, approximate, backward_in_place)


# --- fake kernels (same checks and messages as csrc/ops/glu/glu.h) and autograd ----------

NAMES = _glu.OpNames("geglu")


def check_approximate(approximate="tanh"):
    c.check(approximate in APPROXIMATE, NAMES.op,
            ": approximate must be 'tanh' or 'none', got '", approximate, "'")


_glu.register_fakes(NAMES, check_approximate)
_glu.register_autograd(NAMES)
