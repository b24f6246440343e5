from typing import Optional, Tuple

import torch


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         rotary_dim: Optional[int] = None, interleaved: bool = False
         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of queries and keys, in one kernel launch.

    ``q_out = q * cos + rotate_half(q) * sin`` (and the same for ``k``) on the first
    ``rotary_dim`` dims of every head, with ``rotate_half(x) = cat(-x[..., R/2:],
    x[..., :R/2])`` (Hugging Face ``apply_rotary_pos_emb``); dims past ``rotary_dim`` pass
    through unchanged (partial rotary: Phi, GLM, ...). Computed in float32 and rounded once
    to q's dtype.

    Args:
        q: ``(B, Hq, S, D)``, float32, bfloat16 or float16 (float64 on CPU). Any batch, head
            and seq strides, e.g. the ``x.view(B, S, H, D).transpose(1, 2)`` views models
            produce, or slices of a fused QKV projection: read in place, not copied. A last
            dim with a stride other than 1 is copied first.
        k: ``(B, Hkv, S, D)``, same dtype, device, batch, seq and head dim as ``q``.
        cos, sin: ``(S, W)``, ``(1 or B, S, W)`` (what Hugging Face rotary embeddings return)
            or ``(1 or B, 1, S, W)``; float32 or q's dtype; same shape and dtype. With
            ``W == rotary_dim`` they hold every rotated dim's value: both halves
            ``cat(f, f)`` for rotate-half, ``f.repeat_interleave(2, -1)`` when interleaved
            (any values work: the formula above is applied as written). With
            ``W == rotary_dim / 2`` they hold one value per rotating pair (GPT-OSS style).
        rotary_dim: how many leading dims of each head rotate; even, at most D. Default:
            ``cos.shape[-1]``. Pass it when cos / sin hold one value per pair.
        interleaved: rotate pairs ``(x[2i], x[2i+1])`` (GPT-J / CodeGen
            ``rotate_every_two``) instead of ``(x[i], x[i + R/2])``.

    Returns:
        ``(q_out, k_out)``, new tensors of q's and k's shapes and dtype. Each has the
        memory layout of its input when that input is dense with a contiguous last dim
        (a transposed ``(B, S, H, D)`` buffer stays one), else it is contiguous.
        Differentiable in q and k: the backward applies the inverse rotation
        (``sin -> -sin``) to the gradients in one launch. cos and sin are treated as
        constants (they get no gradient, as Hugging Face's rotary embeddings never need one).
    """
    return torch.ops.fk.rope(q, k, cos, sin, rotary_dim, interleaved)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          rotary_dim: Optional[int] = None, interleaved: bool = False
          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope` written into ``q`` and ``k`` (which are returned). For inference: it is
    not differentiable (autograd raises when a gradient would flow through it). q and k
    need a contiguous last dim and no elements sharing memory."""
    torch.ops.fk.rope_(q, k, cos, sin, rotary_dim, interleaved)
    return q, k


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                         unsqueeze_dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for Hugging Face's ``apply_rotary_pos_emb`` (same signature): cos / sin of
    shape ``(1 or B, S, D)``, q / k ``(B, H, S, D)`` with ``unsqueeze_dim=1`` or
    ``(B, S, H, D)`` with ``unsqueeze_dim=2``. ``position_ids`` is unused, as in Hugging
    Face (cos / sin are already gathered at the positions). Partial rotary when cos / sin
    are narrower than the head."""
    if unsqueeze_dim == 1:
        return rope(q, k, cos, sin)
    if unsqueeze_dim == 2:
        q_out, k_out = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError(f"fk.apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")
