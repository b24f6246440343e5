"""fk.moe_permute_fp8: fk.moe_permute's gather of tokens into padded expert segments, with the
permuted rows quantized to float8_e4m3fn in 1 x 128 blocks on the way (the format:
python/fk/ops/fp8_quantize.py), for the FP8 grouped GEMMs of the experts' first projection.

The permuted matrix P (N, H) is the one fk.moe_permute returns (the row map and the padding
are its: python/fk/ops/moe_permute.py); it is never written in the tokens' dtype. The copies
are bit for bit ``fk.fp8_quantize(P)``'s row-wise copy and the column-wise copy of P per
expert segment (the layout of fk.moe_swiglu_fp8's, with the padded ``tokens_per_expert`` as
the segments), for the weight-gradient GEMMs.

Gradients. The quantized copies carry none (an FP8 tensor cannot), and the row map and the
counts are integers: no output but ``permuted_probs`` requires grad, which is
differentiable in ``probs`` as fk.moe_permute's (``dprobs[t, e]`` = its gradient at row
``row_id_map[t, e]``, 0 where not routed). The tokens' gradient is the backward of the
permute, a gather-sum over the row map, which fk.moe_unpermute is: given the gradient ``g``
(N, H) of P (from the FP8 GEMM's backward), ``fk.moe_unpermute(g, row_id_map)``
(tests/ops/test_moe_permute_fp8.py checks both against autograd of fk.moe_permute).
"""
from typing import Optional

import torch

from . import _autograd, _checks as c
from .fp8_quantize import _FLOATS, parse_layout
from .moe_permute import check_moe_permute, moe_permute_bound

_OP = "fk::moe_permute_fp8"


def moe_permute_fp8(tokens: torch.Tensor, routing_map: torch.Tensor,
                    probs: Optional[torch.Tensor] = None, pad_to: int = 16,
                    topk: Optional[int] = None, num_out_rows: Optional[int] = None,
                    layout: str = "rowwise", pow2_scales: bool = False):
    """fk.moe_permute with the permuted rows quantized to float8_e4m3fn in 1 x 128 blocks.

    Args:
        tokens: ``(T, H)``, float32, bfloat16 or float16.
        routing_map, probs, pad_to, topk, num_out_rows: as in :func:`fk.moe_permute` (the
            row count N of the outputs: the padded segments' total, one host
            synchronisation, or the static bound from ``topk`` / ``num_out_rows``, no
            synchronisation).
        layout: ``"rowwise"`` (the copy of P, for the forward grouped GEMM),
            ``"columnwise"`` (the copy of P.T per expert segment, for the weight-gradient
            GEMMs) or ``"both"``; one kernel writes the copies asked for.
        pow2_scales: round every scale up to a power of two.

    Returns:
        The copies, then ``(permuted_probs, row_id_map, tokens_per_expert)`` as
        :func:`fk.moe_permute` returns them (``permuted_probs`` None without ``probs``):
        ``"rowwise"``: ``(data (N, H), scales (ceil(H/128), N), ...)``;
        ``"columnwise"``: ``(data_t (H, N), scales_t ((N + 127 E) // 128, H), ...)``;
        ``"both"``: ``(data, scales, data_t, scales_t, ...)``. The row-wise copy is
        ``fk.fp8_quantize(P)``'s: padding rows (and rows past the last segment) are zero
        data with scale 1.0. The column-wise copy is quantized per expert segment
        (``tokens_per_expert[e]`` rows from ``sum(tokens_per_expert[:e])``; segment e's
        ``ceil(M_e / 128)`` blocks of 128 rows from its first, their scales in rows
        ``blk_e = sum_{f<e} ceil(M_f / 128)`` on of scales_t, the rows past the last block
        1.0), as :func:`fk.moe_swiglu_fp8` lays it out; the columns of rows past the last
        segment are zero. An inf or NaN in a token makes the blocks holding it NaN, in
        every copy of it.

    Raises:
        RuntimeError naming ``fk::moe_permute_fp8`` for what :func:`fk.moe_permute` rejects,
        another tokens dtype or layout; on a CUDA GPU older than compute capability 9.0; on
        CUDA for a column-wise copy with more than 1024 experts.
    """
    if topk is not None:
        c.check(num_out_rows is None, _OP, ": give topk or num_out_rows, not both")
        num_out_rows = moe_permute_bound(tokens.shape[0], routing_map.shape[-1], topk, pad_to,
                                         _OP)
    args = (tokens, routing_map, probs, pad_to, num_out_rows, layout, pow2_scales)
    q, s, qt, st, pp, row_map, tpe = (_moe_permute_fp8_eager(*args) if _autograd.eager()
                                      else torch.ops.fk.moe_permute_fp8(*args))
    copies = {"rowwise": (q, s), "columnwise": (qt, st)}.get(layout, (q, s, qt, st))
    return (*copies, pp, row_map, tpe)


def check_moe_permute_fp8(tokens, routing_map, probs, pad_to, num_out_rows, layout):
    c.check(tokens.dtype in _FLOATS, _OP, ": tokens has dtype ", c.dtype_name(tokens.dtype),
            ", which is not supported (supported: float32, bfloat16, float16)")
    check_moe_permute(tokens, routing_map, probs, pad_to, num_out_rows, _OP)
    return parse_layout(_OP, layout)


@torch.library.register_fake("fk::moe_permute_fp8")
def _moe_permute_fp8_fake(tokens, routing_map, probs=None, pad_to=16, num_out_rows=None,
                          layout="rowwise", pow2_scales=False):
    rowwise, columnwise = check_moe_permute_fp8(tokens, routing_map, probs, pad_to,
                                                num_out_rows, layout)
    t, h = tokens.shape
    e = routing_map.shape[1]
    n = num_out_rows if num_out_rows is not None else torch.library.get_ctx().new_dynamic_size()
    fp8 = torch.float8_e4m3fn
    q = tokens.new_empty((n, h), dtype=fp8) if rowwise else None
    s = tokens.new_empty((-(-h // 128), n), dtype=torch.float32) if rowwise else None
    qt = tokens.new_empty((h, n), dtype=fp8) if columnwise else None
    st = tokens.new_empty(((n + 127 * e) // 128, h), dtype=torch.float32) if columnwise else None
    pp = probs.new_empty((n,)) if probs is not None else None
    return (q, s, qt, st, pp, tokens.new_empty((t, e), dtype=torch.int32),
            tokens.new_empty((e,), dtype=torch.int32))


# --- autograd: only permuted_probs is differentiable (in probs) ---------------------------

def _setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(*(t for i, t in enumerate(output) if t is not None and i != 4))
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[5])


def _backward(ctx, _gq, _gs, _gqt, _gst, grad_pp, _gmap, _gtpe):
    none = (None,) * 7
    if grad_pp is None or not ctx.needs_input_grad[2]:
        return none
    (row_map,) = ctx.saved_tensors
    # rows past grad_pp's end read the appended zero: the entries not routed (-1), and every
    # entry when there are no rows at all
    n = grad_pp.shape[0]
    padded = torch.cat([grad_pp, grad_pp.new_zeros(1)])
    dprobs = padded[torch.where(row_map >= 0, row_map, n).long()]
    return None, None, dprobs, None, None, None, None


_moe_permute_fp8_eager = _autograd.register("fk::moe_permute_fp8", _backward, _setup_context)
