"""Split of a fused QKV projection, per-head RMSNorm of q and k (qk-norm), rotate-half RoPE
and the transpose to the attention layout, in one pass over the projection.

Input: qkv, one row of (Hq + 2 Hkv) * D elements per token (last dim contiguous), at
``b * in_sb + s * in_ss``. Heads within a row (``GROUPED`` flag):
  grouped (Megatron): Hkv groups of [R = Hq / Hkv q heads, k, v];
  plain:              [q heads..., k heads..., v heads...].
Outputs q (Hq heads), k, v (Hkv heads), contiguous, as (B, S, H, D) or, with the
``OUT_BHSD`` flag, (B, H, S, D). Tokens t = s * B + b when the input is (S, B, ...)
(``TOKENS_SB``), else t = b * S + s.

q and k rows (``HAS_QW`` / ``HAS_KW``: with a norm weight; without, the row is not
normalized): n = round(round(x * rstd) * w), rstd = 1 / sqrt(mean(x^2) + eps) in fp32 (Hugging
Face's Qwen3 / OLMo 2 RMSNorm: the normalized row cast to the input dtype, times the weight
in the input dtype); then the rotation of fk.rope (triton_src/rope.py) on the first
2 * half dims, pairs (i, i + half), in fp32 and rounded once:
    o1 = n1 * c1 - n2 * s1,  o2 = n2 * c2 + n1 * s2,
with c2 / s2 at ``c2_off`` past c1 / s1 (half for cos of width rotary_dim, 0 for cos of width
rotary_dim / 2). Dims 2 * half .. D pass through (normalized). v rows are copied.

Backward: dn = the transposed rotation of the output gradient (d1 = g1 c1 + g2 s2,
d2 = g2 c2 - g1 s1), then the RMSNorm backward with rstd recomputed from the saved qkv:
dx = rstd * (dn w - x_hat * mean(dn w x_hat)); dw partials sum dn * round(x_hat) in fp32 per
program (its row of (programs, 2 D): q's weight, then k's; one rms_norm_dw launch sums both).
v rows copy their gradient. Every element of dqkv is written.

Work split: a tile is BT tokens by BH heads of one kind (q, k or v). The forward runs one
tile per program, tiles ordered [token block][q head blocks..., k head blocks..., v head
blocks...] (heads fastest: input memory order). The backward runs a persistent grid over
blocks of BT tokens, each program taking every head of its blocks BH at a time (q, k, then
v): the block's cos / sin are loaded once, its q and k weight-gradient terms are summed
elementwise and reduced once a block, and each head block's rotating halves are loaded
while the previous one is computed. Rows are read in chunks of HB columns (the two rotating
halves, then the pass-through dims). Offsets are int64.
"""
import triton
import triton.language as tl

from _common import (DTYPES, FLAG_ALIGNED, FLAG_ROWS16, Variant, aligned_args, rms_normalize,
                     round_to)

FLAG_COS_FP32 = 2  # cos / sin are float32 (otherwise they have qkv's dtype)

# Bits of the run-time ``mode`` argument (csrc/ops/qkv_split_norm_rope/*_cuda.cpp); ``.value``
# gives the int.
GROUPED = tl.constexpr(1)
TOKENS_SB = tl.constexpr(2)
OUT_BHSD = tl.constexpr(4)
HAS_QW = tl.constexpr(8)
HAS_KW = tl.constexpr(16)


