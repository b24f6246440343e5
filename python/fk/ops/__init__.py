"""Functional API: one module per op, each a thin wrapper of ``torch.ops.fk.<op>``."""
