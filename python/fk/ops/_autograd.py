"""Autograd registration shared by the ops.

`register(op, backward, setup_context)` installs one autograd formula twice:
- on the operator, with torch.library.register_autograd: what TorchScript, torch.compile,
  export and C++-dispatched calls of ``torch.ops.fk.*`` use;
- as a plain torch.autograd.Function whose forward calls the operator's backend kernel
  directly (below autograd), returned for the op's Python wrapper to call in eager mode.
  It skips register_autograd's per-call Python machinery (argument trees, keyset
  redispatch), which costs more host time than the kernels of a small op.

The backward runs once: the internal backward ops have no derivative of their own, so when a
higher-order graph is being built (create_graph=True) and anything the backward reads
requires grad (an incoming gradient or a saved tensor), the gradients it returns are marked
so that differentiating them raises, instead of reading as constants.
"""
from __future__ import annotations

import functools

import torch
from torch._C import _functions


def _raising(op: str, outputs: tuple) -> tuple:
    err = _functions.DelayedError(
        f"{op}: double backward is not implemented (fk's backward can't be differentiated; "
        "trying to differentiate twice)".encode(), len(outputs))

    def leaf(t):
        if t is None:
            return None
        t = t.detach()
        t.requires_grad = True
        return t

    out = err(*[leaf(t) for t in outputs])
    return out if isinstance(out, tuple) else (out,)


def _needs_guard(ctx, grads) -> bool:
    if not torch.is_grad_enabled():
        return False
    tensors = [g for g in grads if isinstance(g, torch.Tensor)]
    tensors += [t for t in ctx.saved_tensors if t is not None]
    return any(t.requires_grad for t in tensors)


def may_overwrite_saved(ctx) -> bool:
    """Whether a backward may write its results over tensors it saved (the in-place
    backwards): not when it builds a higher-order graph (create_graph) or the graph is
    retained (a second backward would read them again)."""
    return (not ctx.create_graph
            and not torch._C._autograd._get_current_graph_task_keep_graph())


def _once(op: str, backward):
    def once(ctx, *grads):
        # Read by may_overwrite_saved: the backward itself runs with grad mode off.
        ctx.create_graph = torch.is_grad_enabled()
        if not ctx.create_graph:
            return backward(ctx, *grads)
        with torch.no_grad():
            out = backward(ctx, *grads)
        if not _needs_guard(ctx, grads):
            return out
        single = not isinstance(out, tuple)
        guarded = _raising(op, (out,) if single else out)
        return guarded[0] if single else guarded

    return once


def _eager_function(op: str, backward, setup_context):
    overload = getattr(torch.ops.fk, op.split("::")[1]).default

    # The forward takes ctx itself (a separate setup_context costs autograd.Function a
    # second pass over the arguments: about 3x the host time of the apply).
    def forward(ctx, *args):
        with torch._C._AutoDispatchBelowAutograd():
            out = overload(*args)
        setup_context(ctx, args, out)
        return out

    name = op.split("::")[1].strip("_").title().replace("_", "") + "Function"
    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
    }).apply


def register(op: str, backward, setup_context):
    """Register `backward` / `setup_context` as the autograd formula of the fk operator `op`
    ("fk::_rms_norm_forward"); returns the eager form: a function taking the operator's
    arguments (all of them, positionally) and returning its outputs."""
    once = _once(op, backward)
    torch.library.register_autograd(op, once, setup_context=setup_context)
    return _eager_function(op, once, setup_context)


def not_differentiable(op: str):
    """For an fk operator none of whose outputs carries a gradient (the FP8 quantizers):
    registers the autograd formula that marks every output non-differentiable, and returns
    the eager form, which calls the backend kernel below autograd (no Python runs at the
    Autograd key). Either way no output requires grad, whatever the inputs do. Without a
    formula, the CPU backend's ATen calls would record a graph through which a backward
    runs (giving the inputs the reference's gradient), and the CUDA backend none."""
    overload = getattr(torch.ops.fk, op.split("::")[1]).default

    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(*(t for t in output if isinstance(t, torch.Tensor)))
        ctx.num_inputs = len(inputs)

    def backward(ctx, *grads):
        return (None,) * ctx.num_inputs

    torch.library.register_autograd(op, backward, setup_context=setup_context)

    def call(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args)

    return call


def eager() -> bool:
    """True where a Python wrapper may call the eager form: not under torch.compile's tracing
    (which takes the operator and its registered formula)."""
    return not torch.compiler.is_compiling()


def compiler_disabled(fn):
    """``fn`` under ``torch.compiler.disable`` (a graph break: torch.compile runs it eagerly),
    wrapped on the first call: the decorator imports torch._dynamo (and with it Triton where
    installed), which a module-level ``@torch.compiler.disable`` would make every
    ``import fk`` pay."""
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call