@triton.jit
def _tile(tile, B, S, Hq, Hkv, D, in_sb, in_ss, mode, BT: tl.constexpr, BH: tl.constexpr):
    """Tile ``tile``'s kind (0 q, 1 k, 2 v), input row offsets, output row offsets (in
    elements, [BT, BH]), row mask, token positions (b, s) and token mask [BT]."""
    nqb = tl.cdiv(Hq, BH)
    nkb = tl.cdiv(Hkv, BH)
    nblk = nqb + 2 * nkb
    tb = tile // nblk
    blk = tile % nblk
    kind = tl.where(blk < nqb, 0, tl.where(blk < nqb + nkb, 1, 2))
    hb = blk - tl.where(kind == 0, 0, tl.where(kind == 1, nqb, nqb + nkb))
    b, s, b64, s64, tok_in, tmask = _token_block(tb, B, S, in_sb, in_ss, mode, BT)
    h = hb * BH + tl.arange(0, BH)
    nh = tl.where(kind == 0, Hq, Hkv)
    r = Hq // Hkv
    if (mode & GROUPED) != 0:
        src = tl.where(kind == 0, (h // r) * (r + 2) + h % r, h * (r + 2) + r + (kind - 1))
    else:
        src = tl.where(kind == 0, h, Hq + (kind - 1) * Hkv + h)
    tok_out, h_step = _tokens_out(b64, s64, S, nh, D, mode)
    in_rows, out_rows, mask = _head_rows(h, src, h < nh, tok_in, tok_out, h_step, tmask, D)
    return kind, in_rows, out_rows, mask, b, s, tmask


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, b, s, cos_sb, cos_ss, half, c2_off, tmask,
             HB: tl.constexpr):
    """c1, c2, s1, s2 [BT, 1, HB] in fp32 for pairs 0 .. HB of tokens (b, s)."""
    rows = b.to(tl.int64) * cos_sb + s.to(tl.int64) * cos_ss
    pairs = tl.arange(0, HB)
    # loaded as [BT, 1, HB] tiles: an expanded [BT, HB] tile is converted to the rows' layout
    # through shuffles
    m = tmask[:, None, None] & (pairs < half)[None, None, :]
    at = rows[:, None, None] + pairs[None, None, :]
    c1 = tl.load(cos_ptr + at, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + at + c2_off, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + at, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + at + c2_off, mask=m, other=0.0).to(tl.float32)
    return c1, c2, s1, s2


@triton.jit
def _chunk(ptr, rows, mask, c0, end, HB: tl.constexpr):
    """Columns c0 .. c0 + HB (below ``end``) of rows [BT, BH]: (pointers, mask, fp32 values)."""
    cols = c0 + tl.arange(0, HB)
    m = mask[:, :, None] & (cols < end)[None, None, :]
    p = ptr + rows[:, :, None] + cols[None, None, :]
    return p, m, tl.load(p, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _weight(w_ptr, c0, end, BT: tl.constexpr, BH: tl.constexpr, HB: tl.constexpr):
    """Weight columns c0 .. c0 + HB (below ``end``) in fp32 as a [BT, BH, HB] tile. The
    backward loads it at its rows' shape, so in their layout (loaded as HB values and
    expanded, it went through shared memory each time; the repeated loads hit L1); the
    forward as [1, 1, HB], which it broadcasts."""
    cols = tl.broadcast_to(c0 + tl.arange(0, HB)[None, None, :], (BT, BH, HB))
    return tl.load(w_ptr + cols, mask=cols < end, other=0.0).to(tl.float32)


@triton.jit
def _normed(x, rstd, w_ptr, c0, end, do_norm, dtype, HB: tl.constexpr):
    """round(round(x * rstd) * w) in fp32 (x itself when do_norm is 0)."""
    if do_norm != 0:
        w = _weight(w_ptr, c0, end, 1, 1, HB)
        x = round_to(rms_normalize(x, rstd, 1, dtype) * w, dtype)
    return x


@triton.jit
def _copy_rows(src_ptr, src_rows, dst_ptr, dst_rows, mask, D, HB: tl.constexpr):
    for c0 in range(0, D, HB):
        cols = c0 + tl.arange(0, HB)
        m = mask[:, :, None] & (cols < D)[None, None, :]
        x = tl.load(src_ptr + src_rows[:, :, None] + cols[None, None, :], mask=m)
        tl.store(dst_ptr + dst_rows[:, :, None] + cols[None, None, :], x, mask=m)


@triton.jit
def qkv_split_norm_rope_fwd_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
                                   vo_ptr, in_sb, in_ss, cos_sb, cos_ss, B, S, Hq, Hkv, D,
                                   half, c2_off, mode, eps, HB: tl.constexpr,
                                   BT: tl.constexpr, BH: tl.constexpr,
                                   COS_FIRST: tl.constexpr):
    dtype = qo_ptr.dtype.element_ty
    kind, in_rows, out_rows, mask, b, s, tmask = _tile(tl.program_id(0), B, S, Hq, Hkv, D, in_sb, in_ss,
                                                mode, BT, BH)
    out_ptr = tl.where(kind == 0, qo_ptr, tl.where(kind == 1, ko_ptr, vo_ptr))
    if kind == 2:
        _copy_rows(qkv_ptr, in_rows, out_ptr, out_rows, mask, D, HB)
    else:
        rot = 2 * half
        w_ptr = tl.where(kind == 0, qw_ptr, kw_ptr)
        do_norm = tl.where(kind == 0, mode & HAS_QW, mode & HAS_KW)
        if COS_FIRST:
            # cos / sin (L2-resident: every head of a token reads them) in flight with the
            # rows rather than after the rows' statistics.
            c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, b, s, cos_sb, cos_ss, half, c2_off,
                                      tmask, HB)
        _p1, m1, x1 = _chunk(qkv_ptr, in_rows, mask, 0, half, HB)
        _p2, m2, x2 = _chunk(qkv_ptr, in_rows + half, mask, 0, half, HB)
        rstd = tl.zeros((BT, BH), dtype=tl.float32)
        if do_norm != 0:
            ss = tl.sum(x1 * x1 + x2 * x2, axis=2)
            for c0 in range(rot, D, HB):
                _p, _m, x = _chunk(qkv_ptr, in_rows, mask, c0, D, HB)
                ss += tl.sum(x * x, axis=2)
            rstd = 1.0 / tl.sqrt(ss / D + eps)
        rstd = rstd[:, :, None]
        n1 = _normed(x1, rstd, w_ptr, 0, half, do_norm, dtype, HB)
        n2 = _normed(x2, rstd, w_ptr + half, 0, half, do_norm, dtype, HB)
        if not COS_FIRST:
            c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, b, s, cos_sb, cos_ss, half, c2_off,
                                      tmask, HB)
        o1 = n1 * c1 - n2 * s1
        o2 = n2 * c2 + n1 * s2
        cols = tl.arange(0, HB)[None, None, :]
        tl.store(out_ptr + out_rows[:, :, None] + cols, o1.to(dtype), mask=m1)
        tl.store(out_ptr + out_rows[:, :, None] + half + cols, o2.to(dtype), mask=m2)
        for c0 in range(rot, D, HB):
            _p, m, x = _chunk(qkv_ptr, in_rows, mask, c0, D, HB)
            n = _normed(x, rstd, w_ptr, c0, D, do_norm, dtype, HB)
            tl.store(out_ptr + out_rows[:, :, None] + c0 + cols, n.to(dtype), mask=m)


