"""Modules built on fk ops, drop-in for their torch / Hugging Face counterparts."""
from .cross_entropy import CrossEntropyLoss
from .dyt import DyT
from .fp8_linear import FP8Linear, convert_to_fp8_linear
from .fused_add_rms_norm import FusedAddRMSNorm
from .fused_linear_cross_entropy import FusedLinearCrossEntropyLoss
from .fused_linear_jsd import FusedLinearJSD
from .geglu import GEGLUMLP
from .group_norm import GroupNorm
from .jsd import JSD
from .kl_div import KLDivLoss
from .layer_norm import LayerNorm
from .neighborhood_attention import NeighborhoodAttention
from .poly_norm import PolyNorm
from .rms_norm import RMSNorm
from .softmax import Softmax
from .sparsemax import Sparsemax
from .swiglu import SwiGLUMLP
from .swiglu_linear import FusedSwiGLU, FusedSwiGLUMLP
from .tiled_mlp import TiledGEGLUMLP, TiledSwiGLUMLP
from .tvd import TVDLoss

__all__ = ["CrossEntropyLoss", "DyT", "FP8Linear", "convert_to_fp8_linear", "FusedAddRMSNorm",
           "FusedLinearCrossEntropyLoss",
           "FusedLinearJSD", "GEGLUMLP", "GroupNorm", "JSD", "KLDivLoss", "LayerNorm",
           "NeighborhoodAttention", "PolyNorm", "RMSNorm", "Softmax", "Sparsemax", "SwiGLUMLP",
           "FusedSwiGLU", "FusedSwiGLUMLP", "TVDLoss", "TiledSwiGLUMLP", "TiledGEGLUMLP"]
