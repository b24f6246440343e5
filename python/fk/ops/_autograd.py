"""Autograd registration shared by the ops: torch.library.register_autograd with a backward
that runs once. The internal backward ops have no derivative of their own, so when a
higher-order graph is being built (create_graph=True) and anything the backward reads
requires grad (an incoming gradient or a saved tensor), the gradients it returns are marked
so that differentiating them raises, instead of reading as constants."""
from __future__ import annotations

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


def register(op: str, backward, setup_context) -> None:
    """Register `backward` / `setup_context` as the autograd formula of the fk operator `op`
    ("fk::_rms_norm_forward")."""

    def once(ctx, *grads):
        with torch.no_grad():
            out = backward(ctx, *grads)
        if not _needs_guard(ctx, grads):
            return out
        single = not isinstance(out, tuple)
        guarded = _raising(op, (out,) if single else out)
        return guarded[0] if single else guarded

    torch.library.register_autograd(op, once, setup_context=setup_context)
