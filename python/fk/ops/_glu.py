"""Shared by the elementwise gated activations c = act(a) * b (fk.swiglu, fk.geglu): the
input checks of csrc/ops/glu/glu.h with the same messages, the fake kernels, and the
autograd formula with the ``backward_in_place`` option.

Each op ``fk::<name>(Tensor a, Tensor b, <extra args>)``, one of the extra args ``bool
backward_in_place``, comes with ``fk::_<name>_backward(grad_c, a, b, <the other extra
args>) -> (grad_a, grad_b)`` and ``fk::_<name>_backward_(grad_c, a!, b!, <the other extra
args>)``, which writes the gradients into a and b. The autograd formula is registered on
the public op (its backward needs only a and b); it calls one of the two backward ops.
"""
from __future__ import annotations

import torch

from . import _autograd, _checks as c


class OpNames:
    """The operator names of one gated activation, for error messages."""

    def __init__(self, name: str):
        self.name = name
        self.op = f"fk::{name}"
        self.backward = f"fk::_{name}_backward"
        self.backward_in_place = f"fk::_{name}_backward_"


# --- checks (csrc/ops/glu/glu.h raises the same messages) ---------------------------------

def check_inputs(names: OpNames, a, b) -> None:
    c.check_pair(names.op, "a", a, "b", b)
    c.check_same_shape(names.op, "a", a, "b", b)


def check_backward(names: OpNames, grad_c, a, b) -> None:
    check_inputs(names, a, b)
    c.check_pair(names.backward, "grad_c", grad_c, "a", a)
    c.check_same_shape(names.backward, "grad_c", grad_c, "a", a)


def check_backward_in_place(names: OpNames, grad_c, a, b) -> None:
    check_backward(names, grad_c, a, b)
    c.check(a.is_contiguous() and b.is_contiguous(), names.backward_in_place,
            ": a and b must be contiguous")
    c.check(a.numel() == 0 or not torch._C._is_alias_of(a, b), names.backward_in_place,
            ": a and b must not share memory")


# --- fake kernels ------------------------------------------------------------------------

def register_fakes(names: OpNames, check_extra=lambda *extra: None) -> None:
    """Fake kernels of the three ops; `check_extra(*extra_args)` checks the op's own
    arguments (geglu's `approximate`, swiglu's multipliers: every argument but a, b and
    backward_in_place, in schema order) after the tensor checks. The forward's fake kernel
    may get fewer arguments than its schema has (the defaults left out); those are filled
    in from the schema."""
    arguments = getattr(torch.ops.fk, names.name).default._schema.arguments
    flag = [a.name for a in arguments].index("backward_in_place")
    defaults = [a.default_value for a in arguments]

    @torch.library.register_fake(names.op)
    def _forward_fake(a, b, *args):
        check_inputs(names, a, b)
        full = list(args) + defaults[2 + len(args):]
        check_extra(*(full[:flag - 2] + full[flag - 1:]))
        return torch.empty_like(a, memory_format=torch.contiguous_format)

    @torch.library.register_fake(names.backward)
    def _backward_fake(grad_c, a, b, *extra):
        check_backward(names, grad_c, a, b)
        check_extra(*extra)
        return (torch.empty_like(a, memory_format=torch.contiguous_format),
                torch.empty_like(b, memory_format=torch.contiguous_format))

    @torch.library.register_fake(names.backward_in_place)
    def _backward_in_place_fake(grad_c, a, b, *extra):
        check_backward_in_place(names, grad_c, a, b)
        check_extra(*extra)


# --- autograd ----------------------------------------------------------------------------

_WRAPPED = (torch._C.DispatchKey.Python, torch._C.DispatchKey.Functionalize)


def can_write_grads_into_inputs(a, b) -> bool:
    """Whether the backward may overwrite the saved a and b with their gradients: a and b
    are plain (not fake, functional or another tensor subclass), contiguous, separate,
    non-empty tensors."""
    keys_a, keys_b = torch._C._dispatch_keys(a), torch._C._dispatch_keys(b)
    return (a.layout == torch.strided and a.is_contiguous() and b.is_contiguous()
            and not any(keys_a.has(k) or keys_b.has(k) for k in _WRAPPED)
            and a.numel() > 0 and not torch._C._is_alias_of(a, b))


def register_autograd(names: OpNames) -> None:
    """The autograd formula of the op (inputs: a, b, extra args, backward_in_place), through
    _autograd.register. The gradients go into a's and b's memory only when the op was called
    with backward_in_place=True, the backward may overwrite what it saved
    (_autograd.may_overwrite_saved) and a and b allow it (can_write_grads_into_inputs).
    Otherwise they are new tensors."""
    out_of_place = getattr(torch.ops.fk, f"_{names.name}_backward").default
    in_place = getattr(torch.ops.fk, f"_{names.name}_backward_").default
    arguments = getattr(torch.ops.fk, names.name).default._schema.arguments
    flag = [a.name for a in arguments].index("backward_in_place")

    def setup_context(ctx, inputs, output):
        a, b = inputs[0], inputs[1]
        ctx.save_for_backward(a, b)
        ctx.extra = tuple(inputs[2:flag]) + tuple(inputs[flag + 1:])
        ctx.in_place = inputs[flag]

    def backward(ctx, grad_c):
        a, b = ctx.saved_tensors
        nones = (None,) * (len(ctx.extra) + 1)
        write_into_inputs = ctx.in_place and _autograd.may_overwrite_saved(ctx)
        if write_into_inputs and can_write_grads_into_inputs(a, b):
            in_place(grad_c, a, b, *ctx.extra)
            # Anything else that saved a or b for its backward now fails loudly on unpacking
            # instead of reading gradients as if they were activations.
            torch.autograd.graph.increment_version((a, b))
            return (a.detach(), b.detach()) + nones
        return tuple(out_of_place(grad_c, a, b, *ctx.extra)) + nones

    _autograd.register(names.op, backward, setup_context)
