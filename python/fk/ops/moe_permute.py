"""fk.moe_permute and fk.moe_unpermute: mixture-of-experts tokens gathered into
expert-major rows (each expert's segment padded to a multiple of ``pad_to``) and their expert
outputs summed back. Autograd is registered on both ops: the backward of moe_permute is a
gather-sum (``fk::_moe_permute_backward``), that of moe_unpermute a scatter with the probs'
gradient as row dot products (``fk::_moe_unpermute_backward``).

The row map. ``row_id_map`` is a ``(T, E)`` int32 tensor: ``row_id_map[t, e]`` is the row of
``permuted`` that holds token ``t`` for expert ``e``, or -1 where ``t`` is not routed to
``e``. Expert ``e``'s segment starts at ``sum(tokens_per_expert[:e])`` and holds its routed
tokens in increasing token order, then zero rows up to ``tokens_per_expert[e]`` rows, the
count of its tokens rounded up to a multiple of ``pad_to``. Rows past the last segment (up to
``num_out_rows``) are zero too.
"""
from typing import Optional, Tuple

import torch

from . import _autograd, _checks as c

_INDEX_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_INT31 = 2 ** 31 - 1


def moe_permute(tokens: torch.Tensor, routing_map: torch.Tensor,
                probs: Optional[torch.Tensor] = None, pad_to: int = 16,
                topk: Optional[int] = None, num_out_rows: Optional[int] = None
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Gather tokens into expert-major order, each expert's segment padded to a multiple of
    ``pad_to`` rows (16 for FP8 GEMMs, 128 for some grouped GEMMs) by leaving zero rows in
    the row map rather than padding the activations afterwards.

    Args:
        tokens: ``(T, H)``, float32, bfloat16 or float16 (float64 on CPU).
        routing_map: ``(T, E)`` bool, or integers (any nonzero entry is routed; a bool map
            is used as it is, others are compared with 0 first): token ``t`` goes to expert
            ``e`` where it is set. Any number of experts per token.
        probs: ``(T, E)`` router probabilities, float32 or ``tokens``' dtype, or None;
            gathered alongside (``permuted_probs``), for a later weighted unpermute or for
            weighting inside the experts.
        pad_to: segment size multiple, >= 1 (1: no padding).
        topk: the most experts any token is routed to. The output then has the static row
            count ``T * topk + min(E, T * topk) * (pad_to - 1)`` (capped at
            ``E * ceil(T / pad_to) * pad_to``), the most the padded segments can need, and
            nothing waits for the device: CUDA-graph capturable, and torch.compile sees a
            shape known from the sizes.
        num_out_rows: the output's row count, given directly (instead of ``topk``).
        With neither, the output has exactly the rows the padded segments need, which the
        host reads from the device: one synchronisation per call (torch.compile then gives
        the output a data-dependent size).

    Returns:
        ``(permuted, permuted_probs, row_id_map, tokens_per_expert)``:
        ``permuted`` ``(N, H)`` of ``tokens``' dtype: row ``row_id_map[t, e]`` is token
        ``t``; padding rows and the rows past the last segment are zero.
        ``permuted_probs`` ``(N,)`` of ``probs``' dtype: ``probs[t, e]`` at that row, 0 on
        padding; None without ``probs``.
        ``row_id_map`` ``(T, E)`` int32 (the module docstring defines it).
        ``tokens_per_expert`` ``(E,)`` int32 on the device: each expert's padded segment
        size (``torch.cumsum`` of it gives the segment ends, as torch._grouped_mm's
        ``offs`` takes them).

        Differentiable in ``tokens`` and ``probs``. On CUDA the row map is built on the
        device, and each token's row is read once and written to its rows (8 experts per
        pass; more take more passes). The trailing rows cost memory: with ``pad_to=128``
        the bound holds up to ``127 * E`` rows more than ``T * topk``. Where a bound is given and the segments need more rows (a token routed to
        more than ``topk`` experts), a device-side assert fires (CPU: a RuntimeError naming
        both counts).
    """
    if topk is not None:
        if num_out_rows is not None:
            raise RuntimeError("fk::moe_permute: give topk or num_out_rows, not both")
        num_out_rows = moe_permute_bound(tokens.shape[0], routing_map.shape[-1], topk, pad_to)
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.moe_permute(tokens, routing_map, probs, pad_to, num_out_rows)
    return _eager_permute(tokens, routing_map, probs, pad_to, num_out_rows)


def moe_permute_bound(num_tokens: int, num_experts: int, topk: int, pad_to: int = 16,
                      op: str = "fk::moe_permute") -> int:
    """The most rows moe_permute's padded segments can need when each of ``num_tokens``
    tokens is routed to at most ``topk`` of ``num_experts`` experts (``op``: the caller the
    errors name)."""
    if topk < 1:
        raise RuntimeError(f"{op}: topk must be at least 1, got {topk}")
    if pad_to < 1:
        raise RuntimeError(f"{op}: pad_to must be in [1, 2^31), got {pad_to}")
    routed = num_tokens * topk
    per_expert = (num_tokens + pad_to - 1) // pad_to * pad_to
    if torch.jit.is_scripting():
        return min(routed + min(num_experts, routed) * (pad_to - 1), num_experts * per_expert)
    # sym_min: no guard on symbolic sizes under torch.compile with dynamic shapes (plain ints
    # take min: dynamo rejects a torch.* call that returns an int)
    bound = routed + _min(num_experts, routed) * (pad_to - 1)
    return _min(bound, num_experts * per_expert)


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return torch.sym_min(a, b)


@torch.jit.unused
def _eager_permute(tokens, routing_map, probs, pad_to, num_out_rows):
    return _permute_eager(tokens, routing_map, probs, pad_to, num_out_rows)


def moe_unpermute(permuted: torch.Tensor, row_id_map: torch.Tensor,
                  probs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Sum each token's expert outputs back: ``out[t] = sum over e with row_id_map[t, e] >= 0
    of probs[t, e] * permuted[row_id_map[t, e]]`` (without ``probs``, weights 1).

    Args:
        permuted: ``(N, H)`` expert outputs in moe_permute's row order (its padding rows are
            never read), float32, bfloat16 or float16 (float64 on CPU).
        row_id_map: ``(T, E)`` int32 from :func:`moe_permute` (with ``permuted``'s N). On
            CPU an entry that is neither -1 nor a row of ``permuted`` raises; on CUDA it
            reads as -1 (nothing is read out of bounds).
        probs: ``(T, E)``, float32 or ``permuted``'s dtype, or None.

    Returns:
        ``(T, H)`` of ``permuted``'s dtype, accumulated in float32 (each token's experts in
        increasing order) and rounded once; a token routed nowhere gets zeros.
        Differentiable in ``permuted`` (its padding rows get zero gradient) and ``probs``
        (``dprobs[t, e]`` = the dot product of the output gradient of ``t`` with
        ``permuted``'s row, 0 where not routed).
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.moe_unpermute(permuted, row_id_map, probs)
    return _eager_unpermute(permuted, row_id_map, probs)


@torch.jit.unused
def _eager_unpermute(permuted, row_id_map, probs):
    return _unpermute_eager(permuted, row_id_map, probs)


# --- checks and fake kernels (csrc/ops/moe_permute/moe_permute.cpp raises the same) -------

def _check_probs(op, probs, like_name, like, t, e):
    c.check_same_device(op, "probs", probs, like_name, like)
    c.check_float(op, "probs", probs)
    c.check(probs.dtype in (torch.float32, like.dtype), op,
            ": probs must be float32 or the dtype of ", like_name, " (",
            c.dtype_name(like.dtype), "), got ",
            c.dtype_name(probs.dtype))
    c.check(probs.dim() == 2 and probs.shape[0] == t and probs.shape[1] == e, op,
            ": probs must have shape (", t, ", ", e, "), got ", c.shape_text(probs))


def check_moe_permute(tokens, routing_map, probs, pad_to, num_out_rows, op="fk::moe_permute"):
    c.check(tokens.dim() == 2, op, ": tokens must be 2-D (T, H), got shape ",
            c.shape_text(tokens))
    c.check_float(op, "tokens", tokens)
    c.check_same_device(op, "tokens", tokens, "routing_map", routing_map)
    c.check(routing_map.dim() == 2 and routing_map.shape[0] == tokens.shape[0], op,
            ": routing_map must have shape (", tokens.shape[0], ", E), got ",
            c.shape_text(routing_map))
    c.check(routing_map.dtype in _INDEX_DTYPES, op, ": routing_map has dtype ",
            c.dtype_name(routing_map.dtype), ", which is not supported (supported: bool, "
            "integers)")
    if probs is not None:
        _check_probs(op, probs, "tokens", tokens, tokens.shape[0], routing_map.shape[1])
    c.check(1 <= pad_to <= _INT31, op, ": pad_to must be in [1, 2^31), got ", pad_to)
    if num_out_rows is not None:
        c.check(0 <= num_out_rows <= _INT31, op, ": num_out_rows must be in [0, 2^31), got ",
                num_out_rows)


def check_moe_unpermute(op, permuted, row_id_map, probs):
    c.check(permuted.dim() == 2, op, ": permuted must be 2-D (N, H), got shape ",
            c.shape_text(permuted))
    c.check_float(op, "permuted", permuted)
    c.check_same_device(op, "permuted", permuted, "row_id_map", row_id_map)
    c.check(row_id_map.dim() == 2 and row_id_map.dtype == torch.int32, op,
            ": row_id_map must be a 2-D (T, E) int32 tensor (moe_permute's), got ",
            c.dtype_name(row_id_map.dtype), " of shape ", c.shape_text(row_id_map))
    c.check(permuted.shape[0] <= _INT31, op, ": permuted has ", permuted.shape[0],
            " rows; at most 2^31 - 1 are supported")
    if probs is not None:
        _check_probs(op, probs, "permuted", permuted, row_id_map.shape[0],
                     row_id_map.shape[1])


@torch.library.register_fake("fk::moe_permute")
def _permute_fake(tokens, routing_map, probs=None, pad_to=16, num_out_rows=None):
    check_moe_permute(tokens, routing_map, probs, pad_to, num_out_rows)
    t, h = tokens.shape
    e = routing_map.shape[1]
    n = num_out_rows if num_out_rows is not None else torch.library.get_ctx().new_dynamic_size()
    permuted = tokens.new_empty((n, h))
    pp = probs.new_empty((n,)) if probs is not None else None
    return (permuted, pp, tokens.new_empty((t, e), dtype=torch.int32),
            tokens.new_empty((e,), dtype=torch.int32))


@torch.library.register_fake("fk::moe_unpermute")
def _unpermute_fake(permuted, row_id_map, probs=None):
    check_moe_unpermute("fk::moe_unpermute", permuted, row_id_map, probs)
    return permuted.new_empty((row_id_map.shape[0], permuted.shape[1]))


@torch.library.register_fake("fk::_moe_permute_backward")
def _permute_backward_fake(grad_permuted, grad_permuted_probs, row_id_map):
    op = "fk::_moe_permute_backward"
    check_moe_unpermute(op, grad_permuted, row_id_map, None)
    t, e = row_id_map.shape
    dprobs = None
    if grad_permuted_probs is not None:
        g = grad_permuted_probs
        c.check_same_device(op, "grad_permuted_probs", g, "grad_permuted", grad_permuted)
        c.check_float(op, "grad_permuted_probs", g)
        c.check(g.dim() == 1 and g.shape[0] == grad_permuted.shape[0], op,
                ": grad_permuted_probs must have shape (", grad_permuted.shape[0], ",), got ",
                c.shape_text(g))
        dprobs = g.new_empty((t, e))
    return grad_permuted.new_empty((t, grad_permuted.shape[1])), dprobs


@torch.library.register_fake("fk::_moe_unpermute_backward")
def _unpermute_backward_fake(grad_out, permuted, row_id_map, probs, want_probs):
    op = "fk::_moe_unpermute_backward"
    check_moe_unpermute(op, permuted, row_id_map, probs)
    c.check_pair(op, "grad_out", grad_out, "permuted", permuted)
    t, h = row_id_map.shape[0], permuted.shape[1]
    c.check(grad_out.dim() == 2 and grad_out.shape[0] == t and grad_out.shape[1] == h, op,
            ": grad_out must have shape (", t, ", ", h, "), got ", c.shape_text(grad_out))
    dprobs = probs.new_empty(probs.shape) if want_probs and probs is not None else None
    return grad_out.new_empty(permuted.shape), dprobs


# --- autograd ---------------------------------------------------------------------------

def _permute_setup(ctx, inputs, output):
    tokens, _, probs, _, _ = inputs
    ctx.save_for_backward(output[2])
    ctx.permuted_meta = (output[0].shape[0], tokens.shape[1], tokens.dtype)
    ctx.probs_dtype = probs.dtype if probs is not None else None


def _permute_backward(ctx, grad_permuted, grad_pp, _grad_map, _grad_tpe):
    (row_map,) = ctx.saved_tensors
    need = ctx.needs_input_grad
    want_probs = ctx.probs_dtype is not None and need[2]
    if not (need[0] or want_probs):
        return None, None, None, None, None
    if grad_permuted is None:  # permuted unused: only the probs' gradient flows
        n, h, dtype = ctx.permuted_meta
        grad_permuted = row_map.new_zeros((), dtype=dtype).expand(n, h)
    dtokens, dprobs = torch.ops.fk._moe_permute_backward(
        grad_permuted, grad_pp if want_probs else None, row_map)
    if want_probs and dprobs is None:  # permuted_probs unused
        dprobs = row_map.new_zeros(row_map.shape, dtype=ctx.probs_dtype)
    elif dprobs is not None:
        dprobs = dprobs.to(ctx.probs_dtype)
    return (dtokens if need[0] else None), None, dprobs, None, None


def _unpermute_setup(ctx, inputs, output):
    permuted, row_map, probs = inputs
    keep = probs is not None and ctx.needs_input_grad[2]
    # permuted is read by the backward only for the probs' gradient
    ctx.save_for_backward(permuted if keep else None, row_map, probs)
    ctx.permuted_meta = (permuted.shape[0], permuted.shape[1], permuted.dtype)


def _unpermute_backward(ctx, grad_out):
    permuted, row_map, probs = ctx.saved_tensors
    need = ctx.needs_input_grad
    want_probs = probs is not None and need[2]
    if not (need[0] or want_probs):
        return None, None, None
    if permuted is None:  # only its shape and dtype matter
        n, h, dtype = ctx.permuted_meta
        permuted = grad_out.new_zeros((), dtype=dtype).expand(n, h)
    dperm, dprobs = torch.ops.fk._moe_unpermute_backward(grad_out, permuted, row_map, probs,
                                                         want_probs)
    return (dperm if need[0] else None), None, dprobs


_permute_eager = _autograd.register("fk::moe_permute", _permute_backward, _permute_setup)
_unpermute_eager = _autograd.register("fk::moe_unpermute", _unpermute_backward,
                                      _unpermute_setup)
