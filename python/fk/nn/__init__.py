"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .layer_norm import LayerNorm
from .rms_norm import RMSNorm
from .softmax import Softmax
from .fused_add_rms_norm import FusedAddRMSNorm
from .swiglu import SwiGLUMLP
from .geglu import GEGLUMLP

__all__ = ["RMSNorm", "SwiGLUMLP", "Softmax", "GEGLUMLP", "LayerNorm", "FusedAddRMSNorm"]
