"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .cross_entropy import CrossEntropyLoss
from .fused_add_rms_norm import FusedAddRMSNorm
from .fused_linear_cross_entropy import FusedLinearCrossEntropyLoss
from .geglu import GEGLUMLP
from .layer_norm import LayerNorm
from .rms_norm import RMSNorm
from .softmax import Softmax
from .sparsemax import Sparsemax
from .swiglu import SwiGLUMLP
from .swiglu_linear import FusedSwiGLU, FusedSwiGLUMLP

__all__ = ["CrossEntropyLoss", "FusedAddRMSNorm", "FusedLinearCrossEntropyLoss", "GEGLUMLP",
           "LayerNorm", "RMSNorm", "Softmax", "Sparsemax", "SwiGLUMLP", "FusedSwiGLU",
           "FusedSwiGLUMLP"]
