"""``liger_kernel.transformers`` on fk: Liger's modules, ``apply_liger_kernel_to_<model>``,
``_apply_liger_kernel_to_instance`` and ``AutoLigerKernelForCausalLM``, with Liger's names,
arguments and defaults (see :mod:`fk.liger`)."""
import importlib as _importlib

from . import functional, rope  # noqa: F401
from ._modules import (CrossEntropyOutput, LigerCrossEntropyLoss, LigerDyT,  # noqa: F401
                       LigerFusedAddRMSNorm, LigerFusedLinearCrossEntropyLoss,
                       LigerFusedLinearJSD, LigerGEGLUMLP, LigerJSD, LigerKLDIVLoss,
                       LigerLayerNorm, LigerPolyNorm, LigerRMSNorm, LigerRMSNormForGemma,
                       LigerSoftmax, LigerSparsemax, LigerSwiGLUMLP, LigerTVDLoss)
from .rope import liger_rotary_pos_emb  # noqa: F401

_MODULES = ["LigerCrossEntropyLoss", "LigerDyT", "LigerFusedAddRMSNorm",
            "LigerFusedLinearCrossEntropyLoss", "LigerFusedLinearJSD", "LigerGEGLUMLP",
            "LigerJSD", "LigerKLDIVLoss", "LigerLayerNorm", "LigerPolyNorm", "LigerRMSNorm",
            "LigerSoftmax", "LigerSparsemax", "LigerSwiGLUMLP", "LigerTVDLoss",
            "liger_rotary_pos_emb"]
_PATCH = ["_apply_liger_kernel", "_apply_liger_kernel_to_instance",
          "revert_liger_kernel_patches", "MODEL_TYPE_TO_APPLY_LIGER_FN",
          "apply_liger_kernel_to_gemma", "apply_liger_kernel_to_gemma2",
          "apply_liger_kernel_to_gemma3_text", "apply_liger_kernel_to_granite",
          "apply_liger_kernel_to_llama", "apply_liger_kernel_to_mistral",
          "apply_liger_kernel_to_mixtral", "apply_liger_kernel_to_olmo2",
          "apply_liger_kernel_to_phi3", "apply_liger_kernel_to_qwen2",
          "apply_liger_kernel_to_qwen3", "apply_liger_kernel_to_qwen3_moe"]


def __getattr__(name):
    # The patch functions and the auto model load on first use (they need Hugging Face
    # Transformers only when they run, but keep import time of the modules low).
    if name in _PATCH:
        return getattr(_importlib.import_module(".monkey_patch", __name__), name)
    if name == "AutoLigerKernelForCausalLM":
        return _importlib.import_module(".auto_model", __name__).AutoLigerKernelForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = _MODULES + _PATCH + ["AutoLigerKernelForCausalLM", "CrossEntropyOutput",
                               "functional", "rope"]