@triton.jit
def _token_block(tb, B, S, in_sb, in_ss, mode, BT: tl.constexpr):
    """Token block tb's positions b, s [BT] (also as int64 [BT, 1]), its input row offsets
    [BT, 1] (elements) and its token mask [BT]."""
    t = tb * BT + tl.arange(0, BT)
    tmask = t < B * S
    if (mode & TOKENS_SB) != 0:
        s = t // B
        b = t % B
    else:
        b = t // S
        s = t % S
    b64 = b.to(tl.int64)[:, None]
    s64 = s.to(tl.int64)[:, None]
    return b, s, b64, s64, b64 * in_sb + s64 * in_ss, tmask


@triton.jit
def _tokens_out(b64, s64, S, nh, D, mode):
    """Output row offsets [BT, 1] of head 0 of a token block (_token_block) in an output of
    nh heads, and the step from one head to the next."""
    # one expression for both layouts (a branch here hides the rows' alignment from the
    # stores, which then write one element at a time)
    bhsd = (mode & OUT_BHSD) != 0
    s_step = tl.where(bhsd, 1, nh).to(tl.int64) * D
    h_step = tl.where(bhsd, S, 1).to(tl.int64) * D
    return b64 * nh * S * D + s64 * s_step, h_step


@triton.jit
def _head_rows(h, src, hmask, tok_in, tok_out, h_step, tmask, D):
    """Heads h [BH] (at heads src of the input rows; hmask: those that exist) of a token
    block: input row offsets, output row offsets (elements, [BT, BH]) and row mask."""
    in_rows = tok_in + src.to(tl.int64)[None, :] * D
    out_rows = tok_out + h.to(tl.int64)[None, :] * h_step
    return in_rows, out_rows, tmask[:, None] & hmask[None, :]


