"""Residual add fused with RMSNorm, as in a decoder layer:

    s = x + residual              (added in fp32, rounded to the input dtype: residual_out)
    y = rms_norm(s, w, eps, offset, casting)

with exactly the numerics of triton_src/rms_norm.py applied to the rounded s (same casting
modes, fp32 sum of squares, fp32 rstd kept for backward). The backward of the pair is

    dx = dresidual = rms_norm_backward(dy, s) + ds     (one rounding to the input dtype)
    dw = sum over rows of dy * normalized(s)            (fp32 partials per program)

where ds, the gradient of residual_out, is optional (``has_ds == 0``: never read).

All tensors are contiguous (M, N) rows, so N is the row stride.

Kernels:
  fused_add_rms_norm_fwd_kernel        ROWS rows of at most BLOCK_N columns per program, one
                                       pass: reads x, residual, w; writes s, y, rstd.
  fused_add_rms_norm_fwd_looped_kernel one row per program, any N: the first pass writes s
                                       and sums its squares, the second recomputes s from x
                                       and residual (bit-identical) and writes y.
  fused_add_rms_norm_bwd_kernel        persistent: each program walks a range of rows with the
                                       next row's loads issued before this row's arithmetic,
                                       keeps its fp32 partial dw in registers, writes it once.
  fused_add_rms_norm_bwd_looped_kernel the same for any N, partial dw kept in the program's
                                       own row of the fp32 partial buffer.
The partial dw rows are summed by rms_norm's ``rms_norm_dw`` kernel family.
"""
import triton
import triton.language as tl

from _common import (DTYPES, FLAG_ALIGNED, Variant, aligned_args, rms_norm_bwd_looped_rows,
                     rms_normalize, rms_weight)


