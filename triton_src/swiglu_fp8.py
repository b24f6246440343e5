"""SwiGLU with an FP8 output (the format: python/fk/ops/fp8_quantize.py), plain and per
expert segment (MoE), and its backward with an optionally quantized input gradient.

x is (M, 2n) contiguous: row r holds gate[r, :n] then up[r, :n]. h = silu(gate) * up (times
the row's probability p[r] in the MoE form) is computed in fp32 and rounded once to x's
dtype; the quantized copies are the blockwise quantization of that rounded h.

swiglu_fp8_fwd_kernel: one program per tile of TILE_M rows x TILE_N columns of h (128; 64
    in the variants writing the column-wise copy alone: the row-wise copy's 1 x 128 blocks
    need 128), reading its gate and up tiles once. It writes the row-wise copy q (M, n) with
    scales s (cdiv(n, 128), M) (``want_row``), the column-wise copy qt (n, M) with scales st
    (rows of 128-row blocks, n) (``want_col``, TILE_M = 128) and h itself (``want_h``). With
    E == 0 the tiles are consecutive blocks of TILE_M rows. With E > 0 (the MoE form) tile
    rb is the rb-th 128-row block counting expert segment by segment: the segments are the E
    token counts tpe in order, segment e's blocks are st's rows blk_e ..
    blk_e + cdiv(M_e, 128) - 1 with blk_e = sum_{f<e} cdiv(M_f, 128), its last block is
    partial; programs past the last block see no rows (their scales read 1.0). Each program
    reads its block's rows from the table at blocks_ptr, which segment_blocks_kernel
    (_common.py, family moe_swiglu_fp8_blocks) writes from the counts on the device just
    before (no host sync); negative counts read as 0 and rows past M are never touched.
    PACKED (the aligned forms with TILE_M = 128; M % 4 == 0) reads a tile as four slabs of
    rows row0 + 4i + j and stores qt in 32-bit words of four rows' bytes
    (_common.fp8_store_packed): the same bytes. PACKED = 1 (the plain form) does so for
    every tile. PACKED = 2 (the MoE form, whose blocks start at any row) reads every block
    so and stores words for each block whose first row and end are multiples of 4: for
    every block when all counts are multiples of 4, as segments padded for FP8 GEMMs are;
    other blocks store qt's bytes slab by slab.
swiglu_fp8_bwd_q_kernel: the input gradient dx (M, 2n) of h = silu(gate) * up given dh
    (M, n), rounded to x's dtype and quantized in 1 x 128 blocks along 2n (q (M, 2n), s
    (2n / 128, M)) and / or as its transposed copy (qt (2n, M), st (cdiv(M, 128), 2n)). One
    program per TILE_M x 128 tile of dh writes the tile of the gate half and the tile of the
    up half; n must be a multiple of 128 (the C++ launcher checks), so that both are whole
    columns of blocks.
swiglu_fp8_dx_kernel: dx of h = silu(gate) * up * p (p = 1 without ``has_p``), ROWS rows per
    program in chunks of BLOCK_N columns, stored in x's dtype (``want_dx``) and / or rounded to
    it and quantized in 1 x 128 blocks along 2n (``want_q``: q (M, 2n), s (2n / 128, M);
    BLOCK_N = 128 and n a multiple of 128), and dp[r] = sum_j dh[r, j] * silu(gate[r, j]) *
    up[r, j] (fp32) with ``has_p``.

silu' = s + silu * (1 - s) with s = sigmoid(gate), as fk.swiglu's backward. Offsets are
int64. Masked elements of partial tiles read as 0 and are not stored. Built for sm_90 and
newer only (as fp8_quantize: sm_80 has no FP8 conversions).
"""
import triton
import triton.language as tl

from _common import (COPIES_BOTH, COPIES_COLS, COPIES_ROWS, DTYPES, FLAG_ALIGNED,
                     SEGMENT_BLOCKS, Variant, aligned_args, fp8_store_packed, fp8_store_rowwise,
                     fp8_store_tile, segment_block,
                     segment_blocks_kernel,  # noqa: F401 (a kernel of this op's variants)
                     segment_blocks_variants, sigmoid_approx)

