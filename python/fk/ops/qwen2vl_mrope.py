"""fk.qwen2vl_mrope. Autograd: registered on ``fk::qwen2vl_mrope`` itself (its backward needs
only cos and sin, inputs of the op), calling ``fk::_qwen2vl_mrope_backward``."""
from typing import List, Tuple

import torch

from . import _autograd, _checks as c
from .rope import check_qk_and_tables, rope_out_like


def qwen2vl_mrope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mrope_section: List[int], interleaved: bool = False
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rotary embedding (mRoPE) of queries and keys, in one kernel launch.

    ``q_out = q * cos_m + rotate_half(q) * sin_m`` (and the same for ``k``), where
    ``cos_m`` / ``sin_m`` ``(B, S, D)`` compose the temporal, height and width position
    streams of ``cos`` / ``sin`` ``(3, B, S, D)``: rotating pair ``i`` (dims ``i`` and
    ``i + D/2``) takes its values from one stream, chosen by ``mrope_section = [t, h, w]``:

    - ``interleaved=False`` (Qwen2-VL, Qwen2.5-VL): pairs ``[0, t)`` temporal, ``[t, t+h)``
      height, the rest width: Hugging Face's ``apply_multimodal_rotary_pos_emb`` (its
      ``mrope_section * 2`` split of the D dims).
    - ``interleaved=True`` (Qwen3-VL): height for ``i % 3 == 1, i < 3h``, width for
      ``i % 3 == 2, i < 3w``, temporal otherwise (Qwen3-VL's rotary embedding).

    Computed in float32 and rounded once to q's dtype.

    Args:
        q: ``(B, Hq, S, D)``, D even; float32, bfloat16 or float16 (float64 on CPU). Any
            batch, head and seq strides (the transposed ``(B, S, H, D)`` views models
            produce are read in place); a last dim with a stride other than 1 is copied.
        k: ``(B, Hkv, S, D)``, same dtype, device, batch, seq and head dim as ``q``.
        cos, sin: ``(3, 1 or B, S, D)``, float32 or q's dtype, same shape and dtype. Both
            halves of the last dim are read (any values work: the formula above is applied
            as written).
        mrope_section: three sizes ``>= 0`` summing to ``D / 2``, e.g. ``[16, 24, 24]``.
        interleaved: the Qwen3-VL stream assignment.

    Returns:
        ``(q_out, k_out)``, new tensors of q's and k's shapes and dtype, laid out like their
        inputs when those are dense with a contiguous last dim (else contiguous).
        Differentiable in q and k (the transposed map, one launch); cos and sin get no
        gradient.

    Raises:
        RuntimeError naming ``fk::qwen2vl_mrope`` and the argument on bad shapes, dtypes,
        devices or sections.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.qwen2vl_mrope(q, k, cos, sin, mrope_section, interleaved)
    return _eager_qwen2vl_mrope(q, k, cos, sin, mrope_section, interleaved)


@torch.jit.unused
def _eager_qwen2vl_mrope(q, k, cos, sin, mrope_section: List[int], interleaved: bool):
    return _qwen2vl_mrope_eager(q, k, cos, sin, list(mrope_section), interleaved)


def apply_multimodal_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                    sin: torch.Tensor, mrope_section: List[int],
                                    unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for Hugging Face's ``apply_multimodal_rotary_pos_emb`` of Qwen2-VL /
    Qwen2.5-VL (transformers 4.x signature): q / k ``(B, H, S, D)`` with ``unsqueeze_dim=1``
    or ``(B, S, H, D)`` with ``unsqueeze_dim=2``; cos / sin ``(3, B, S, D)``."""
    if unsqueeze_dim == 1:
        return qwen2vl_mrope(q, k, cos, sin, mrope_section)
    if unsqueeze_dim == 2:
        q_out, k_out = qwen2vl_mrope(q.transpose(1, 2), k.transpose(1, 2), cos, sin,
                                     mrope_section)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError("fk.apply_multimodal_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got "
                     f"{unsqueeze_dim}")


# --- checks and fake kernels (csrc/ops/qwen2vl_mrope/qwen2vl_mrope.cpp: the same messages) ---

def check_qwen2vl_mrope(op, q, k, cos, sin, mrope_section):
    check_qk_and_tables(op, q, k, cos, sin)
    d = q.shape[3]
    c.check(d >= 2 and d % 2 == 0, op, ": head_dim must be even and at least 2, got ", d)
    c.check(cos.dim() == 4 and cos.shape[0] == 3, op,
            ": cos and sin must have shape (3, batch or 1, seq, head_dim), got ",
            c.shape_text(cos))
    c.check(cos.shape[1] == 1 or cos.shape[1] == q.shape[0], op,
            ": cos and sin must have batch size 1 or q's (", q.shape[0],
            ") in dim 1, got shape ", c.shape_text(cos))
    c.check(cos.shape[2] == q.shape[2], op, ": cos and sin must have q's seq length (",
            q.shape[2], ") in dim 2, got shape ", c.shape_text(cos))
    c.check(cos.shape[3] == d, op, ": cos and sin must have q's head_dim (", d,
            ") in dim 3, got shape ", c.shape_text(cos))
    c.check(len(mrope_section) == 3 and all(v >= 0 for v in mrope_section)
            and sum(mrope_section) == d // 2, op,
            ": mrope_section must be 3 sizes >= 0 (temporal, height, width) summing to "
            "head_dim / 2 (", d // 2, "), got [", ", ".join(str(v) for v in mrope_section), "]")


@torch.library.register_fake("fk::qwen2vl_mrope")
def _qwen2vl_mrope_fake(q, k, cos, sin, mrope_section, interleaved=False):
    check_qwen2vl_mrope("fk::qwen2vl_mrope", q, k, cos, sin, mrope_section)
    return rope_out_like(q), rope_out_like(k)


@torch.library.register_fake("fk::_qwen2vl_mrope_backward")
def _qwen2vl_mrope_backward_fake(grad_q, grad_k, cos, sin, mrope_section, interleaved):
    check_qwen2vl_mrope("fk::_qwen2vl_mrope_backward", grad_q, grad_k, cos, sin, mrope_section)
    return rope_out_like(grad_q), rope_out_like(grad_k)


# --- autograd: keeps cos and sin; the backward applies the transposed map -------------------

def _setup_context(ctx, inputs, output):
    _q, _k, cos, sin, mrope_section, interleaved = inputs
    ctx.save_for_backward(cos, sin)
    ctx.mrope_section, ctx.interleaved = mrope_section, interleaved


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    dq, dk = torch.ops.fk._qwen2vl_mrope_backward(grad_q, grad_k, cos, sin, ctx.mrope_section,
                                                  ctx.interleaved)
    return dq, dk, None, None, None, None


_qwen2vl_mrope_eager = _autograd.register("fk::qwen2vl_mrope", _backward, _setup_context)