@triton.jit
def _residual_sum(x_ptr, r_ptr, offs, mask, dtype):
    """x + residual added in fp32 and rounded to ``dtype`` (what torch's add of two bf16 /
    fp16 tensors gives); returned in ``dtype``."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return (x + r).to(dtype)


@triton.jit
def fused_add_rms_norm_fwd_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, rstd_ptr, M, N, eps,
                                  offset, has_w, casting, BLOCK_N: tl.constexpr,
                                  ROWS: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    offs = rows[:, None] * N + cols[None, :]
    s = _residual_sum(x_ptr, r_ptr, offs, mask, dtype)
    tl.store(s_ptr + offs, s, mask=mask)
    s = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=1) / N + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    wp = rms_weight(w_ptr, cols, col_mask, offset, has_w, casting, dtype)
    y = rms_normalize(s, rstd[:, None], casting, dtype) * wp[None, :]
    tl.store(y_ptr + offs, y.to(dtype), mask=mask)


@triton.jit
def fused_add_rms_norm_fwd_looped_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, rstd_ptr, M, N, eps,
                                         offset, has_w, casting, BLOCK_N: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    base = row * N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        s = _residual_sum(x_ptr, r_ptr, base + cols, mask, dtype)
        tl.store(s_ptr + base + cols, s, mask=mask)
        s = s.to(tl.float32)
        acc += s * s
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # Recomputed rather than read back: no ordering needed against the first pass.
        s = _residual_sum(x_ptr, r_ptr, base + cols, mask, dtype).to(tl.float32)
        wp = rms_weight(w_ptr, cols, mask, offset, has_w, casting, dtype)
        y = rms_normalize(s, rstd, casting, dtype) * wp
        tl.store(y_ptr + base + cols, y.to(dtype), mask=mask)


@triton.jit
def _grad_row(dy_ptr, ds_ptr, s_ptr, rstd_ptr, row, N, cols, mask, has_ds, live):
    """The backward's loads of one row, in the stored dtypes: dy, ds (zero without it), s,
    rstd. ``live == False`` (a row past the program's range) loads nothing."""
    offs = row * N + cols
    m = mask & live
    dy = tl.load(dy_ptr + offs, mask=m, other=0.0)
    ds = tl.load(ds_ptr + offs, mask=m & (has_ds != 0), other=0.0)
    s = tl.load(s_ptr + offs, mask=m, other=0.0)
    rstd = tl.load(rstd_ptr + row, mask=live, other=0.0)
    return dy, ds, s, rstd


@triton.jit
def fused_add_rms_norm_bwd_kernel(dy_ptr, ds_ptr, s_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, M, N,
                                  offset, rows_per_program, has_w, has_ds, want_dx, want_dw,
                                  casting, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    dtype = s_ptr.dtype.element_ty
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    wp = rms_weight(w_ptr, cols, mask, offset, has_w, casting, dtype)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if PREFETCH:
        # Software pipelining by hand: row r + 1 loads while row r is reduced and stored.
        dy_n, ds_n, s_n, rstd_n = _grad_row(dy_ptr, ds_ptr, s_ptr, rstd_ptr, row_start, N, cols,
                                            mask, has_ds, row_start < row_end)
    for row in range(row_start, row_end):
        if PREFETCH:
            dy, ds, s, rstd = dy_n, ds_n, s_n, rstd_n
            dy_n, ds_n, s_n, rstd_n = _grad_row(dy_ptr, ds_ptr, s_ptr, rstd_ptr, row + 1, N,
                                                cols, mask, has_ds, row + 1 < row_end)
        else:
            dy, ds, s, rstd = _grad_row(dy_ptr, ds_ptr, s_ptr, rstd_ptr, row, N, cols, mask,
                                        has_ds, True)
        dy = dy.to(tl.float32)
        s = s.to(tl.float32)
        # dw first: dy and s die before the row reduction, across which xh and dxh live.
        dw += dy * rms_normalize(s, rstd, casting, dtype)
        xh = s * rstd
        dxh = dy * wp
        c = tl.sum(dxh * xh, axis=0) / N
        dx = rstd * (dxh - xh * c) + ds.to(tl.float32)
        tl.store(dx_ptr + row * N + cols, dx.to(dtype), mask=mask & (want_dx != 0))
    tl.store(dw_ptr + pid.to(tl.int64) * N + cols, dw, mask=mask & (want_dw != 0))


@triton.jit
def fused_add_rms_norm_bwd_looped_kernel(dy_ptr, ds_ptr, s_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr,
                                         M, N, offset, rows_per_program, has_w, has_ds,
                                         want_dx, want_dw, casting, BLOCK_N: tl.constexpr):
    rms_norm_bwd_looped_rows(dy_ptr, ds_ptr, s_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, N, N, N, N,
                             M, N, offset, rows_per_program, has_w, has_ds, want_dx, want_dw,
                             casting, BLOCK_N)


# Forward buckets: (BLOCK_N, rows per program, warps), those of rms_norm (the same rows; twice
# the bytes per element, the same work per thread). Rows past the largest bucket go to the
# looped kernels, which take any N in chunks of LOOP_BLOCK.
_FWD_BUCKETS = ((256, 8, 4), (1024, 2, 4), (2048, 1, 8), (4096, 1, 8), (8192, 1, 16),
                (16384, 1, 16))
# Backward buckets: (BLOCK_N, warps, prefetch). The launcher starts 16 / warps programs per
# multiprocessor, so every variant must fit in 65536 / 512 = 128 registers per thread to keep
# them all resident (checked with cuobjdump --dump-resource-usage on the sm_90a cubins): a
# prefetched row costs the registers of a second row in its stored dtype, which fits up to
# the sizes below (on sm_80 to sm_120 alike). The unaligned variants load element by element
# with far more registers and never prefetch; at 8192 they spill about 200 bytes per thread.
# Past 8192 columns a row and its prefetch do not fit in registers: the looped kernel takes
# those rows.
_BWD_ALIGNED = {
    "bf16": ((256, 4, 1), (1024, 4, 1), (2048, 8, 1), (4096, 8, 1), (8192, 16, 1)),
    "fp16": ((256, 4, 1), (1024, 4, 1), (2048, 8, 1), (4096, 8, 0), (8192, 16, 1)),
    "fp32": ((256, 4, 1), (1024, 4, 1), (2048, 8, 1), (4096, 16, 1), (8192, 16, 0)),
}
_BWD_UNALIGNED = ((256, 4, 0), (1024, 4, 0), (2048, 8, 0), (4096, 16, 0), (8192, 16, 0))
LOOP_BLOCK = 4096

_FWD_ARGS = ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "s_ptr", "rstd_ptr", "M", "N", "eps", "offset",
             "has_w", "casting")
_BWD_ARGS = ("dy_ptr", "ds_ptr", "s_ptr", "w_ptr", "rstd_ptr", "dx_ptr", "dw_ptr", "M", "N",
             "offset", "rows_per_program", "has_w", "has_ds", "want_dx", "want_dw", "casting")
_TYPES = {"rstd_ptr": "*fp32", "dw_ptr": "*fp32", "eps": "fp32", "offset": "fp32", "M": "i64",
          "N": "i32", "rows_per_program": "i64", "has_w": "i32", "has_ds": "i32",
          "want_dx": "i32", "want_dw": "i32", "casting": "i32"}


def _signature(args, dt, constexprs):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED):
            def add(family, kernel, args, block, constexprs, warps):
                sig = _signature(args, dt, constexprs)
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                   signature=sig, constexprs=constexprs, num_warps=warps,
                                   flags=flags, divisible_by_16=aligned_args(sig, flags, ("N",))))

            for block, rows, warps in _FWD_BUCKETS:
                add("fused_add_rms_norm_fwd", "fused_add_rms_norm_fwd_kernel", _FWD_ARGS, block,
                    {"BLOCK_N": block, "ROWS": rows}, warps)
            for block, warps, prefetch in (_BWD_ALIGNED[dt] if flags else _BWD_UNALIGNED):
                add("fused_add_rms_norm_bwd", "fused_add_rms_norm_bwd_kernel", _BWD_ARGS, block,
                    {"BLOCK_N": block, "PREFETCH": prefetch}, warps)
            add("fused_add_rms_norm_fwd_looped", "fused_add_rms_norm_fwd_looped_kernel",
                _FWD_ARGS, LOOP_BLOCK, {"BLOCK_N": LOOP_BLOCK}, 8)
            add("fused_add_rms_norm_bwd_looped", "fused_add_rms_norm_bwd_looped_kernel",
                _BWD_ARGS, LOOP_BLOCK, {"BLOCK_N": LOOP_BLOCK}, 8)
    return out