TILE = 128


@triton.jit
def _gate_up(x_ptr, rows, cols, end, n):
    """The gate and up tiles of rows `rows` (< end), columns `cols` (< n), as stored; 0
    outside."""
    mask = (rows < end)[:, None] & (cols < n)[None, :]
    x_offs = rows[:, None] * (2 * n) + cols[None, :]
    return (tl.load(x_ptr + x_offs, mask=mask, other=0.0),
            tl.load(x_ptr + x_offs + n, mask=mask, other=0.0))


@triton.jit
def _h_of(g, u, p_ptr, h_ptr, rows, cols, end, n, has_p, want_h):
    """h = silu(g) * u (* p) of the tiles _gate_up read, rounded to h's dtype (stored when
    ``want_h``) and returned in that dtype."""
    g = g.to(tl.float32)
    h = g * sigmoid_approx(g) * u.to(tl.float32)
    if has_p != 0:
        h = h * tl.load(p_ptr + rows, mask=rows < end, other=0.0)[:, None]
    h = h.to(h_ptr.dtype.element_ty)
    if want_h != 0:
        tl.store(h_ptr + rows[:, None] * n + cols[None, :], h,
                 mask=(rows < end)[:, None] & (cols < n)[None, :])
    return h


@triton.jit
def _h_rows(x_ptr, p_ptr, h_ptr, rows, cols, end, n, has_p, want_h):
    """h = silu(gate) * up (* p) of rows `rows` (< end) and columns `cols` (< n), rounded to
    h's dtype (stored when ``want_h``) and returned in fp32; 0 outside."""
    g, u = _gate_up(x_ptr, rows, cols, end, n)
    return _h_of(g, u, p_ptr, h_ptr, rows, cols, end, n, has_p, want_h).to(tl.float32)


@triton.jit
def _tile_rows(blocks_ptr, rb, M, E, TILE_M: tl.constexpr):
    """(first row, end row) of row tile rb: consecutive tiles of TILE_M rows with E == 0,
    the rb-th 128-row block counted segment by segment with E > 0 (the table at blocks_ptr,
    _common.segment_blocks_kernel's)."""
    if E > 0:
        row0, end, _ = segment_block(blocks_ptr, rb)
    else:
        row0 = rb.to(tl.int64) * TILE_M
        end = M.to(tl.int64)
    return row0, end


@triton.jit
def _slab_rowwise(h, rows, cols, end, M, n, cb, q_ptr, s_ptr, pow2, want_row):
    """The row-wise copy of one slab's h (in h's dtype) when ``want_row``."""
    if want_row != 0:
        v = h.to(tl.float32)
        fp8_store_rowwise(v, tl.abs(v), rows, cols, M, n, cb, q_ptr, s_ptr, pow2, end)


