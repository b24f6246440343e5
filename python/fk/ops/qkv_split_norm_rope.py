"""fk.qkv_split_norm_rope. Autograd: registered on ``fk::qkv_split_norm_rope`` itself (its
backward recomputes the per-head rstd from the saved qkv), calling
``fk::_qkv_split_norm_rope_backward``."""
from typing import Optional, Tuple

import torch

from . import _autograd, _checks as c
from .rope import check_rope

LAYOUTS = ("bshd", "bhsd")
QKV_FORMATS = ("grouped", "plain")
INPUT_LAYOUTS = ("sbh", "bsh")


def qkv_split_norm_rope(qkv: torch.Tensor, q_norm_weight: Optional[torch.Tensor],
                        k_norm_weight: Optional[torch.Tensor], cos: torch.Tensor,
                        sin: torch.Tensor, num_heads: int, num_kv_heads: int, eps: float = 1e-6,
                        rotary_dim: Optional[int] = None, layout: str = "bshd",
                        qkv_format: str = "grouped", input_layout: str = "sbh"
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention inputs from the fused QKV projection in one kernel: split into q, k, v,
    RMSNorm of every q and k head (qk-norm), rotary embedding of q and k, and the transpose
    to the layout attention reads.

    Per q head (the same for k with ``k_norm_weight``)::

        n = q_norm_weight * (x * rsqrt(mean(x**2, -1) + eps)).to(dtype)   # Qwen3 / OLMo 2
        q = n * cos + rotate_half(n) * sin      # on n[..., :rotary_dim]; the rest is n

    The norm follows Hugging Face's ``Qwen3RMSNorm``: float32 statistics, the normalized row
    rounded to qkv's dtype, then multiplied by the weight (in qkv's dtype). The rotation is
    :func:`fk.rope`'s (Llama's rotate-half, partial rotary on the leading dims), in float32
    from the normalized row, rounded once. v is copied.

    Args:
        qkv: the projection's output, ``(S, B, N)`` (``input_layout="sbh"``, Megatron) or
            ``(B, S, N)`` (``"bsh"``, Hugging Face), ``N = (num_heads + 2 * num_kv_heads) *
            head_dim``; float32, bfloat16 or float16 (float64 on CPU). Read through its
            strides (a last dim with a stride other than 1 is copied first).
        q_norm_weight, k_norm_weight: ``(head_dim,)`` of qkv's dtype, or None: no norm of
            q (or k).
        cos, sin: as :func:`fk.rope` takes them for seq length S: ``(S, W)``,
            ``(1 or B, S, W)`` (Hugging Face's rotary embedding output) or
            ``(1 or B, 1, S, W)``, float32 or qkv's dtype, ``W = rotary_dim`` (both halves
            stored) or ``rotary_dim / 2``.
        num_heads, num_kv_heads: query and key / value heads; num_heads a multiple of
            num_kv_heads.
        eps: added to the mean of squares.
        rotary_dim: the rotating leading dims of each head (even, at most head_dim, at most
            256 on CUDA). Default: ``cos.shape[-1]``.
        layout: ``"bshd"``: outputs ``(B, S, H, D)`` (flash-attention); ``"bhsd"``:
            ``(B, H, S, D)`` (``scaled_dot_product_attention``). Contiguous either way.
        qkv_format: ``"grouped"``: per kv group ``[q heads of the group..., k, v]``
            (Megatron's fused QKV weight); ``"plain"``: ``[q heads..., k heads...,
            v heads...]`` (a concatenation of separate q, k, v projections).
        input_layout: ``"sbh"`` or ``"bsh"``, see qkv.

    Returns:
        ``(q, k, v)`` with num_heads, num_kv_heads, num_kv_heads heads. Differentiable in qkv
        and both norm weights; the backward is one kernel (plus a reduction of float32
        partial weight gradients). cos and sin get no gradient.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.qkv_split_norm_rope(qkv, q_norm_weight, k_norm_weight, cos, sin,
                                                num_heads, num_kv_heads, eps, rotary_dim,
                                                layout, qkv_format, input_layout)
    return _eager(qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads, num_kv_heads, eps,
                  rotary_dim, layout, qkv_format, input_layout)


@torch.jit.unused
def _eager(qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads: int, num_kv_heads: int,
           eps: float, rotary_dim: Optional[int], layout: str, qkv_format: str,
           input_layout: str):
    return _qkv_split_norm_rope_eager(qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads,
                                      num_kv_heads, eps, rotary_dim, layout, qkv_format,
                                      input_layout)


# --- checks and fake kernels (csrc/ops/qkv_split_norm_rope/qkv_split_norm_rope.cpp raises
# the same messages) ---------------------------------------------------------------------

def _choice(op, arg, value, options):
    c.check(value in options, op, ": ", arg, " must be '", options[0], "' or '", options[1],
            "', got '", value, "'")


def _check_norm_weight(op, name, qkv, w, d):
    if w is None:
        return
    c.check_pair(op, "qkv", qkv, name, w)
    c.check(w.dim() == 1 and w.shape[0] == d, op, ": ", name, " must have shape (", d,
            ",) (head_dim), got ", c.shape_text(w))


