"""fk.neighborhood_attention. Autograd is registered on ``fk::_neighborhood_attention_forward``,
whose second output (the per-row logsumexp) the backward reads; the public op is that
forward's first output."""
from typing import Optional

import torch

from . import _autograd, _checks as c

MAX_CUDA_HEAD_DIM = 128


def neighborhood_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           kernel_size: int = 7, dilation: int = 1,
                           scale: Optional[float] = None) -> torch.Tensor:
    """1-D neighborhood attention over the sequence (as Liger Kernel's
    ``LigerFusedNeighborhoodAttentionFunction`` computes it): query ``i`` attends the keys
    ``j`` with ``|j - i| <= (kernel_size // 2) * dilation``, ``(j - i) % dilation == 0`` and
    ``0 <= j < seq_len``. Windows are cut at the sequence ends, not shifted inwards (so the
    first and last queries see fewer keys; NATTEN's shifted windows differ there). The
    softmax of ``scale * q k^T`` over those keys is taken in float32, times ``v``.

    Computed flash-attention style over the window only: no (seq_len, seq_len) scores, mask
    or probabilities exist in memory; work and memory are O(seq_len * kernel_size).

    Args:
        q, k, v: ``(batch, heads, seq_len, head_dim)``, one dtype (float32, bfloat16,
            float16; float64 on CPU) and device. Any strides: on CUDA they are read in place
            when ``head_dim`` is the unit-stride dim (e.g. a transposed ``(batch, seq_len,
            heads, head_dim)`` projection), else copied once. On CUDA ``head_dim`` is at most
            128 (the CPU backend takes any).
        kernel_size: the window size in keys, a positive odd number.
        dilation: the step between the window's keys, >= 1.
        scale: multiplies the scores; ``None`` means ``1 / sqrt(head_dim)``.

    Returns:
        A contiguous tensor of ``q``'s shape and dtype, accumulated in float32 (float64 for
        float64 inputs) and rounded once. Differentiable in ``q``, ``k`` and ``v`` (the
        flash-attention backward restricted to the window, from the saved float32
        logsumexp); double backward raises.

    Raises:
        RuntimeError naming the argument for: inputs that are not 4-D, of different shapes,
        dtypes or devices, an unsupported dtype, an even or non-positive ``kernel_size``, a
        non-positive ``dilation``, ``head_dim`` > 128 on CUDA.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk._neighborhood_attention_forward(q, k, v, kernel_size, dilation,
                                                            scale)[0]
    return _eager_forward(q, k, v, kernel_size, dilation, scale)[0]


@torch.jit.unused
def _eager_forward(q, k, v, kernel_size: int, dilation: int, scale: Optional[float]):
    return _forward_eager(q, k, v, kernel_size, dilation, scale)


# --- checks and fake kernels (csrc/ops/neighborhood_attention/neighborhood_attention.cpp
# raises the same messages) ------------------------------------------------------------------

def check_neighborhood_attention(q, k, v, kernel_size, dilation,
                                 op="fk::neighborhood_attention"):
    c.check(q.dim() == 4, op, ": q must have 4 dimensions (batch, heads, seq_len, head_dim), "
            "got shape ", c.shape_text(q))
    c.check_pair(op, "q", q, "k", k)
    c.check_pair(op, "q", q, "v", v)
    c.check_same_shape(op, "q", q, "k", k)
    c.check_same_shape(op, "q", q, "v", v)
    c.check(kernel_size > 0 and kernel_size % 2 == 1, op,
            ": kernel_size must be a positive odd number, got ", kernel_size)
    c.check(dilation > 0, op, ": dilation must be positive, got ", dilation)


def check_cuda_head_dim(q, op):
    if q.device.type == "cuda":
        d = q.shape[3]
        c.check(d <= MAX_CUDA_HEAD_DIM, op, ": head_dim ", d, " is larger than ",
                MAX_CUDA_HEAD_DIM, ", which is not supported on CUDA (the CPU backend takes "
                "any head_dim)")


def check_neighborhood_attention_backward(grad_out, q, k, v, out, lse, kernel_size, dilation):
    op = "fk::_neighborhood_attention_backward"
    check_neighborhood_attention(q, k, v, kernel_size, dilation)
    c.check_pair(op, "grad_out", grad_out, "q", q)
    c.check_same_shape(op, "grad_out", grad_out, "q", q)
    c.check_pair(op, "out", out, "q", q)
    c.check_same_shape(op, "out", out, "q", q)
    c.check_same_device(op, "lse", lse, "q", q)
    c.check(lse.dtype == c.acc_dtype(q), op,
            ": lse must be float32 (float64 for float64 q), got ", c.dtype_name(lse.dtype))
    b, h, n = q.shape[0], q.shape[1], q.shape[2]
    c.check(lse.dim() == 3 and lse.shape[0] == b and lse.shape[1] == h and lse.shape[2] == n,
            op, ": lse must have shape [", b, ", ", h, ", ", n, "], got ", c.shape_text(lse))
    check_cuda_head_dim(q, op)


@torch.library.register_fake("fk::_neighborhood_attention_forward")
def _forward_fake(q, k, v, kernel_size, dilation, scale):
    check_neighborhood_attention(q, k, v, kernel_size, dilation)
    check_cuda_head_dim(q, "fk::neighborhood_attention")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(q.shape[:3], dtype=c.acc_dtype(q))


@torch.library.register_fake("fk::_neighborhood_attention_backward")
def _backward_fake(grad_out, q, k, v, out, lse, kernel_size, dilation, scale):
    check_neighborhood_attention_backward(grad_out, q, k, v, out, lse, kernel_size, dilation)
    return tuple(torch.empty_like(q, memory_format=torch.contiguous_format) for _ in range(3))


# --- autograd: the forward keeps q, k, v, out and the logsumexp ----------------------------

def _setup_context(ctx, inputs, output):
    q, k, v, kernel_size, dilation, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1])
    ctx.kernel_size, ctx.dilation, ctx.scale = kernel_size, dilation, scale
    ctx.set_materialize_grads(False)  # the logsumexp's gradient is never read


def _backward(ctx, grad_out, _grad_lse):
    if grad_out is None:
        return None, None, None, None, None, None
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.fk._neighborhood_attention_backward(
        grad_out, q, k, v, out, lse, ctx.kernel_size, ctx.dilation, ctx.scale)
    return dq, dk, dv, None, None, None


_forward_eager = _autograd.register("fk::_neighborhood_attention_forward", _backward,
                                    _setup_context)

