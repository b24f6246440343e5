"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .cross_entropy import CrossEntropyLoss
from .dyt import DyT
from .fused_add_rms_norm import FusedAddRMSNorm
from .fused_linear_cross_entropy import FusedLinearCrossEntropyLoss
from .geglu import GEGLUMLP
from .layer_norm import LayerNorm
from .poly_norm import PolyNorm
from .rms_norm import RMSNorm
from .softmax import Softmax
from .swiglu import SwiGLUMLP
from .swiglu_linear import FusedSwiGLU, FusedSwiGLUMLP

__all__ = ["CrossEntropyLoss", "DyT", "FusedAddRMSNorm", "FusedLinearCrossEntropyLoss",
           "GEGLUMLP", "LayerNorm", "PolyNorm", "RMSNorm", "Softmax", "SwiGLUMLP", "FusedSwiGLU",
           "FusedSwiGLUMLP"]
