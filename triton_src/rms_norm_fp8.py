"""RMSNorm fused with blockwise FP8 quantization of its output (the format: python/fk/ops/
fp8_quantize.py; the norm: triton_src/rms_norm.py in its llama casting mode, offset 0).

y = round(round(x * rstd) * round(w)) in x's dtype, rstd = 1 / sqrt(mean(x^2) + eps) in fp32
(sum of squares accumulated in fp32), then y quantized in 1 x 128 blocks: the row-wise copy
q (M, K) with scales s (cdiv(K, 128), M), the column-wise copy qt (K, M) with scales
st (cdiv(M, 128), K). Every output is computed from the same y (the fp32 value of y rounded
to x's dtype), so dequantizing either copy approximates the y that is returned.

A column-wise block needs y on 128 rows, and y on a row needs the whole row's sum of
squares, so the column-wise copy is written from a second read of x:

  rms_norm_fp8_rows_kernel   ROWS rows of at most BLOCK_K columns per program, one pass:
                             rstd, and when asked the row-wise copy and y.
  rms_norm_fp8_rstd_kernel   rstd only, one row per program, any K (chunks of BLOCK_K).
  rms_norm_fp8_tile_kernel   one 128 x 128 tile of x per program, given rstd: any of the
                             row-wise copy, the column-wise copy and y (128 x 32 tiles for
                             the column-wise copy alone, 128 x 64 in its aligned variant).

The C++ side runs rows (+ tile for the column-wise copy) when K fits the largest rows
block, else rstd + tile. Masked elements of partial tiles read as 0 and are not stored.
FP8 variants exist for sm_90 and newer only, as fp8_quantize's.
"""
import triton
import triton.language as tl

from _common import (COPIES_COLS, DTYPES, FLAG_ALIGNED, Variant, aligned_args, fp8_amax,
                     fp8_quantize_values, fp8_scale, fp8_store_1x128, rms_normalize,
                     rms_weight)

TILE = 128
CASTING_LLAMA = tl.constexpr(1)  # triton_src/rms_norm.py's casting modes


@triton.jit
def _norm(x, rstd, w_ptr, cols, cmask, dtype):
    """y (fp32 value of x's dtype) of x (fp32) with rstd broadcast to x, llama casting."""
    wp = rms_weight(w_ptr, cols, cmask, 0.0, 1, CASTING_LLAMA, dtype)
    y = rms_normalize(x, rstd, CASTING_LLAMA, dtype) * wp[None, :]
    return y.to(dtype).to(tl.float32)


@triton.jit
def rms_norm_fp8_rows_kernel(x_ptr, w_ptr, q_ptr, s_ptr, y_ptr, rstd_ptr, M, K, eps, want_row,
                             want_y, pow2, BLOCK_K: tl.constexpr, ROWS: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    NB: tl.constexpr = BLOCK_K // 128
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_K)
    rmask = rows < M
    cmask = cols < K
    mask = rmask[:, None] & cmask[None, :]
    offs = rows[:, None] * K + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / K + eps)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)
    y = _norm(x, rstd[:, None], w_ptr, cols, cmask, dtype)
    if want_y != 0:
        tl.store(y_ptr + offs, y.to(dtype), mask=mask)
    if want_row != 0:
        yb = tl.reshape(y, (ROWS, NB, 128))
        s = fp8_scale(fp8_amax(tl.abs(yb), 2), pow2)  # (ROWS, NB)
        q = tl.reshape(fp8_quantize_values(yb, s[:, :, None], q_ptr.dtype.element_ty),
                       (ROWS, BLOCK_K))
        tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
        blocks = tl.arange(0, NB)
        smask = rmask[:, None] & (blocks * 128 < K)[None, :]
        tl.store(s_ptr + blocks[None, :].to(tl.int64) * M + rows[:, None], s, mask=smask)


