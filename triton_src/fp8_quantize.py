"""Blockwise FP8 (float8_e4m3fn) quantization; the format is defined once, in
python/fk/ops/fp8_quantize.py.

x is an (M, K) contiguous matrix. One program quantizes one TILE_M x TILE_K tile of x, read
once (128 x 128; 32 x 128 for the row-wise copy of 1 x 128 blocks alone, 128 x 32 or 128 x 64
for the column-wise one alone; FORMS and PACKED_FORMS; the launcher reads the tile from the
variant):

  blocks of 1 x 128 (``weight == 0``): each row of the tile is one block. The row-wise copy
      q (M, K) gets the row blocks' scales at s[j, i] (scales (cdiv(K, 128), M)); the
      column-wise copy qt (K, M) = quantize(x^T) treats each column of the tile as one
      block, scales at st[j, k] (scales (cdiv(M, 128), K)).
  blocks of 128 x 128 (``weight == 1``): the tile is one block; q (M, K) with s[i, j]
      (scales (cdiv(M, 128), cdiv(K, 128))), and qt = q^T with st = s^T.

``want_row`` / ``want_col`` choose which copies are written. The aligned variants of the
1 x 128 forms with a column-wise copy (PACKED = 1) and of 128 x 128 blocks (PACKED = 2) read
the tile as four slabs of interleaved rows and store the column-wise copy as 32-bit words of
four rows' float8 bytes: the same bytes, with a quarter as many elements through the
transpose (for 128 x 128 blocks, none through tl.trans). The one writing both copies of
1 x 128 blocks also has a form over a persistent grid, each program loading its next tile
while it quantizes the current one (PERSISTENT), built as its variant for GPUs of less than
4 TB/s (FLAG_LOW_BANDWIDTH).

Scale of a block with amax a = max |x|: s = max(a / 448, 2^-126) (a correctly rounded fp32
division), 1.0 for an all-zero block, rounded up to a power of two when ``pow2 != 0``, NaN
when the block holds an inf or a NaN.
q = x * r with r = 1 / s (one correctly rounded reciprocal per block, then one multiply an
element: a division per element cost half the kernel's time), clamped to [-448, 448] (NaN
stays NaN), then rounded to the output element type by the store: to nearest even with
float8_e4m3fn outputs (the kernel is also run with float32 outputs under the interpreter,
which tests everything up to that cast). Masked elements of partial tiles read as 0 and are
not stored.

The FP8 variants are built for sm_90 and newer only: 8.x GPUs run the sm_80 cubins, and
sm_80 has no FP8 conversions.
"""
import triton
import triton.language as tl

from _common import (COPIES_BOTH, COPIES_COLS, COPIES_ROWS, DTYPES, FLAG_ALIGNED,
                     FLAG_LOW_BANDWIDTH, Variant, aligned_args, fp8_amax, fp8_store_1x128,
                     fp8_store_packed, fp8_word, max_nan)
from _common import fp8_quantize_values as _quantize
from _common import fp8_scale as _scale

TILE = 128
# Variant flags: the tile of a form of the op (the kernel takes any TILE_M x TILE_K whose
# blocks' 128 elements lie in one program: TILE_K = 128 for row-wise 1 x 128 blocks,
# TILE_M = 128 for column-wise ones, both for 128 x 128 blocks).
FLAG_ROWS = 2  # 1 x 128 blocks, the row-wise copy alone
FLAG_COLS = 4  # 1 x 128 blocks, the column-wise copy alone
FLAG_WEIGHT = 8  # 128 x 128 blocks
# The copies each form's variants write, fixed at compile time (the weight's: the arguments').
FORM_COPIES = {0: COPIES_BOTH.value, FLAG_ROWS: COPIES_ROWS.value, FLAG_COLS: COPIES_COLS.value,
               FLAG_WEIGHT: 0}
# (flags, TILE_M, TILE_K, warps) per form; no flag: 1 x 128 blocks, both copies. From
# benchmarks/tune_fp8_quantize.py on an H100 at 8192 x 4096 bf16 (benchmarks/NOTES.md v14).
FORMS = ((0, 128, 128, 8), (FLAG_ROWS, 32, 128, 4), (FLAG_COLS, 128, 32, 4),
         (FLAG_WEIGHT, 128, 128, 8))
