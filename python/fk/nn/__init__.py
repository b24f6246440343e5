"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .rms_norm import RMSNorm
from .swiglu import SwiGLUMLP
from .cross_entropy import CrossEntropyLoss
from .fused_linear_cross_entropy import FusedLinearCrossEntropyLoss

__all__ = ["RMSNorm", "SwiGLUMLP", "CrossEntropyLoss",
           "FusedLinearCrossEntropyLoss"]
