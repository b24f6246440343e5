"""fk: fused GPU kernels for LLM training.

The kernels are Triton programs compiled ahead of time into cubins inside ``libfk.so``,
which registers the PyTorch operators ``torch.ops.fk.*`` (CUDA and CPU reference kernels)
on PyTorch's stable ABI, so it loads in any torch from 2.11 on. Each op's module here adds
its fake (meta) kernels and autograd formula. Importing fk loads that library; it never
imports Triton.

    import fk
    y = fk.rms_norm(x, weight, eps=1e-6)          # functional API
    mlp = fk.nn.SwiGLUMLP(4096, 14336)            # modules
"""
from pathlib import Path as _Path

from ._library import build_info, load_library

load_library()

from . import nn  # noqa: E402
from .ops.cross_entropy import CrossEntropyOutput, cross_entropy  # noqa: E402
from .ops.dyt import dyt  # noqa: E402
from .ops.fp8_linear import fp8_linear  # noqa: E402
from .ops.fp8_quantize import fp8_dequantize, fp8_quantize  # noqa: E402
from .ops.fused_add_rms_norm import fused_add_rms_norm  # noqa: E402
from .ops.fused_linear_cross_entropy import fused_linear_cross_entropy  # noqa: E402
from .ops.fused_linear_jsd import fused_linear_jsd  # noqa: E402
from .ops.gated_group_rms_norm import gated_group_rms_norm  # noqa: E402
from .ops.geglu import geglu  # noqa: E402
from .ops.group_norm import group_norm  # noqa: E402
from .ops.jsd import jsd  # noqa: E402
from .ops.kl_div import kl_div  # noqa: E402
from .ops.layer_norm import layer_norm  # noqa: E402
from .ops.llama4_rope import llama4_rope  # noqa: E402
from .ops.moe_permute import moe_permute, moe_unpermute  # noqa: E402
from .ops.moe_permute_fp8 import moe_permute_fp8  # noqa: E402
from .ops.multi_tensor_norm import multi_tensor_count_zeros, multi_tensor_norm  # noqa: E402
from .ops.neighborhood_attention import neighborhood_attention  # noqa: E402
from .ops.poly_norm import poly_norm  # noqa: E402
from .ops.qkv_split_norm_rope import qkv_split_norm_rope  # noqa: E402
from .ops.qwen2vl_mrope import qwen2vl_mrope  # noqa: E402
from .ops.rms_norm import rms_norm  # noqa: E402
from .ops.rms_norm_fp8 import rms_norm_fp8  # noqa: E402
from .ops.rope import rope, rope_  # noqa: E402
from .ops.router_logits import router_logits  # noqa: E402
from .ops.router_topk import router_topk  # noqa: E402
from .ops.softmax import softmax  # noqa: E402
from .ops.sparsemax import sparsemax  # noqa: E402
from .ops.swiglu import swiglu  # noqa: E402
from .ops.swiglu_fp8 import (  # noqa: E402
    moe_swiglu_fp8, moe_swiglu_fp8_backward, swiglu_fp8, swiglu_fp8_backward)
from .ops.swiglu_linear import swiglu_linear  # noqa: E402
from .ops.tvd import tvd  # noqa: E402
from .ops.vocab_parallel_cross_entropy import (  # noqa: E402
    vocab_parallel_cross_entropy, vocab_parallel_fused_linear_cross_entropy)
from .ops import _sharding  # noqa: E402

_sharding.register_when_imported()  # DTensor rules of the ops above

__version__ = "0.1.0"

#: Pass to CMake (CMAKE_PREFIX_PATH) so that ``find_package(fk)`` finds this installation.
cmake_prefix_path = str(_Path(__file__).resolve().parent / "share" / "cmake")

__all__ = ["CrossEntropyOutput", "cross_entropy", "dyt", "fp8_dequantize", "fp8_linear",
           "fp8_quantize", "fused_add_rms_norm", "fused_linear_cross_entropy",
           "fused_linear_jsd", "gated_group_rms_norm", "geglu", "group_norm", "jsd",
           "kl_div", "layer_norm", "llama4_rope", "moe_permute", "moe_permute_fp8",
           "moe_swiglu_fp8", "moe_swiglu_fp8_backward", "moe_unpermute",
           "multi_tensor_count_zeros", "multi_tensor_norm", "neighborhood_attention", "poly_norm",
           "qkv_split_norm_rope", "qwen2vl_mrope", "rms_norm", "rms_norm_fp8", "rope",
           "rope_", "router_logits", "router_topk", "softmax", "sparsemax", "swiglu",
           "swiglu_fp8", "swiglu_fp8_backward", "swiglu_linear", "tvd",
           "vocab_parallel_cross_entropy", "vocab_parallel_fused_linear_cross_entropy",
           "build_info", "cmake_prefix_path", "nn"]


def __getattr__(name):
    # fk.transformers imports Hugging Face Transformers, so it loads on first use only.
    if name == "transformers":
        import importlib
        return importlib.import_module(".transformers", __name__)
    raise AttributeError(f"module 'fk' has no attribute {name!r}")