# The aligned variants (M a multiple of 16) of these forms read the tile as four slabs and
# write the column-wise copy in 32-bit words (PACKED: 1 for 1 x 128 blocks, 2 for 128 x 128
# blocks), at their own tile and warps: {flags: (TILE_M, TILE_K, warps)}
# (tune_fp8_quantize.py --packed; benchmarks/NOTES.md v17, v24, v32):
# - both copies, 128 x 128 at 4 warps, 2 programs per SM since v24's leaner quantization
#   (8192 x 4096 bf16 on an H100: 92.6 us at v21's 1 per SM and 8 warps, 79.6 lean at that
#   config, 62.4 lean here);
# - the column-wise copy, 128 x 64 at 4 warps (H200, JIT: 37.3 -> 33.2 us at 8192 x 4096 bf16,
#   61.7 -> 52.6 at 14336 x 4096, against 128 x 32 at 2 warps, v17's config on an H100);
# - 128 x 128 blocks at 4 warps (H200, JIT, 8192 x 4096 bf16: the row-wise copy 33.0 -> 30.8
#   us, both 40.2 -> 38.7, against the plain path's best; the library, GPU time, 40.9 -> 27.3
#   and 50.5 -> 35.6 us against the plain variant at 8 warps).
PACKED_FORMS = {0: (128, 128, 4), FLAG_COLS: (128, 64, 4), FLAG_WEIGHT: (128, 128, 4)}
# Packed forms with a variant over a persistent grid of this many programs per multiprocessor
# (PERSISTENT; the launcher reads it from the variant), for GPUs of less than 4 TB/s only
# (FLAG_LOW_BANDWIDTH): both copies. It was the faster form on both GPUs while the
# quantization was heavier (v21: 0.103 -> 0.091 ms on an H100, 0.102 -> 0.090 on an H200) and
# is the H100's measured config (v24: 62.4 us at 8192 x 4096 bf16); since the leaner
# quantization, one tile a program is 9-16 % faster on an H200 (five shapes; the library at
# 8192 x 4096 bf16: 0.0490 -> 0.0429 ms; benchmarks/NOTES.md v31). The column-wise copy alone
# stays one tile a program everywhere (56.7 us against 66.7 at best over a persistent grid,
# H100).
PERSISTENT_PER_SM = {0: 2}


@triton.jit
def _load(x_ptr, rows, cols, M, K):
    """x[rows, cols] in x's dtype; 0 outside the matrix (nothing is read there)."""
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    return tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _rows(x_ptr, rows, cols, M, K):
    """x[rows, cols] in fp32; 0 outside the matrix."""
    return _load(x_ptr, rows, cols, M, K).to(tl.float32)