@triton.jit
def _heads(kind: tl.constexpr, i, Hq, Hkv, r, nj, grouped, BH: tl.constexpr):
    """Block i of BH heads of one kind (0 q, 1 k, 2 v): the heads [BH], where they sit in the
    input row and which exist. q heads go group by group, nj blocks a group of r (one scalar
    division a block): heads g r .. g r + r - 1 sit at g (r + 2) .. in the grouped input."""
    if kind == 0:
        g = i // nj
        j = (i - g * nj) * BH + tl.arange(0, BH)
        h = g * r + j
        return h, tl.where(grouped, g * (r + 2) + j, h), j < r
    else:
        h = i * BH + tl.arange(0, BH)
        src = tl.where(grouped, h * (r + 2) + r + (kind - 1), Hq + (kind - 1) * Hkv + h)
        return h, src, h < Hkv


@triton.jit
def _heads_in(g_ptr, qkv_ptr, in_rows, out_rows, mask, half, do_norm, HB: tl.constexpr):
    """The rotating halves of one [BT, BH] block of q or k rows as stored: the output
    gradient's g1, g2 and (when ``do_norm``; else zeros, unread) the input's x1, x2."""
    cols = tl.arange(0, HB)[None, None, :]
    m = mask[:, :, None] & (cols < half)
    go = g_ptr + out_rows[:, :, None] + cols
    xo = qkv_ptr + in_rows[:, :, None] + cols
    mx = m & (do_norm != 0)
    return (tl.load(go, mask=m, other=0.0), tl.load(go + half, mask=m, other=0.0),
            tl.load(xo, mask=mx, other=0.0), tl.load(xo + half, mask=mx, other=0.0))


@triton.jit
def _bwd_heads(g1, g2, x1, x2, g_ptr, qkv_ptr, dqkv_ptr, w_ptr, dw_row, in_rows, out_rows, mask,
               c1, c2, s1, s2, a1, a2, D, half, eps, do_norm, dtype, HB: tl.constexpr):
    """The backward of one [BT, BH] block of q or k rows, given its rotating halves
    (_heads_in): dqkv at in_rows; returns the weight-gradient accumulators a1, a2
    ([BT, 1, HB], the rotating halves) with this block's dn * round(x_hat) summed over its
    heads added; the pass-through dims' sums go to dw_row in memory."""
    rot = 2 * half
    cols = tl.arange(0, HB)
    m1 = mask[:, :, None] & (cols < half)[None, None, :]  # either half's
    g1 = g1.to(tl.float32)
    g2 = g2.to(tl.float32)
    # The gradient of the normalized row: the transposed rotation.
    d1 = g1 * c1 + g2 * s2
    d2 = g2 * c2 - g1 * s1
    dst = dqkv_ptr + in_rows[:, :, None] + cols[None, None, :]
    if do_norm != 0:
        v1 = x1.to(tl.float32)
        v2 = x2.to(tl.float32)
        # the weight from L1 each block: held across the loop it took 4 HB / 8 registers
        dw1 = d1 * _weight(w_ptr, 0, half, x1.shape[0], x1.shape[1], HB)
        dw2 = d2 * _weight(w_ptr + half, 0, half, x1.shape[0], x1.shape[1], HB)
        ss = tl.sum(v1 * v1 + v2 * v2, axis=2)
        dot = tl.sum(dw1 * v1 + dw2 * v2, axis=2)
        for c0 in range(rot, D, HB):
            _p, _m, x = _chunk(qkv_ptr, in_rows, mask, c0, D, HB)
            _p, _m, g = _chunk(g_ptr, out_rows, mask, c0, D, HB)
            ss += tl.sum(x * x, axis=2)
            dot += tl.sum(g * _weight(w_ptr, c0, D, x.shape[0], x.shape[1], HB) * x, axis=2)
        rstd = 1.0 / tl.sqrt(ss / D + eps)
        # dx = rstd * (dn w - x_hat * mean(dn w x_hat)) = rstd * dn w - x * k with
        # k = rstd^3 * mean(dn w x): two operations an element once dn w is formed
        r3 = rstd[:, :, None]
        k3 = (rstd * rstd * rstd * (dot / D))[:, :, None]
        tl.store(dst, (r3 * dw1 - v1 * k3).to(dtype), mask=m1)
        tl.store(dst + half, (r3 * dw2 - v2 * k3).to(dtype), mask=m1)
        a1 += tl.sum(d1 * rms_normalize(v1, r3, 1, dtype), axis=1, keep_dims=True)
        a2 += tl.sum(d2 * rms_normalize(v2, r3, 1, dtype), axis=1, keep_dims=True)
        for c0 in range(rot, D, HB):
            _p, m, x = _chunk(qkv_ptr, in_rows, mask, c0, D, HB)
            _p, _m, g = _chunk(g_ptr, out_rows, mask, c0, D, HB)
            w = _weight(w_ptr, c0, D, x.shape[0], x.shape[1], HB)
            tl.store(dst + c0, (r3 * (g * w) - x * k3).to(dtype), mask=m)
            pc = c0 + cols
            part = tl.sum(tl.sum(g * rms_normalize(x, r3, 1, dtype), axis=1), axis=0)
            acc = tl.load(dw_row + pc, mask=pc < D, other=0.0)
            tl.store(dw_row + pc, acc + part, mask=pc < D)
    else:
        tl.store(dst, d1.to(dtype), mask=m1)
        tl.store(dst + half, d2.to(dtype), mask=m1)
        for c0 in range(rot, D, HB):
            _p, m, g = _chunk(g_ptr, out_rows, mask, c0, D, HB)
            tl.store(dst + c0, g.to(dtype), mask=m)
    return a1, a2


