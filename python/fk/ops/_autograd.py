"""Autograd registration shared by the ops: torch.library.register_autograd with a backward
that runs once (its internal backward ops have no derivative of their own, so a double
backward raises torch's "differentiate twice" error instead of a silently wrong result)."""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def register(op: str, backward, setup_context) -> None:
    """Register `backward` / `setup_context` as the autograd formula of the fk operator `op`
    ("fk::_rms_norm_forward")."""
    torch.library.register_autograd(op, once_differentiable(backward),
                                    setup_context=setup_context)
