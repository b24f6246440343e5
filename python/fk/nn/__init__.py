"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .layer_norm import LayerNorm
from .rms_norm import RMSNorm
from .swiglu import SwiGLUMLP

__all__ = ["LayerNorm", "RMSNorm", "SwiGLUMLP"]