@triton.jit
def _bwd_kind(kind: tl.constexpr, g_ptr, qkv_ptr, dqkv_ptr, w_ptr, dw_row, tok_in, b64, s64,
              tmask, c1, c2, s1, s2, S, Hq, Hkv, D, r, grouped, half, eps, do_norm, mode, dtype,
              BT: tl.constexpr, BH: tl.constexpr, HB: tl.constexpr):
    """The backward of a token block's q (kind 0) or k (1) heads, BH at a time, each block's
    rotating halves loaded while the previous block is computed. Returns the rotating
    halves' weight-gradient terms summed over the token block's heads ([HB] each)."""
    nh = Hq if kind == 0 else Hkv
    nj = tl.cdiv(r, BH)  # blocks of BH q heads a group
    n = Hkv * nj if kind == 0 else tl.cdiv(Hkv, BH)
    tok_out, h_step = _tokens_out(b64, s64, S, nh, D, mode)
    a1 = tl.zeros((BT, 1, HB), dtype=tl.float32)
    a2 = tl.zeros((BT, 1, HB), dtype=tl.float32)
    h, src, hm = _heads(kind, 0, Hq, Hkv, r, nj, grouped, BH)
    in_rows, out_rows, mask = _head_rows(h, src, hm, tok_in, tok_out, h_step, tmask, D)
    n1, n2, n3, n4 = _heads_in(g_ptr, qkv_ptr, in_rows, out_rows, mask, half, do_norm, HB)
    for i in range(0, n):
        g1, g2, x1, x2 = n1, n2, n3, n4
        ci, co, cm = in_rows, out_rows, mask
        h, src, hm = _heads(kind, i + 1, Hq, Hkv, r, nj, grouped, BH)
        in_rows, out_rows, mask = _head_rows(h, src, hm & (i + 1 < n), tok_in, tok_out,
                                             h_step, tmask, D)
        n1, n2, n3, n4 = _heads_in(g_ptr, qkv_ptr, in_rows, out_rows, mask, half, do_norm, HB)
        a1, a2 = _bwd_heads(g1, g2, x1, x2, g_ptr, qkv_ptr, dqkv_ptr, w_ptr, dw_row, ci, co, cm,
                            c1, c2, s1, s2, a1, a2, D, half, eps, do_norm, dtype, HB)
    return tl.sum(tl.sum(a1, axis=1), axis=0), tl.sum(tl.sum(a2, axis=1), axis=0)


