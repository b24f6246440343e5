"""Liger Kernel's functions (``liger_kernel.transformers.functional``) on fk's ops."""
from typing import Optional

import torch

from ...ops.cross_entropy import cross_entropy
from ...ops.dyt import dyt
from ...ops.fused_add_rms_norm import fused_add_rms_norm
from ...ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from ...ops.fused_linear_jsd import fused_linear_jsd
from ...ops.geglu import geglu
from ...ops.jsd import jsd
from ...ops.kl_div import kl_div
from ...ops.layer_norm import layer_norm
from ...ops.poly_norm import poly_norm
from ...ops.rms_norm import rms_norm
from ...ops.softmax import softmax
from ...ops.sparsemax import sparsemax
from ...ops.swiglu import swiglu
from ...ops.tvd import tvd
from ._modules import CrossEntropyOutput, ce_result, check_jsd_accum_dtype
from .rope import liger_rotary_pos_emb


def liger_cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100,
                        reduce=None, reduction: str = "mean", label_smoothing: float = 0.0,
                        lse_square_scale: float = 0.0, softcap: Optional[float] = None,
                        return_z_loss: bool = False, return_token_accuracy: bool = False,
                        return_predicted_tokens: bool = False):
    """``size_average`` / ``reduce`` are accepted and unused, as in Liger."""
    out = cross_entropy(input, target, weight, ignore_index, label_smoothing, reduction,
                        lse_square_scale, softcap, return_z_loss,
                        return_token_accuracy=return_token_accuracy,
                        return_predicted_tokens=return_predicted_tokens)
    return ce_result(out, return_z_loss, return_token_accuracy, return_predicted_tokens)


def liger_fused_linear_cross_entropy(input, weight, target, bias=None, ce_weight=None,
                                     ignore_index: int = -100, lse_square_scale: float = 0.0,
                                     label_smoothing: float = 0.0, reduction: str = "mean",
                                     softcap: Optional[float] = None,
                                     return_z_loss: bool = False, accum_dtype=None,
                                     use_token_scaling: bool = False,
                                     return_token_accuracy: bool = False,
                                     return_predicted_tokens: bool = False,
                                     chunk_mem_const: int = 1):
    """``chunk_mem_const`` (Liger's chunk sizing) is accepted and unused: fk sizes its
    chunks itself (see ``fk.fused_linear_cross_entropy``'s ``chunk_size``)."""
    out = fused_linear_cross_entropy(input, weight, target, bias, ce_weight, ignore_index,
                                     label_smoothing, reduction, lse_square_scale, softcap,
                                     return_z_loss, accum_dtype=accum_dtype,
                                     loss_dtype=torch.float32,  # Liger's loss is float32
                                     use_token_scaling=use_token_scaling,
                                     return_token_accuracy=return_token_accuracy,
                                     return_predicted_tokens=return_predicted_tokens)
    return ce_result(out, return_z_loss, return_token_accuracy, return_predicted_tokens)


def liger_fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                           shift_labels=None, jsd_beta: float = 0.5, ignore_index: int = -100,
                           temperature: float = 1.0, accum_dtype=None):
    check_jsd_accum_dtype("liger_fused_linear_jsd", accum_dtype, student_weight)
    return fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                            shift_labels, jsd_beta, ignore_index, temperature)


def liger_geglu(a, b):
    return geglu(a, b, approximate="tanh")


def liger_jsd(input, target, shift_labels=None, beta: float = 0.5, ignore_index: int = -100):
    return jsd(input, target, shift_labels, beta, ignore_index)


def liger_kl_div(input, target, size_average: bool = True, reduce: bool = True,
                 reduction: str = "mean", log_target: bool = False, eps: float = 1e-10):
    """``size_average`` / ``reduce`` are accepted and unused, as in Liger."""
    return kl_div(input, target, reduction, log_target, eps)


def liger_sparsemax(input, dim: int = -1):
    return sparsemax(input, dim)


def liger_tvd(input, target, shift_labels=None, reduction: str = "mean",
              ignore_index: int = -100):
    return tvd(input, target, shift_labels, reduction, ignore_index)


def liger_layer_norm(X, W, B, eps):
    return layer_norm(X, W, B, eps)


def liger_rms_norm(X, W, eps, offset: float = 0.0, casting_mode: str = "llama",
                   in_place: bool = True):
    return rms_norm(X, W, eps, offset, casting_mode)


def liger_poly_norm(X, W, B, eps=1e-6, in_place=True):
    return poly_norm(X, W, B, eps)


def liger_fused_add_rms_norm(X, R, W, eps, offset: float = 0.0, casting_mode: str = "llama",
                             in_place: bool = True):
    return fused_add_rms_norm(X, R, W, eps, offset, casting_mode)


def liger_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
    return liger_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim, rotary_dim)


def liger_swiglu(a, b):
    return swiglu(a, b)


def liger_softmax(x):
    return softmax(x)


def liger_dyt(x, alpha, gamma, beta):
    return dyt(x, alpha, gamma, beta)


__all__ = ["CrossEntropyOutput", "liger_cross_entropy", "liger_fused_linear_cross_entropy",
           "liger_fused_linear_jsd", "liger_geglu", "liger_jsd", "liger_kl_div",
           "liger_sparsemax", "liger_tvd", "liger_layer_norm", "liger_rms_norm",
           "liger_poly_norm", "liger_fused_add_rms_norm", "liger_rope", "liger_swiglu",
           "liger_softmax", "liger_dyt"]