@triton.jit
def _slabs(x_ptr, rb, cb, M, K, TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """Tile (rb, cb)'s four slabs, rows 4i + j of its TILE_M rows, in x's dtype (a tile past
    the matrix reads nothing)."""
    R: tl.constexpr = TILE_M // 4
    grp = rb.to(tl.int64) * R + tl.arange(0, R)  # word index along M
    cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
    return (_load(x_ptr, 4 * grp, cols, M, K), _load(x_ptr, 4 * grp + 1, cols, M, K),
            _load(x_ptr, 4 * grp + 2, cols, M, K), _load(x_ptr, 4 * grp + 3, cols, M, K))


@triton.jit
def _packed_1x128(x0, x1, x2, x3, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, want_row, want_col,
                  pow2, rb, cb, TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """1 x 128 blocks of tile (rb, cb), given as its four slabs (_slabs), with the
    column-wise copy written in 32-bit words (_common.fp8_store_packed)."""
    R: tl.constexpr = TILE_M // 4
    grp = rb.to(tl.int64) * R + tl.arange(0, R)
    cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
    fp8_store_packed(x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32),
                     x3.to(tl.float32), grp, 0, cols, M, K, rb, cb, q_ptr, s_ptr, qt_ptr,
                     st_ptr, want_row, want_col, pow2, M, 1)


@triton.jit
def _packed_128x128(x0, x1, x2, x3, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, want_row, want_col,
                    pow2, rb, cb, TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """The tile (rb, cb) as one 128 x 128 block, given as its four slabs (_slabs): one scale
    from the slabs' elementwise maximum, the row-wise copy stored slab by slab, the
    column-wise copy (q^T) in 32-bit words of four rows' float8 bytes as in
    _common.fp8_store_packed (M % 4 == 0)."""
    R: tl.constexpr = TILE_M // 4
    grp = rb.to(tl.int64) * R + tl.arange(0, R)
    cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
    cmask = (cols < K)[None, :]
    v0, v1, v2, v3 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
    a = max_nan(max_nan(tl.abs(v0), tl.abs(v1)), max_nan(tl.abs(v2), tl.abs(v3)))
    s = _scale(fp8_amax(fp8_amax(a, 1), 0), pow2)
    if want_row != 0:
        ty = q_ptr.dtype.element_ty
        base = q_ptr + (4 * grp)[:, None] * K + cols[None, :]
        tl.store(base, _quantize(v0, s, ty).to(ty), mask=(4 * grp < M)[:, None] & cmask)
        tl.store(base + K, _quantize(v1, s, ty).to(ty), mask=(4 * grp + 1 < M)[:, None] & cmask)
        tl.store(base + 2 * K, _quantize(v2, s, ty).to(ty),
                 mask=(4 * grp + 2 < M)[:, None] & cmask)
        tl.store(base + 3 * K, _quantize(v3, s, ty).to(ty),
                 mask=(4 * grp + 3 < M)[:, None] & cmask)
        tl.store(s_ptr + rb * tl.cdiv(K, TILE_K) + cb, s)
    if want_col != 0:
        wp = qt_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
        tl.store(wp + cols[None, :] * (M // 4) + grp[:, None], fp8_word(v0, v1, v2, v3, s),
                 mask=(grp < M // 4)[:, None] & cmask)
        tl.store(st_ptr + cb * tl.cdiv(M, TILE_M) + rb, s)


@triton.jit
def _plain(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, weight, want_row, want_col, pow2, rb, cb,
           TILE_M: tl.constexpr, TILE_K: tl.constexpr):
    """Any tile whose blocks lie in it, every form; the column-wise copy a transposed float8
    tile."""
    rows = rb.to(tl.int64) * TILE_M + tl.arange(0, TILE_M)
    cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
    rmask = rows < M
    cmask = cols < K
    mask = rmask[:, None] & cmask[None, :]
    x = _rows(x_ptr, rows, cols, M, K)
    q_offs = rows[:, None] * K + cols[None, :]
    # the column-wise copy is stored as a (TILE_K, TILE_M) tile, contiguous along M
    qt_offs = cols[:, None] * M + rows[None, :]
    mask_t = cmask[:, None] & rmask[None, :]
    if weight != 0:
        # a NaN in the block makes its scale NaN
        s = _scale(fp8_amax(fp8_amax(tl.abs(x), 1), 0), pow2)
        q = _quantize(x, s, q_ptr.dtype.element_ty)
        # Each copy under a branch, not only a store mask: the transposition (a round trip
        # through shared memory) is skipped when only the row-wise copy is asked for.
        if want_row != 0:
            tl.store(q_ptr + q_offs, q.to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(s_ptr + rb * tl.cdiv(K, TILE_K) + cb, s)
        if want_col != 0:
            # float8 values transposed (the float32 ones, transposed, came out NaN in 3 of 8
            # elements for float32 weights under Triton 3.6)
            tl.store(qt_ptr + qt_offs, tl.trans(q.to(qt_ptr.dtype.element_ty)), mask=mask_t)
            tl.store(st_ptr + cb * tl.cdiv(M, TILE_M) + rb, s)
    else:
        fp8_store_1x128(x, rb, cb, rows, cols, M, K, q_ptr, s_ptr, qt_ptr, st_ptr, want_row,
                        want_col, pow2)


@triton.jit
def fp8_quantize_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, weight, want_row, want_col,
                        pow2, TILE_M: tl.constexpr, TILE_K: tl.constexpr,
                        PACKED: tl.constexpr = 0, PERSISTENT: tl.constexpr = 0,
                        COPIES: tl.constexpr = 0):
    if COPIES != 0:  # the variant's copies (COPIES_*), fixed at compile time
        want_row = COPIES != COPIES_COLS
        want_col = COPIES != COPIES_ROWS
    if PERSISTENT:
        # The PACKED path over a persistent grid: program p walks tiles p, p + P, ...
        # (row-major) and loads its next tile's slabs before it quantizes and stores the
        # current one, so those loads are in flight meanwhile.
        pid = tl.program_id(0)
        step = tl.num_programs(0)
        nkb = tl.cdiv(K, TILE_K)
        ntiles = tl.cdiv(M, TILE_M) * nkb
        n0, n1, n2, n3 = _slabs(x_ptr, pid // nkb, pid % nkb, M, K, TILE_M, TILE_K)
        for t in range(pid, ntiles, step):
            c0, c1, c2, c3 = n0, n1, n2, n3
            n0, n1, n2, n3 = _slabs(x_ptr, (t + step) // nkb, (t + step) % nkb, M, K, TILE_M,
                                    TILE_K)
            _packed_1x128(c0, c1, c2, c3, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, want_row,
                          want_col, pow2, t // nkb, t % nkb, TILE_M, TILE_K)
    else:
        rb = tl.program_id(0)
        cb = tl.program_id(1)
        if PACKED == 2:  # 128 x 128 blocks
            x0, x1, x2, x3 = _slabs(x_ptr, rb, cb, M, K, TILE_M, TILE_K)
            _packed_128x128(x0, x1, x2, x3, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, want_row,
                            want_col, pow2, rb, cb, TILE_M, TILE_K)
        elif PACKED:  # 1 x 128 blocks
            x0, x1, x2, x3 = _slabs(x_ptr, rb, cb, M, K, TILE_M, TILE_K)
            _packed_1x128(x0, x1, x2, x3, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, want_row,
                          want_col, pow2, rb, cb, TILE_M, TILE_K)
        else:
            _plain(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, weight, want_row, want_col, pow2,
                   rb, cb, TILE_M, TILE_K)


_ARGS = ("x_ptr", "q_ptr", "s_ptr", "qt_ptr", "st_ptr", "M", "K", "weight", "want_row",
         "want_col", "pow2")
_TYPES = {"q_ptr": "*fp8e4nv", "qt_ptr": "*fp8e4nv", "s_ptr": "*fp32", "st_ptr": "*fp32",
          "M": "i64", "K": "i64", "weight": "i32", "want_row": "i32", "want_col": "i32",
          "pow2": "i32"}


def variants(arch: int) -> list:
    if arch < 89:  # no FP8 conversions before sm_89 (the sm_80 cubins serve all of 8.x)
        return []
    out = []
    for dt in DTYPES:
        sig = {a: _TYPES.get(a, f"*{dt}") for a in _ARGS}
        sig.update({"TILE_M": "constexpr", "TILE_K": "constexpr", "PACKED": "constexpr",
                    "PERSISTENT": "constexpr", "COPIES": "constexpr"})
        # FLAG_ALIGNED: M and K multiples of 16 and x 16-byte aligned, so that the loads and
        # the float8 stores (one byte each otherwise) are 16 bytes wide.
        for form, plain_m, plain_k, plain_warps in FORMS:
            for aligned in (0, FLAG_ALIGNED):
                flags = form | aligned
                packed = 0
                tile_m, tile_k, warps = plain_m, plain_k, plain_warps
                if aligned and form in PACKED_FORMS:
                    packed = 2 if form == FLAG_WEIGHT else 1
                    tile_m, tile_k, warps = PACKED_FORMS[form]
                # (extra flags, programs per SM): one tile a program; and where the form has
                # one, the persistent grid for GPUs of less than 4 TB/s
                grids = [(0, 0)]
                if packed and form in PERSISTENT_PER_SM:
                    grids.append((FLAG_LOW_BANDWIDTH, PERSISTENT_PER_SM[form]))
                for extra, per_sm in grids:
                    out.append(Variant(family="fp8_quantize", kernel="fp8_quantize_kernel",
                                       dtype=dt, block=TILE, signature=sig,
                                       constexprs={"TILE_M": tile_m, "TILE_K": tile_k,
                                                   "PACKED": packed, "PERSISTENT": per_sm,
                                                   "COPIES": FORM_COPIES[form]},
                                       num_warps=warps,
                                       flags=flags | extra,
                                       divisible_by_16=aligned_args(sig, flags, ("M", "K"))))
    return out
