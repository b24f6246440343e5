"""fk.llama4_rope. Autograd: registered on ``fk::llama4_rope`` itself (its backward needs only
freqs_cis, an input of the op), calling ``fk::_llama4_rope_backward``."""
from typing import Tuple

import torch

from . import _autograd, _checks as c
from .rope import rope_out_like


def llama4_rope(q: torch.Tensor, k: torch.Tensor, freqs_cis: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's rotary embedding of queries and keys, in one kernel launch.

    Each adjacent pair ``(x[2i], x[2i+1])`` of every head is read as the complex number
    ``x[2i] + i x[2i+1]`` and multiplied by ``freqs_cis[..., s, i]``: Hugging Face's
    ``apply_rotary_emb`` of Llama 4, ``view_as_real(view_as_complex(x.float().reshape(...,
    D/2, 2)) * freqs_cis).flatten(3)``. Computed in float32 and rounded once to q's dtype.

    Args:
        q: ``(B, S, Hq, D)`` (the layout of Llama 4's attention before the transpose), D
            even; float32, bfloat16 or float16 (float64 on CPU). Any batch, seq and head
            strides (read in place); a last dim with a stride other than 1 is copied first.
        k: ``(B, S, Hkv, D)``, same dtype, device, batch, seq and head dim as ``q``.
        freqs_cis: complex64 ``(S, D/2)`` or ``(1 or B, S, D/2)`` (what Llama 4's rotary
            embedding returns), or its ``torch.view_as_real`` view ``(..., D/2, 2)`` in
            float32 or q's dtype (complex128 / float64 with float64 q). Any values: a
            scaled rotation (attention scaling) is applied as given.

    Returns:
        ``(q_out, k_out)``, new tensors of q's and k's shapes and dtype, laid out like their
        inputs when those are dense with a contiguous last dim (else contiguous).
        Differentiable in q and k: the backward multiplies the gradients by
        ``conj(freqs_cis)`` in one launch. freqs_cis gets no gradient.

    Raises:
        RuntimeError naming ``fk::llama4_rope`` and the argument on bad shapes, dtypes or
        devices.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.llama4_rope(q, k, freqs_cis)
    return _eager_llama4_rope(q, k, freqs_cis)


@torch.jit.unused
def _eager_llama4_rope(q, k, freqs_cis):
    return _llama4_rope_eager(q, k, freqs_cis)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for Hugging Face Llama 4's ``apply_rotary_emb`` (the same signature)."""
    return llama4_rope(xq, xk, freqs_cis)


# --- checks and fake kernels (csrc/ops/llama4_rope/llama4_rope.cpp raises the same messages) --

_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def check_llama4_rope(op, q, k, freqs):
    c.check(q.dim() == 4 and k.dim() == 4, op,
            ": q and k must have 4 dims (batch, seq, heads, head_dim), got shapes ",
            c.shape_text(q), " and ", c.shape_text(k))
    c.check_pair(op, "q", q, "k", k)
    c.check(q.shape[0] == k.shape[0] and q.shape[1] == k.shape[1] and q.shape[3] == k.shape[3],
            op, ": q and k must have the same batch, seq and head_dim sizes, got shapes ",
            c.shape_text(q), " and ", c.shape_text(k))
    d = q.shape[3]
    c.check(d >= 2 and d % 2 == 0, op, ": head_dim must be even and at least 2, got ", d)
    c.check_same_device(op, "freqs_cis", freqs, "q", q)
    cplx = freqs.dtype in _PARTS
    part = _PARTS.get(freqs.dtype, freqs.dtype)
    c.check(part == torch.float32 or part == q.dtype, op,
            ": freqs_cis must be complex64, or float32 or q's dtype (", c.dtype_name(q.dtype),
            ") holding (real, imag) pairs, got ", c.dtype_name(freqs.dtype))
    fd = freqs.dim() if cplx else freqs.dim() - 1
    c.check(fd in (2, 3) and (cplx or freqs.shape[-1] == 2), op,
            ": freqs_cis must have shape (seq, head_dim / 2) or (batch or 1, seq, "
            "head_dim / 2) (complex), or that shape with a last dim of 2 (real, imag), got ",
            c.shape_text(freqs))
    c.check(freqs.shape[fd - 2] == q.shape[1], op, ": freqs_cis must have q's seq length (",
            q.shape[1], "), got shape ", c.shape_text(freqs))
    c.check(fd == 2 or freqs.shape[0] == 1 or freqs.shape[0] == q.shape[0], op,
            ": freqs_cis must have batch size 1 or q's (", q.shape[0], "), got shape ",
            c.shape_text(freqs))
    c.check(freqs.shape[fd - 1] == d // 2, op, ": freqs_cis must have head_dim / 2 (", d // 2,
            ") entries per position, got shape ", c.shape_text(freqs))


@torch.library.register_fake("fk::llama4_rope")
def _llama4_rope_fake(q, k, freqs_cis):
    check_llama4_rope("fk::llama4_rope", q, k, freqs_cis)
    return rope_out_like(q), rope_out_like(k)


@torch.library.register_fake("fk::_llama4_rope_backward")
def _llama4_rope_backward_fake(grad_q, grad_k, freqs_cis):
    check_llama4_rope("fk::_llama4_rope_backward", grad_q, grad_k, freqs_cis)
    return rope_out_like(grad_q), rope_out_like(grad_k)


# --- autograd: keeps freqs_cis; the backward multiplies by its conjugate --------------------

def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])


def _backward(ctx, grad_q, grad_k):
    (freqs,) = ctx.saved_tensors
    dq, dk = torch.ops.fk._llama4_rope_backward(grad_q, grad_k, freqs)
    return dq, dk, None


_llama4_rope_eager = _autograd.register("fk::llama4_rope", _backward, _setup_context)