@triton.jit
def rms_norm_fp8_rstd_kernel(x_ptr, rstd_ptr, M, K, eps, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * K + cols, mask=cols < K, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(rstd_ptr + row, 1.0 / tl.sqrt(tl.sum(acc, axis=0) / K + eps))


@triton.jit
def rms_norm_fp8_tile_kernel(x_ptr, w_ptr, rstd_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, y_ptr, M, K,
                             want_row, want_col, want_y, pow2, TILE_M: tl.constexpr,
                             TILE_K: tl.constexpr, COPIES: tl.constexpr = 0):
    if COPIES == COPIES_COLS:  # the variant for the column-wise copy alone: nothing else
        want_row = 0
        want_col = 1
        want_y = 0
    dtype = x_ptr.dtype.element_ty
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    rows = rb.to(tl.int64) * TILE_M + tl.arange(0, TILE_M)
    cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
    rmask = rows < M
    cmask = cols < K
    mask = rmask[:, None] & cmask[None, :]
    offs = rows[:, None] * K + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    y = _norm(x, rstd[:, None], w_ptr, cols, cmask, dtype)
    if want_y != 0:
        tl.store(y_ptr + offs, y.to(dtype), mask=mask)
    fp8_store_1x128(y, rb, cb, rows, cols, M, K, q_ptr, s_ptr, qt_ptr, st_ptr, want_row,
                    want_col, pow2)


# Tiles of the tile kernel: (flags, TILE_M, TILE_K, warps). No flag: 128 x 128, any outputs;
# FLAG_COLS: 128 x 32 for the column-wise copy alone, compiled for it and nothing else
# (COPIES; what fp8_quantize's tuning found fastest for that copy on an H100;
# benchmarks/NOTES.md v14).
FLAG_COLS = 2
TILE_FORMS = ((0, TILE, TILE, 8), (FLAG_COLS, TILE, 32, 4))
# The aligned variant of the column-wise form: 128 x 64 tiles at 4 warps (H200, the library at
# 8192 x 4096 bf16, "both": 0.0847 -> 0.0753 ms; tune_rms_norm_fp8.py --part tile;
# benchmarks/NOTES.md v32).
ALIGNED_COLS_TILE = (TILE, 64, 4)
# Single-pass buckets: (BLOCK_K, rows per program, warps); wider rows take rstd + tile.
# 2048 and 4096 at 4 warps from an H100 sweep (benchmarks/tune_rms_norm_fp8.py, 8192 rows:
# 30.1 -> 28.4 us and 51.4 -> 48.4 us).
_ROWS_BUCKETS = ((256, 8, 4), (1024, 2, 4), (2048, 1, 4), (4096, 1, 4), (8192, 1, 16),
                 (16384, 1, 16))
RSTD_BLOCK = 4096

_ROWS_ARGS = ("x_ptr", "w_ptr", "q_ptr", "s_ptr", "y_ptr", "rstd_ptr", "M", "K", "eps",
              "want_row", "want_y", "pow2")
_RSTD_ARGS = ("x_ptr", "rstd_ptr", "M", "K", "eps")
_TILE_ARGS = ("x_ptr", "w_ptr", "rstd_ptr", "q_ptr", "s_ptr", "qt_ptr", "st_ptr", "y_ptr", "M",
              "K", "want_row", "want_col", "want_y", "pow2")
_TYPES = {"q_ptr": "*fp8e4nv", "qt_ptr": "*fp8e4nv", "s_ptr": "*fp32", "st_ptr": "*fp32",
          "rstd_ptr": "*fp32", "M": "i64", "K": "i64", "eps": "fp32", "want_row": "i32",
          "want_col": "i32", "want_y": "i32", "pow2": "i32"}


def _signature(args, dt, constexprs):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    if arch < 89:  # no FP8 conversions before sm_89 (the sm_80 cubins serve all of 8.x)
        return []
    out = []
    for dt in DTYPES:
        # FLAG_ALIGNED: K (and M, for the tile kernel's column-wise stores) multiples of 16,
        # every tensor 16-byte aligned.
        for flags in (0, FLAG_ALIGNED):
            def add(family, kernel, args, block, constexprs, warps, extra, form=0):
                sig = _signature(args, dt, constexprs)
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                   signature=sig, constexprs=constexprs, num_warps=warps,
                                   flags=form | flags,
                                   divisible_by_16=aligned_args(sig, flags, extra)))

            for block, rows, warps in _ROWS_BUCKETS:
                add("rms_norm_fp8_rows", "rms_norm_fp8_rows_kernel", _ROWS_ARGS, block,
                    {"BLOCK_K": block, "ROWS": rows}, warps, ("K",))
            add("rms_norm_fp8_rstd", "rms_norm_fp8_rstd_kernel", _RSTD_ARGS, RSTD_BLOCK,
                {"BLOCK_K": RSTD_BLOCK}, 8, ("K",))
            for form, tile_m, tile_k, warps in TILE_FORMS:
                if flags and form == FLAG_COLS:
                    tile_m, tile_k, warps = ALIGNED_COLS_TILE
                add("rms_norm_fp8_tile", "rms_norm_fp8_tile_kernel", _TILE_ARGS, TILE,
                    {"TILE_M": tile_m, "TILE_K": tile_k,
                     "COPIES": COPIES_COLS.value if form == FLAG_COLS else 0},
                    warps, ("M", "K"), form)
    return out
