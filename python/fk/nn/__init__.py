"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .rms_norm import RMSNorm
from .fused_add_rms_norm import FusedAddRMSNorm
from .swiglu import SwiGLUMLP

__all__ = ["RMSNorm", "SwiGLUMLP", "FusedAddRMSNorm"]