@triton.jit
def _packed_tile(x_ptr, p_ptr, h_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, grp0, off, end, rb, cb, M,
                 n, has_p, want_row, want_col, want_h, pow2, words, TILE_M: tl.constexpr,
                 TILE_N: tl.constexpr):
    """The tile of rows 4 * grp0 + off + i (i < TILE_M; rows < end) and column block cb,
    read as four slabs of rows 4 * (grp0 + i) + off + j: every slab's gate and up are read
    before any is computed (left to the compiler, each slab's loads waited for the previous
    slab's arithmetic: 282.5 -> 209.9 us with 8 warps on an H200, benchmarks/NOTES.md v34),
    each slab's row-wise copy is stored once it is computed, and the slabs' h, held in h's
    dtype, are quantized column-wise by _common.fp8_store_packed (in words when ``words``),
    the scales in row rb of st."""
    grp = grp0 + tl.arange(0, TILE_M // 4)
    cols = cb.to(tl.int64) * TILE_N + tl.arange(0, TILE_N)
    r = 4 * grp + off
    g0, u0 = _gate_up(x_ptr, r, cols, end, n)
    g1, u1 = _gate_up(x_ptr, r + 1, cols, end, n)
    g2, u2 = _gate_up(x_ptr, r + 2, cols, end, n)
    g3, u3 = _gate_up(x_ptr, r + 3, cols, end, n)
    h0 = _h_of(g0, u0, p_ptr, h_ptr, r, cols, end, n, has_p, want_h)
    _slab_rowwise(h0, r, cols, end, M, n, cb, q_ptr, s_ptr, pow2, want_row)
    h1 = _h_of(g1, u1, p_ptr, h_ptr, r + 1, cols, end, n, has_p, want_h)
    _slab_rowwise(h1, r + 1, cols, end, M, n, cb, q_ptr, s_ptr, pow2, want_row)
    h2 = _h_of(g2, u2, p_ptr, h_ptr, r + 2, cols, end, n, has_p, want_h)
    _slab_rowwise(h2, r + 2, cols, end, M, n, cb, q_ptr, s_ptr, pow2, want_row)
    h3 = _h_of(g3, u3, p_ptr, h_ptr, r + 3, cols, end, n, has_p, want_h)
    _slab_rowwise(h3, r + 3, cols, end, M, n, cb, q_ptr, s_ptr, pow2, want_row)
    fp8_store_packed(h0.to(tl.float32), h1.to(tl.float32), h2.to(tl.float32),
                     h3.to(tl.float32), grp, off, cols, M, n, rb, cb, q_ptr, s_ptr, qt_ptr,
                     st_ptr, 0, want_col, pow2, end, words)


@triton.jit
def swiglu_fp8_fwd_kernel(x_ptr, p_ptr, blocks_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, h_ptr, M, n, E,
                          has_p, want_row, want_col, want_h, pow2, TILE_M: tl.constexpr,
                          TILE_N: tl.constexpr, PACKED: tl.constexpr = 0,
                          COPIES: tl.constexpr = 0, HAS_P: tl.constexpr = 0):
    if COPIES != 0:  # the variant's copies (COPIES_*), fixed at compile time
        want_row = COPIES != COPIES_COLS
        want_col = COPIES != COPIES_ROWS
    if HAS_P:  # the MoE form's variants: probs always given
        has_p = 1
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    if PACKED == 1:  # the plain form, M % 4 == 0: every tile's column-wise copy in words
        _packed_tile(x_ptr, p_ptr, h_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
                     rb.to(tl.int64) * (TILE_M // 4), 0, M, rb, cb, M, n, has_p, want_row,
                     want_col, want_h, pow2, 1, TILE_M, TILE_N)
    else:
        row0, end = _tile_rows(blocks_ptr, rb, M, E, TILE_M)
        if row0 < end:
            if PACKED == 2:
                # The MoE form, M % 4 == 0: read as slabs; the column-wise copy in words for a
                # block whose first row and end are multiples of 4 (every block of segments
                # padded to multiples of 4), as bytes for any other.
                # A segment's last block of at most half a tile (about half of them) is read
                # as half-height slabs: the same bytes for half the instructions.
                end = tl.minimum(end, row0 + TILE_M)
                words = ((row0 & 3) == 0) & ((end & 3) == 0)
                if end - row0 <= TILE_M // 2:
                    _packed_tile(x_ptr, p_ptr, h_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row0 >> 2,
                                 row0 & 3, end, rb, cb, M, n, has_p, want_row, want_col, want_h,
                                 pow2, words, TILE_M // 2, TILE_N)
                else:
                    _packed_tile(x_ptr, p_ptr, h_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row0 >> 2,
                                 row0 & 3, end, rb, cb, M, n, has_p, want_row, want_col, want_h,
                                 pow2, words, TILE_M, TILE_N)
            else:
                rows = row0 + tl.arange(0, TILE_M)
                cols = cb.to(tl.int64) * TILE_N + tl.arange(0, TILE_N)
                h = _h_rows(x_ptr, p_ptr, h_ptr, rows, cols, end, n, has_p, want_h)
                fp8_store_tile(h, rows, cols, rows < end, cols < n, q_ptr, s_ptr, qt_ptr,
                               st_ptr, M, n, cb, rb, want_row, want_col, pow2)
        elif want_col != 0:
            # A block past the last segment's (the grid has one a segment to spare): only its
            # column-wise scales, 1 as for all-zero blocks; the tile itself is skipped, where
            # it used to run every instruction under masks (a third of the programs when the
            # segments fill their blocks).
            cols = cb.to(tl.int64) * TILE_N + tl.arange(0, TILE_N)
            tl.store(st_ptr + rb * n + cols, tl.full([TILE_N], 1.0, tl.float32), mask=cols < n)


@triton.jit
def _swiglu_grads(dh, g, u):
    """(d gate, d up) of silu(g) * u given dh, fp32."""
    sg = sigmoid_approx(g)
    silu = g * sg
    return dh * u * (sg + silu * (1.0 - sg)), dh * silu


@triton.jit
def _grad_in(dh_ptr, x_ptr, rows, cols, M, n):
    """dh, gate and up of rows `rows` (< M), columns `cols` (< n), as stored; 0 outside."""
    mask = (rows < M)[:, None] & (cols < n)[None, :]
    x_offs = rows[:, None] * (2 * n) + cols[None, :]
    return (tl.load(dh_ptr + rows[:, None] * n + cols[None, :], mask=mask, other=0.0),
            tl.load(x_ptr + x_offs, mask=mask, other=0.0),
            tl.load(x_ptr + x_offs + n, mask=mask, other=0.0))


@triton.jit
def _grad_of(dh, g, u, dtype):
    """(d gate, d up) of the tiles _grad_in read, rounded to ``dtype`` and returned in it."""
    dg, du = _swiglu_grads(dh.to(tl.float32), g.to(tl.float32), u.to(tl.float32))
    return dg.to(dtype), du.to(dtype)


@triton.jit
def _grad_rows(dh_ptr, x_ptr, rows, cols, M, n):
    """(d gate, d up) of rows `rows` (< M), columns `cols` (< n), rounded to x's dtype and
    returned in fp32; 0 outside."""
    dh, g, u = _grad_in(dh_ptr, x_ptr, rows, cols, M, n)
    dg, du = _grad_of(dh, g, u, x_ptr.dtype.element_ty)
    return dg.to(tl.float32), du.to(tl.float32)


@triton.jit
def _grad_slab_rowwise(dg, du, rows, cols, M, K, cb, nb, q_ptr, s_ptr, pow2, want_row):
    """The row-wise copy of one slab's d gate (block cb) and d up (block nb + cb)."""
    _slab_rowwise(dg, rows, cols, M, M, K, cb, q_ptr, s_ptr, pow2, want_row)
    _slab_rowwise(du, rows, cols + K // 2, M, M, K, nb + cb, q_ptr, s_ptr, pow2, want_row)


@triton.jit
def swiglu_fp8_bwd_q_kernel(dh_ptr, x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, n, want_row,
                            want_col, pow2, TILE_M: tl.constexpr, TILE_N: tl.constexpr,
                            PACKED: tl.constexpr = 0, COPIES: tl.constexpr = 0):
    if COPIES != 0:  # the variant's copies (COPIES_*), fixed at compile time
        want_row = COPIES != COPIES_COLS
        want_col = COPIES != COPIES_ROWS
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    cols = cb.to(tl.int64) * TILE_N + tl.arange(0, TILE_N)
    K = 2 * n
    nb = n // TILE_N  # column blocks of one half
    if PACKED:
        # M % 4 == 0, TILE_M = 128: the tile as four slabs of rows 4 i + j, every slab's dh,
        # gate and up read before any is computed (as the forward's _packed_tile), the
        # column-wise copies of both halves in words.
        dtype = x_ptr.dtype.element_ty
        grp = rb.to(tl.int64) * (TILE_M // 4) + tl.arange(0, TILE_M // 4)
        r = 4 * grp
        h0, g0, u0 = _grad_in(dh_ptr, x_ptr, r, cols, M, n)
        h1, g1, u1 = _grad_in(dh_ptr, x_ptr, r + 1, cols, M, n)
        h2, g2, u2 = _grad_in(dh_ptr, x_ptr, r + 2, cols, M, n)
        h3, g3, u3 = _grad_in(dh_ptr, x_ptr, r + 3, cols, M, n)
        dg0, du0 = _grad_of(h0, g0, u0, dtype)
        _grad_slab_rowwise(dg0, du0, r, cols, M, K, cb, nb, q_ptr, s_ptr, pow2, want_row)
        dg1, du1 = _grad_of(h1, g1, u1, dtype)
        _grad_slab_rowwise(dg1, du1, r + 1, cols, M, K, cb, nb, q_ptr, s_ptr, pow2, want_row)
        dg2, du2 = _grad_of(h2, g2, u2, dtype)
        _grad_slab_rowwise(dg2, du2, r + 2, cols, M, K, cb, nb, q_ptr, s_ptr, pow2, want_row)
        dg3, du3 = _grad_of(h3, g3, u3, dtype)
        _grad_slab_rowwise(dg3, du3, r + 3, cols, M, K, cb, nb, q_ptr, s_ptr, pow2, want_row)
        fp8_store_packed(dg0.to(tl.float32), dg1.to(tl.float32), dg2.to(tl.float32),
                         dg3.to(tl.float32), grp, 0, cols, M, K, rb, cb, q_ptr, s_ptr, qt_ptr,
                         st_ptr, 0, want_col, pow2, M, 1)
        fp8_store_packed(du0.to(tl.float32), du1.to(tl.float32), du2.to(tl.float32),
                         du3.to(tl.float32), grp, 0, cols + n, M, K, rb, nb + cb, q_ptr, s_ptr,
                         qt_ptr, st_ptr, 0, want_col, pow2, M, 1)
    else:
        rows = rb.to(tl.int64) * TILE_M + tl.arange(0, TILE_M)
        dg, du = _grad_rows(dh_ptr, x_ptr, rows, cols, M, n)
        fp8_store_tile(dg, rows, cols, rows < M, cols < n, q_ptr, s_ptr, qt_ptr, st_ptr, M, K,
                       cb, rb, want_row, want_col, pow2)
        fp8_store_tile(du, rows, cols + n, rows < M, cols < n, q_ptr, s_ptr, qt_ptr, st_ptr, M,
                       K, nb + cb, rb, want_row, want_col, pow2)


@triton.jit
def swiglu_fp8_dx_kernel(dh_ptr, x_ptr, p_ptr, dx_ptr, dp_ptr, q_ptr, s_ptr, M, n, has_p,
                         want_dx, want_q, pow2, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    p = tl.load(p_ptr + rows, mask=rmask & (has_p != 0), other=1.0)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < n
        mask = rmask[:, None] & cmask[None, :]
        x_offs = rows[:, None] * (2 * n) + cols[None, :]
        dh = tl.load(dh_ptr + rows[:, None] * n + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        g = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + x_offs + n, mask=mask, other=0.0).to(tl.float32)
        dg, du = _swiglu_grads(dh * p[:, None], g, u)
        if want_dx != 0:
            tl.store(dx_ptr + x_offs, dg.to(dtype), mask=mask)
            tl.store(dx_ptr + x_offs + n, du.to(dtype), mask=mask)
        if want_q != 0:  # BLOCK_N == 128 and n % 128 == 0: each chunk is one block of a row
            blk = start // BLOCK_N
            fp8_store_tile(dg.to(dtype).to(tl.float32), rows, cols, rmask, cmask, q_ptr, s_ptr,
                       q_ptr, s_ptr, M, 2 * n, blk, 0, 1, 0, pow2)
            fp8_store_tile(du.to(dtype).to(tl.float32), rows, cols + n, rmask, cmask, q_ptr, s_ptr,
                       q_ptr, s_ptr, M, 2 * n, n // BLOCK_N + blk, 0, 1, 0, pow2)
        if has_p != 0:
            acc += dh * (g * sigmoid_approx(g)) * u
    tl.store(dp_ptr + rows, tl.sum(acc, axis=1), mask=rmask & (has_p != 0))


_FP8 = {"q_ptr": "*fp8e4nv", "qt_ptr": "*fp8e4nv", "s_ptr": "*fp32", "st_ptr": "*fp32"}
_FWD = ("x_ptr", "p_ptr", "blocks_ptr", "q_ptr", "s_ptr", "qt_ptr", "st_ptr", "h_ptr", "M", "n",
        "E", "has_p", "want_row", "want_col", "want_h", "pow2")
_BWD_Q = ("dh_ptr", "x_ptr", "q_ptr", "s_ptr", "qt_ptr", "st_ptr", "M", "n", "want_row",
          "want_col", "pow2")
_DX = ("dh_ptr", "x_ptr", "p_ptr", "dx_ptr", "dp_ptr", "q_ptr", "s_ptr", "M", "n", "has_p",
       "want_dx", "want_q", "pow2")
_TYPES = {**_FP8, "p_ptr": "*fp32", "dp_ptr": "*fp32", "blocks_ptr": "*i64", "M": "i64",
          "n": "i64", "E": "i64"}
# Row tiles: 32 rows where only the row-wise copy is written, 128 for the column-wise one.
TILES_M = (32, 128)
# MoE form with the column-wise copy: at most this many experts (segment_blocks_kernel's
# largest E_BLOCK; the C++ launcher checks).
MAX_EXPERTS = SEGMENT_BLOCKS[-1][0]
# Warps of the aligned MoE form (PACKED = 2): 65536 x 2 x 1408 bf16, 256 experts of 256 rows,
# both copies 634.9 us (the transposed tile at 8 warps) -> 498.6 on an H100; on an H200 the
# slab path took 511 us at 4 warps, 718 at 8 (benchmarks/NOTES.md v25); with the slabs all
# read first, 236.3 at 4 and 362.4 at 8 (v34).
MOE_PACKED_WARPS = 4
# The forward writing the column-wise copy alone (its blocks are 128 rows x 1 column), in the
# aligned variants: (TILE_N, warps) of its FLAG_COLS variants, 128 x 64 tiles at 4 warps (H200,
# JIT: 8192 x 2 x 14336 150.5 us against 174.8 for 128 x 128 at 8 warps; the MoE form at
# linghe's shape 173.8 against 188.1 at 4; tune_swiglu_fp8.py, benchmarks/NOTES.md v34).
FLAG_COLS = 2
COLS_TILE = (64, 4)
# The quantized backward's aligned 128-row tile as slabs (PACKED = 1): (warps for both copies,
# warps for the column-wise copy alone (FLAG_COLS)). H200, JIT, 8192 x 2 x 14336, the plain
# tile's best in brackets: both 478.6 us at 4 warps (621.2 at 8), column-wise 416.6 at 8
# (432.0 at 4) (tune_swiglu_fp8.py --pass bwd, benchmarks/NOTES.md v35).
BWD_PACKED_WARPS = (4, 8)
# dx kernel: tiles of DX_ROWS rows x DX_BLOCK columns (16 bytes per thread and load for 2-byte
# types with 4 warps), looped over n; the variant quantizing dx row-wise ("swiglu_fp8_dx_q")
# takes chunks of one block, 128 columns, over 8 rows.
DX_ROWS = 4
DX_BLOCK = 256
DX_Q_ROWS = 8


def _sig(args, dt, constexprs):
    sig = {a: _TYPES.get(a, "i32" if a.startswith(("has_", "want_", "pow2"))
                         else f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def _copies(tile_m, packed):
    """COPIES of a variant of form 0: the row-wise copy alone for 32-row tiles, both copies
    for the aligned (packed) 128-row ones (the column-wise copy alone has its own FLAG_COLS
    variants there), the arguments' for the rest."""
    return int(COPIES_ROWS) if tile_m != TILE else int(COPIES_BOTH) if packed else 0


def _fwd_variants(family, dt, block, sig, mn, flags, tile_m, packed, warps) -> list:
    """The forward's variants of one family, dtype and flags: 128 columns a tile at ``warps``
    and, where ``packed`` (the aligned variants), COLS_TILE's tiles for the column-wise copy
    alone (FLAG_COLS). The MoE family's (block MAX_EXPERTS) take probs as given (HAS_P)."""
    forms = [(0, TILE, warps, _copies(tile_m, packed))]
    if packed:
        forms.append((FLAG_COLS, *COLS_TILE, int(COPIES_COLS)))
    return [Variant(family=family, kernel="swiglu_fp8_fwd_kernel", dtype=dt, block=block,
                    signature=sig,
                    constexprs={"TILE_M": tile_m, "TILE_N": tile_n, "PACKED": packed,
                                "COPIES": copies, "HAS_P": int(block == MAX_EXPERTS)},
                    num_warps=w, flags=flags | form, divisible_by_16=mn)
            for form, tile_n, w, copies in forms]


def _bwd_q_variants(dt, sig, flags, tile_m, packed) -> list:
    """The quantized backward's variants of one dtype and flags: where ``packed`` (aligned,
    128 rows), the slab tile for both copies and for the column-wise copy alone (FLAG_COLS)."""
    if packed:
        forms = [(0, 1, BWD_PACKED_WARPS[0], int(COPIES_BOTH)),
                 (FLAG_COLS, 1, BWD_PACKED_WARPS[1], int(COPIES_COLS))]
    else:
        forms = [(0, 0, 8 if tile_m == TILE else 4, _copies(tile_m, packed))]
    return [Variant(family="swiglu_fp8_bwd_q", kernel="swiglu_fp8_bwd_q_kernel", dtype=dt,
                    block=tile_m, signature=sig,
                    constexprs={"TILE_M": tile_m, "TILE_N": TILE, "PACKED": p, "COPIES": copies},
                    num_warps=w, flags=flags | form,
                    divisible_by_16=aligned_args(sig, flags, ("M", "n")))
            for form, p, w, copies in forms]


def variants(arch: int) -> list:
    if arch < 89:  # no FP8 conversions before sm_89 (the sm_80 cubins serve all of 8.x)
        return []
    out = []
    for dt in DTYPES:
        fwd = _sig(_FWD, dt, ("TILE_M", "TILE_N", "PACKED", "COPIES", "HAS_P"))
        bwd_q = _sig(_BWD_Q, dt, ("TILE_M", "TILE_N", "PACKED", "COPIES"))
        dx = _sig(_DX, dt, ("ROWS", "BLOCK_N"))
        # FLAG_ALIGNED: M and n multiples of 16 and x 16-byte aligned (wide loads and stores).
        for flags in (0, FLAG_ALIGNED):
            mn = aligned_args(fwd, flags, ("M", "n"))
            for tile in TILES_M:
                # The aligned plain form with the column-wise copy stores it in words (H100,
                # JIT, the plain path's best in brackets: 8192 x 2 x 14336 both 513.8 (526.5)
                # us, column-wise 429.9 (463.2); 8192 x 2 x 1408 62.1 (67.8), 55.6 (59.3);
                # benchmarks/NOTES.md v18), at 8 warps since its slabs are all read first
                # (H200, JIT, 8192 x 2 x 14336: both 209.9 us at 8 warps, 238.0 at 4;
                # tune_swiglu_fp8.py, benchmarks/NOTES.md v34).
                packed = int(bool(flags) and tile == TILE)
                out += _fwd_variants("swiglu_fp8_fwd", dt, tile, fwd, mn, flags, tile, packed,
                                     8 if tile == TILE else 4)
                out += _bwd_q_variants(dt, bwd_q, flags, tile, packed)
            # The aligned MoE form stores words where the segments allow (PACKED = 2).
            out += _fwd_variants("moe_swiglu_fp8_fwd", dt, MAX_EXPERTS, fwd, mn, flags, TILE,
                                 2 if flags else 0, MOE_PACKED_WARPS if flags else 8)
            for fam, rows, block in (("swiglu_fp8_dx", DX_ROWS, DX_BLOCK),
                                     ("swiglu_fp8_dx_q", DX_Q_ROWS, TILE)):
                out.append(Variant(family=fam, kernel="swiglu_fp8_dx_kernel", dtype=dt,
                                   block=block, signature=dx,
                                   constexprs={"ROWS": rows, "BLOCK_N": block},
                                   num_warps=4, flags=flags,
                                   divisible_by_16=aligned_args(dx, flags, ("n",))))
    # The MoE form's table of blocks (the counts as int64, as the launcher passes them).
    return out + segment_blocks_variants("moe_swiglu_fp8_blocks", DTYPES, "*i64")