def check_qkv_split_norm_rope(op, qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads,
                              num_kv_heads, rotary_dim, layout, qkv_format, input_layout):
    """The checks of every backend; returns (B, S, head_dim, bhsd)."""
    _choice(op, "layout", layout, LAYOUTS)
    _choice(op, "qkv_format", qkv_format, QKV_FORMATS)
    _choice(op, "input_layout", input_layout, INPUT_LAYOUTS)
    sb = input_layout == "sbh"
    c.check(qkv.dim() == 3, op, ": qkv must have 3 dims (", "seq, batch" if sb else "batch, seq",
            ", (num_heads + 2 * num_kv_heads) * head_dim) for input_layout '", input_layout,
            "', got shape ", c.shape_text(qkv))
    c.check_float(op, "qkv", qkv)
    c.check(num_heads >= 1 and num_kv_heads >= 1 and num_heads % num_kv_heads == 0, op,
            ": num_heads (", num_heads, ") must be a positive multiple of num_kv_heads (",
            num_kv_heads, ")")
    heads, n = num_heads + 2 * num_kv_heads, qkv.shape[2]
    c.check(n % heads == 0 and n > 0, op, ": the last dim of qkv (", n,
            ") must be (num_heads + 2 * num_kv_heads) * head_dim = ", heads, " * head_dim")
    d = n // heads
    _check_norm_weight(op, "q_norm_weight", qkv, q_norm_weight, d)
    _check_norm_weight(op, "k_norm_weight", qkv, k_norm_weight, d)
    x = qkv.transpose(0, 1) if sb else qkv
    head = x.narrow(2, 0, d).unsqueeze(1)  # one head as (B, 1, S, D): fk::rope's checks
    check_rope(op, head, head, cos, sin, rotary_dim)
    return x.shape[0], x.shape[1], d, layout == "bhsd"


def _output(qkv, b, s, heads, d, bhsd):
    return qkv.new_empty((b, heads, s, d) if bhsd else (b, s, heads, d))


@torch.library.register_fake("fk::qkv_split_norm_rope")
def _fake(qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads, num_kv_heads, eps=1e-6,
          rotary_dim=None, layout="bshd", qkv_format="grouped", input_layout="sbh"):
    b, s, d, bhsd = check_qkv_split_norm_rope(
        "fk::qkv_split_norm_rope", qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads,
        num_kv_heads, rotary_dim, layout, qkv_format, input_layout)
    return tuple(_output(qkv, b, s, h, d, bhsd) for h in (num_heads, num_kv_heads, num_kv_heads))


@torch.library.register_fake("fk::_qkv_split_norm_rope_backward")
def _backward_fake(grad_q, grad_k, grad_v, qkv, q_norm_weight, k_norm_weight, cos, sin,
                   num_heads, num_kv_heads, eps, rotary_dim, layout, qkv_format, input_layout,
                   output_mask):
    op = "fk::_qkv_split_norm_rope_backward"
    b, s, d, bhsd = check_qkv_split_norm_rope(op, qkv, q_norm_weight, k_norm_weight, cos, sin,
                                              num_heads, num_kv_heads, rotary_dim, layout,
                                              qkv_format, input_layout)
    for name, g, h in (("grad_q", grad_q, num_heads), ("grad_k", grad_k, num_kv_heads),
                       ("grad_v", grad_v, num_kv_heads)):
        c.check_pair(op, name, g, "qkv", qkv)
        want = (b, h, s, d) if bhsd else (b, s, h, d)
        c.check(tuple(g.shape) == want, op, ": ", name, " must have the output's shape [",
                ", ".join(str(v) for v in want), "], got ", c.shape_text(g))
    dqw = torch.empty_like(q_norm_weight) if q_norm_weight is not None and output_mask[0] \
        else None
    dkw = torch.empty_like(k_norm_weight) if k_norm_weight is not None and output_mask[1] \
        else None
    return torch.empty_like(qkv, memory_format=torch.contiguous_format), dqw, dkw


# --- autograd: the forward keeps qkv, the weights, cos and sin ---------------------------

def _setup_context(ctx, inputs, output):
    qkv, qw, kw, cos, sin = inputs[:5]
    ctx.save_for_backward(qkv, qw, kw, cos, sin)
    ctx.args = inputs[5:]


def _backward(ctx, grad_q, grad_k, grad_v):
    qkv, qw, kw, cos, sin = ctx.saved_tensors
    mask = [qw is not None and ctx.needs_input_grad[1], kw is not None and ctx.needs_input_grad[2]]
    dqkv, dqw, dkw = torch.ops.fk._qkv_split_norm_rope_backward(
        grad_q, grad_k, grad_v, qkv, qw, kw, cos, sin, *ctx.args, mask)
    return (dqkv, dqw, dkw) + (None,) * 9


_qkv_split_norm_rope_eager = _autograd.register("fk::qkv_split_norm_rope", _backward,
                                                _setup_context)