@triton.jit
def qkv_split_norm_rope_bwd_kernel(dqo_ptr, dko_ptr, dvo_ptr, qkv_ptr, qw_ptr, kw_ptr, cos_ptr,
                                   sin_ptr, dqkv_ptr, dw_ptr, in_sb, in_ss, cos_sb, cos_ss, B,
                                   S, Hq, Hkv, D, half, c2_off, mode, eps, HB: tl.constexpr,
                                   BT: tl.constexpr, BH: tl.constexpr):
    """Persistent over token blocks: program p walks blocks p, p + P, ... of BT tokens, each
    through all its heads, BH at a time (q, then k, then v), with the block's cos / sin
    loaded once. Its fp32 dw partials go to row p of dw_ptr ((P, 2 D): q's weight in columns
    0 .. D, k's in D .. 2 D, each written whenever the weight exists), so that one launch
    sums both; those of the rotating halves are summed over a block's heads elementwise and
    reduced once per block and kind."""
    dtype = dqkv_ptr.dtype.element_ty
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblocks = tl.cdiv(B * S, BT)
    rot = 2 * half
    cols = tl.arange(0, HB)
    has_qw = mode & HAS_QW
    has_kw = mode & HAS_KW
    grouped = (mode & GROUPED) != 0
    r = Hq // Hkv
    aq1 = tl.zeros((HB,), dtype=tl.float32)
    aq2 = tl.zeros((HB,), dtype=tl.float32)
    ak1 = tl.zeros((HB,), dtype=tl.float32)
    ak2 = tl.zeros((HB,), dtype=tl.float32)
    # Partials of the pass-through dims (D > rotary_dim) accumulate in the program's own
    # row in memory.
    dqw_row = dw_ptr + pid.to(tl.int64) * (2 * D)
    dkw_row = dqw_row + D
    for c0 in range(rot, D, HB):
        pc = c0 + cols
        tl.store(dqw_row + pc, tl.zeros((HB,), dtype=tl.float32),
                 mask=(pc < D) & (has_qw != 0))
        tl.store(dkw_row + pc, tl.zeros((HB,), dtype=tl.float32),
                 mask=(pc < D) & (has_kw != 0))
    for tb in range(pid, nblocks, nprog):
        b, s, b64, s64, tok_in, tmask = _token_block(tb, B, S, in_sb, in_ss, mode, BT)
        c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, b, s, cos_sb, cos_ss, half, c2_off,
                                  tmask, HB)
        p1, p2 = _bwd_kind(0, dqo_ptr, qkv_ptr, dqkv_ptr, qw_ptr, dqw_row, tok_in, b64, s64,
                           tmask, c1, c2, s1, s2, S, Hq, Hkv, D, r, grouped, half, eps, has_qw,
                           mode, dtype, BT, BH, HB)
        aq1 += p1
        aq2 += p2
        p1, p2 = _bwd_kind(1, dko_ptr, qkv_ptr, dqkv_ptr, kw_ptr, dkw_row, tok_in, b64, s64,
                           tmask, c1, c2, s1, s2, S, Hq, Hkv, D, r, grouped, half, eps, has_kw,
                           mode, dtype, BT, BH, HB)
        ak1 += p1
        ak2 += p2
        # v heads: a copy
        tok_out, h_step = _tokens_out(b64, s64, S, Hkv, D, mode)
        for i in range(0, tl.cdiv(Hkv, BH)):
            h, src, hm = _heads(2, i, Hq, Hkv, r, 1, grouped, BH)
            in_rows, out_rows, mask = _head_rows(h, src, hm, tok_in, tok_out, h_step, tmask, D)
            _copy_rows(dvo_ptr, out_rows, dqkv_ptr, in_rows, mask, D, HB)
    tl.store(dqw_row + cols, aq1, mask=(cols < half) & (has_qw != 0))
    tl.store(dqw_row + half + cols, aq2, mask=(cols < half) & (has_qw != 0))
    tl.store(dkw_row + cols, ak1, mask=(cols < half) & (has_kw != 0))
    tl.store(dkw_row + half + cols, ak2, mask=(cols < half) & (has_kw != 0))


FWD_ARGS = ("qkv_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "qo_ptr", "ko_ptr", "vo_ptr",
            "in_sb", "in_ss", "cos_sb", "cos_ss", "B", "S", "Hq", "Hkv", "D", "half", "c2_off",
            "mode", "eps")
BWD_ARGS = ("dqo_ptr", "dko_ptr", "dvo_ptr", "qkv_ptr", "qw_ptr", "kw_ptr", "cos_ptr",
            "sin_ptr", "dqkv_ptr", "dw_ptr", "in_sb", "in_ss", "cos_sb", "cos_ss",
            "B", "S", "Hq", "Hkv", "D", "half", "c2_off", "mode", "eps")
