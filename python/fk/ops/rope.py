"""fk.rope and fk.rope_. Autograd: registered on ``fk::rope`` itself (its backward needs only
cos and sin, inputs of the op), calling ``fk::_rope_backward``. ``fk::rope_`` mutates q and
k and is not differentiable: a Python Autograd kernel refuses it when q or k require grad
with grad mode on, and bumps the version counters of q and k."""
from typing import Optional, Tuple

import torch

from . import _autograd, _checks as c


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
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.rope(q, k, cos, sin, rotary_dim, interleaved)
    return _eager_rope(q, k, cos, sin, rotary_dim, interleaved)


@torch.jit.unused
def _eager_rope(q, k, cos, sin, rotary_dim: Optional[int], interleaved: bool):
    return _rope_eager(q, k, cos, sin, rotary_dim, interleaved)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          rotary_dim: Optional[int] = None, interleaved: bool = False
          ) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope` written into ``q`` and ``k`` (which are returned). For inference: it is
    not differentiable (autograd raises when a gradient would flow through it). q and k
    need a contiguous last dim and no elements sharing memory."""
    torch.ops.fk.rope_(q, k, cos, sin, rotary_dim, interleaved)
    return q, k


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, unsqueeze_dim: int = 1
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for Hugging Face's ``apply_rotary_pos_emb`` (the same signature as in
    transformers 5.x, defaults included: torch.compile's guards may read them through
    Hugging Face's module): cos / sin of shape ``(1 or B, S, D)``, q / k ``(B, H, S, D)``
    with ``unsqueeze_dim=1`` or ``(B, S, H, D)`` with ``unsqueeze_dim=2``. Partial rotary when
    cos / sin are narrower than the head."""
    if unsqueeze_dim == 1:
        return rope(q, k, cos, sin)
    if unsqueeze_dim == 2:
        q_out, k_out = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError(f"fk.apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")


# --- checks and fake kernels (csrc/ops/rope/rope.cpp raises the same messages) -----------

def _strides_text(t):
    return "[" + ", ".join(str(s) for s in t.stride()) + "]"


def check_qk_and_tables(op, q, k, cos, sin):
    """What every rotary op checks first (csrc/ops/rope/rope.cpp: the same messages)."""
    c.check(q.dim() == 4 and k.dim() == 4, op,
            ": q and k must have 4 dims (batch, heads, seq, head_dim), got shapes ",
            c.shape_text(q), " and ", c.shape_text(k))
    c.check_pair(op, "q", q, "k", k)
    c.check(q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2] and q.shape[3] == k.shape[3],
            op, ": q and k must have the same batch, seq and head_dim sizes, got shapes ",
            c.shape_text(q), " and ", c.shape_text(k))
    c.check_same_device(op, "cos", cos, "q", q)
    c.check_same_device(op, "sin", sin, "q", q)
    c.check_same_dtype(op, "cos", cos, "sin", sin)
    c.check_same_shape(op, "cos", cos, "sin", sin)
    c.check(cos.dtype == q.dtype or cos.dtype == torch.float32, op,
            ": cos and sin must be float32 or q's dtype (", c.dtype_name(q.dtype), "), got ",
            c.dtype_name(cos.dtype))


def check_rope(op, q, k, cos, sin, rotary_dim):
    check_qk_and_tables(op, q, k, cos, sin)
    cd = cos.dim()
    c.check(2 <= cd <= 4 and (cd != 4 or cos.shape[1] == 1), op,
            ": cos and sin must have shape (seq, rotary_dim), (batch or 1, seq, rotary_dim) "
            "or (batch or 1, 1, seq, rotary_dim), got ", c.shape_text(cos))
    c.check(cos.shape[-2] == q.shape[2], op, ": cos and sin must have q's seq length (",
            q.shape[2], ") in dim -2, got shape ", c.shape_text(cos))
    c.check(cd == 2 or cos.shape[0] == 1 or cos.shape[0] == q.shape[0], op,
            ": cos and sin must have batch size 1 or q's (", q.shape[0], "), got shape ",
            c.shape_text(cos))
    width = cos.shape[-1]
    rot = width if rotary_dim is None else rotary_dim
    d = q.shape[3]
    c.check(rot >= 2 and rot % 2 == 0 and rot <= d, op, ": rotary_dim (", rot,
            ") must be even and between 2 and head_dim (", d, ")")
    c.check(width == rot or width * 2 == rot, op, ": cos and sin must have rotary_dim (", rot,
            ") or rotary_dim / 2 entries in their last dim, got ", width)


def _has_internal_overlap(t):
    return any(size > 1 and stride == 0 for size, stride in zip(t.shape, t.stride()))


def _is_set_to(a, b):
    """aten::is_set_to: the same storage, storage offset, sizes and strides."""
    return a is b or (a.untyped_storage()._cdata == b.untyped_storage()._cdata
                      and a.storage_offset() == b.storage_offset() and a.shape == b.shape
                      and a.stride() == b.stride())


def check_rope_inplace(q, k, cos, sin, rotary_dim):
    op = "fk::rope_"
    check_rope(op, q, k, cos, sin, rotary_dim)
    c.check(q.stride(3) == 1 and k.stride(3) == 1, op,
            ": q and k must have a contiguous last dim (stride 1), got strides ",
            _strides_text(q), " and ", _strides_text(k))
    c.check(not _has_internal_overlap(q) and not _has_internal_overlap(k), op,
            ": q and k must not have elements that share memory (expanded tensors)")
    c.check(not _is_set_to(q, k), op, ": q and k must be different tensors")


def _non_overlapping_and_dense(t):
    """c10's is_non_overlapping_and_dense: the elements fill one block of memory with no
    gaps and no element stored twice, in some order of the dims."""
    sizes, strides = t.shape, t.stride()
    if len(sizes) == 1:
        return sizes[0] < 2 or strides[0] == 1
    # By stride; dims of size 0 and 1 do not matter.
    expected = 1
    for d in sorted((d for d in range(len(sizes)) if sizes[d] >= 2), key=lambda d: strides[d]):
        if strides[d] != expected:
            return False
        expected *= sizes[d]
    return True


def rope_out_like(x):
    """x's own layout when x is one dense block with a contiguous last dim (as the CPU and
    CUDA kernels allocate it), else contiguous."""
    if _non_overlapping_and_dense(x) and x.stride(3) == 1:
        return x.new_empty_strided(x.shape, x.stride())
    return x.new_empty(x.shape)


@torch.library.register_fake("fk::rope")
def _rope_fake(q, k, cos, sin, rotary_dim=None, interleaved=False):
    check_rope("fk::rope", q, k, cos, sin, rotary_dim)
    return rope_out_like(q), rope_out_like(k)


@torch.library.register_fake("fk::_rope_backward")
def _rope_backward_fake(grad_q, grad_k, cos, sin, rotary_dim, interleaved):
    check_rope("fk::_rope_backward", grad_q, grad_k, cos, sin, rotary_dim)
    return rope_out_like(grad_q), rope_out_like(grad_k)


@torch.library.register_fake("fk::rope_")
def _rope_inplace_fake(q, k, cos, sin, rotary_dim=None, interleaved=False):
    check_rope_inplace(q, k, cos, sin, rotary_dim)


# --- autograd: rope keeps cos and sin; the backward applies the transposed rotation -------

def _setup_context(ctx, inputs, output):
    _q, _k, cos, sin, rotary_dim, interleaved = inputs
    ctx.save_for_backward(cos, sin)
    ctx.rotary_dim, ctx.interleaved = rotary_dim, interleaved


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    dq, dk = torch.ops.fk._rope_backward(grad_q, grad_k, cos, sin, ctx.rotary_dim,
                                         ctx.interleaved)
    return dq, dk, None, None, None, None


_rope_eager = _autograd.register("fk::rope", _backward, _setup_context)


# rope_ has no derivative. Its Autograd kernel (a Python kernel registered directly, as
# register_autograd does internally: register_autograd takes no op that mutates its inputs)
# refuses tensors autograd would need to track, and bumps the version counters of q and k so
# that a tensor saved for some backward is not read after it was overwritten.
def _rope_inplace_autograd(keyset, q, k, cos, sin, rotary_dim=None, interleaved=False):
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        c.fail("fk::rope_ is not differentiable: q and k require grad; use fk::rope, or call "
               "it under no_grad")
    with torch._C._AutoDispatchBelowADInplaceOrView():
        torch.ops.fk.rope_.default.redispatch(keyset & torch._C._after_ADInplaceOrView_keyset,
                                              q, k, cos, sin, rotary_dim, interleaved)
    torch.autograd.graph.increment_version((q, k))


_LIB = torch.library.Library("fk", "IMPL")
_LIB.impl("rope_", _rope_inplace_autograd, "Autograd", with_keyset=True)
