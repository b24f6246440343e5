"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .rms_norm import RMSNorm
from .swiglu import SwiGLUMLP
from .swiglu_linear import FusedSwiGLU, FusedSwiGLUMLP

__all__ = ["RMSNorm", "SwiGLUMLP", "FusedSwiGLU", "FusedSwiGLUMLP"]