_TYPES = {"in_sb": "i64", "in_ss": "i64", "cos_sb": "i64", "cos_ss": "i64", "eps": "fp32",
          "dw_ptr": "*fp32"}
# Divisible by 16 in the aligned variants (with every pointer).
# c2_off is 0 or half, so a multiple of 16 wherever half is (without the hint c2 / s2 load one
# element at a time).
_ALIGNED = ("in_sb", "in_ss", "cos_sb", "cos_ss", "D", "half", "c2_off")

# Per half block HB (the smallest power of 2 >= rotary_dim / 2), forward: (BT tokens, BH
# heads, warps, COS_FIRST); backward: (BT, BH, warps), a persistent grid of 8 warps of
# programs per multiprocessor (the CUDA side). A tile is BT * BH rows of 2 * HB elements.
# Timed at HB 64 (Qwen3-30B-A3B heads, 8192 tokens, benchmarks/NOTES.md v22, v27, v33, v34):
# the forward's (16, 2, 4) with cos / sin loaded first was the fastest of the library's
# variants on the H100 (62.1 us GPU) and the H200 (50.7 us); a JIT sweep with 4 and 8 heads a
# tile put (8, 4, 4) ahead of it on the H200 (52.6 against 54.3 us; the library 50.5 -> 49.4);
# the backward's (4, 2, 1) is the fastest of a sweep on the H200 (83.8 us, JIT, against 100.3
# for the previous kernel at its (8, 2, 1)).
# The other half blocks keep the forward's tiles of the first sweep, untimed; the backward's
# hold the same 2 * 512 elements a warp as HB 64's (its registers are near the 255 limit).
FWD_TILES = {16: (64, 2, 4, 0), 32: (32, 2, 4, 0), 64: (8, 4, 4, 1), 128: (8, 2, 4, 0)}
BWD_TILES = {16: (16, 2, 1), 32: (8, 2, 1), 64: (4, 2, 1), 128: (2, 2, 1)}


def _cos_dtypes(dt):
    return (dt,) if dt == "fp32" else (dt, "fp32")


def _signature(args, dt, cos_dt):
    """Triton types of a kernel's runtime arguments for data of `dt` and cos / sin of `cos_dt`."""
    sig = {}
    for a in args:
        if a in _TYPES:
            sig[a] = _TYPES[a]
        elif a in ("cos_ptr", "sin_ptr"):
            sig[a] = f"*{cos_dt}"
        elif a.endswith("_ptr"):
            sig[a] = f"*{dt}"
        else:
            sig[a] = "i32"
    return sig


def variants(arch: int) -> list:
    out = []
    for family, kernel, args, tiles in (
            ("qkv_split_norm_rope_fwd", "qkv_split_norm_rope_fwd_kernel", FWD_ARGS, FWD_TILES),
            ("qkv_split_norm_rope_bwd", "qkv_split_norm_rope_bwd_kernel", BWD_ARGS, BWD_TILES)):
        for dt in DTYPES:
            for cos_dt in _cos_dtypes(dt):
                base = _signature(args, dt, cos_dt)
                # FLAG_ROWS16: S a multiple of 16, hinted (H200, the benchmark's shape:
                # forward 94.8 -> 77.6 us under the JIT).
                for aligned in (0, FLAG_ALIGNED, FLAG_ALIGNED | FLAG_ROWS16):
                    hints = _ALIGNED + (("S",) if aligned & FLAG_ROWS16 else ())
                    divisible = aligned_args(base, aligned, hints)
                    flags = aligned | (FLAG_COS_FP32 if cos_dt != dt else 0)
                    for hb, (bt, bh, warps, *cos_first) in tiles.items():
                        cx = {"HB": hb, "BT": bt, "BH": bh}
                        if cos_first:
                            cx["COS_FIRST"] = cos_first[0]
                        sig = {**base, **{c: "constexpr" for c in cx}}
                        out.append(Variant(family=family, kernel=kernel, dtype=dt, block=hb,
                                           signature=sig, constexprs=cx, num_warps=warps,
                                           flags=flags, divisible_by_16=divisible))
    return out
