"""LayerNorm over the last dimension: y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps).

mean and the biased variance are computed in fp32 (the variance from the centred values, not
from E[x^2] - mean^2), the output is rounded once to the input dtype, and mean and rstd are
stored in fp32 per row for the backward. Weight and bias are independently optional
(``has_w`` / ``has_b`` run-time ints): a missing weight reads as one, a missing bias as zero.

Backward, with xh = (x - mean) * rstd and g = dy * w:
  dx = rstd * (g - mean(g) - xh * mean(g * xh)),  dw = sum_rows(dy * xh),  db = sum_rows(dy).
``need_dx`` / ``need_dw`` / ``need_db`` (run-time ints) switch the stores off for gradients
nobody asked for; the pointers of those outputs may then be null.

Kernels:
  layer_norm_fwd_kernel        ROWS rows of at most BLOCK_N columns per program, one pass.
  layer_norm_fwd_looped_kernel one row per program, any N: one pass over BLOCK_N chunks for
                               mean and variance (chunk statistics combined exactly, Chan et
                               al.), one pass writing y.
  layer_norm_bwd_kernel        persistent: each program walks a contiguous range of rows with
                               the next rows' loads in flight (``tl.range`` software
                               pipelining, STAGES deep: asynchronous copies into shared
                               memory where rows are 16-byte aligned), reduces both row sums
                               in one pass, keeps fp32 partial dw and db in registers and
                               writes them once.
  layer_norm_bwd_looped_kernel the same for any N; the partial dw / db live in the program's
                               own rows of the fp32 partial buffers.
  layer_norm_dwdb_kernel       sums the partial rows: program axis 1 picks dw (0) or db (1).
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args


@triton.jit
def _weight(w_ptr, cols, mask, has_w):
    """Weight in fp32, one where absent."""
    return tl.load(w_ptr + cols, mask=mask & (has_w != 0), other=1.0).to(tl.float32)


@triton.jit
def _affine(w_ptr, b_ptr, cols, mask, has_w, has_b):
    """Weight (one where absent) and bias (zero where absent) in fp32."""
    b = tl.load(b_ptr + cols, mask=mask & (has_b != 0), other=0.0).to(tl.float32)
    return _weight(w_ptr, cols, mask, has_w), b


@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_stride, y_stride, M,
                          N, eps, has_w, has_b, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(col_mask[None, :], x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
    tl.store(mean_ptr + rows, mean, mask=row_mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    w, b = _affine(w_ptr, b_ptr, cols, col_mask, has_w, has_b)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + rows[:, None] * y_stride + cols[None, :], y.to(dtype), mask=mask)


@triton.jit
def layer_norm_fwd_looped_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, x_stride,
                                 y_stride, M, N, eps, has_w, has_b, BLOCK_N: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    y_row = y_ptr + row * y_stride
    # Running (count, mean, sum of squared deviations); each chunk's own mean and deviations
    # are exact two-pass values, merged with Chan's update, so large means do not cancel.
    mean = tl.zeros((), dtype=tl.float32)
    m2 = tl.zeros((), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        n_a = start * 1.0
        n_b = tl.minimum(N - start, BLOCK_N) * 1.0
        chunk_mean = tl.sum(x, axis=0) / n_b
        d = tl.where(mask, x - chunk_mean, 0.0)
        delta = chunk_mean - mean
        n = n_a + n_b
        mean += delta * (n_b / n)
        m2 += tl.sum(d * d, axis=0) + delta * delta * (n_a * n_b / n)
    rstd = 1.0 / tl.sqrt(m2 / N + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w, b = _affine(w_ptr, b_ptr, cols, mask, has_w, has_b)
        y = (x - mean) * rstd * w + b
        tl.store(y_row + cols, y.to(dtype), mask=mask)


@triton.jit
def _add_pair(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _bwd_row(dy_ptr, x_ptr, mean_ptr, rstd_ptr, row, dy_stride, x_stride, cols, mask, w):
    """One row's fp32 dy, xh = (x - mean) * rstd (zero past N), g = dy * w, and rstd."""
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xh = tl.where(mask, (x - mean) * rstd, 0.0)
    return dy, xh, dy * w, rstd


@triton.jit
def _bwd_chunk(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, row, dy_stride, x_stride, start, N,
               has_w, BLOCK_N: tl.constexpr):
    """Columns, mask and _bwd_row's values for one BLOCK_N chunk of a row (looped backward)."""
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < N
    w = _weight(w_ptr, cols, mask, has_w)
    dy, xh, g, rstd = _bwd_row(dy_ptr, x_ptr, mean_ptr, rstd_ptr, row, dy_stride, x_stride,
                               cols, mask, w)
    return cols, mask, dy, xh, g, rstd


@triton.jit
def layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr,
                          dy_stride, x_stride, dx_stride, M, N, rows_per_program, has_w,
                          need_dx, need_dw, need_db, BLOCK_N: tl.constexpr,
                          STAGES: tl.constexpr, PER_SM: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = _weight(w_ptr, cols, mask, has_w)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for row in tl.range(row_start, row_end, num_stages=STAGES):
        dy, xh, g, rstd = _bwd_row(dy_ptr, x_ptr, mean_ptr, rstd_ptr, row, dy_stride, x_stride,
                                   cols, mask, w)
        # One reduction for both sums: a single exchange between warps per row.
        s1, s2 = tl.reduce((g, g * xh), 0, _add_pair)
        dx = rstd * (g - s1 / N - xh * (s2 / N))
        tl.store(dx_ptr + row * dx_stride + cols, dx.to(dtype), mask=mask & (need_dx != 0))
        dw += dy * xh
        db += dy
    out = pid.to(tl.int64) * N + cols
    tl.store(dw_ptr + out, dw, mask=mask & (need_dw != 0))
    tl.store(db_ptr + out, db, mask=mask & (need_db != 0))


@triton.jit
def layer_norm_bwd_looped_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr,
                                 db_ptr, dy_stride, x_stride, dx_stride, M, N, rows_per_program,
                                 has_w, need_dx, need_dw, need_db, BLOCK_N: tl.constexpr,
                                 STAGES: tl.constexpr, PER_SM: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    dw_row = dw_ptr + pid.to(tl.int64) * N
    db_row = db_ptr + pid.to(tl.int64) * N
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
        tl.store(dw_row + cols, zero, mask=(cols < N) & (need_dw != 0))
        tl.store(db_row + cols, zero, mask=(cols < N) & (need_db != 0))
    for row in range(row_start, row_end):
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            cols, mask, dy, xh, g, rstd = _bwd_chunk(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
                                                     row, dy_stride, x_stride, start, N, has_w,
                                                     BLOCK_N)
            acc1 += g
            acc2 += g * xh
        c1 = tl.sum(acc1, axis=0) / N
        c2 = tl.sum(acc2, axis=0) / N
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            cols, mask, dy, xh, g, rstd = _bwd_chunk(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
                                                     row, dy_stride, x_stride, start, N, has_w,
                                                     BLOCK_N)
            dx = rstd * (g - c1 - xh * c2)
            tl.store(dx_ptr + row * dx_stride + cols, dx.to(dtype), mask=mask & (need_dx != 0))
            wmask = mask & (need_dw != 0)
            tl.store(dw_row + cols, tl.load(dw_row + cols, mask=wmask, other=0.0) + dy * xh,
                     mask=wmask)
            bmask = mask & (need_db != 0)
            tl.store(db_row + cols, tl.load(db_row + cols, mask=bmask, other=0.0) + dy,
                     mask=bmask)


@triton.jit
def layer_norm_dwdb_kernel(partial_ptr, dw_ptr, db_ptr, P, N, BLOCK_P: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    """out[j] = sum_p partial[k, p, j] in fp32, k = program_id(1): out is dw for k = 0, db
    for k = 1; written in the output's dtype."""
    k = tl.program_id(1)
    src = partial_ptr + k.to(tl.int64) * P * N
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(src + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask,
                       other=0.0)
    total = tl.sum(acc, axis=0)
    if k == 0:
        tl.store(dw_ptr + cols, total.to(dw_ptr.dtype.element_ty), mask=col_mask)
    else:
        tl.store(db_ptr + cols, total.to(db_ptr.dtype.element_ty), mask=col_mask)


# Single-pass forward buckets: (BLOCK_N, rows per program, warps). Rows past the largest go
# to the looped forward, which takes any N in chunks of LOOP_BLOCK.
_FWD_BUCKETS = ((256, 8, 4), (1024, 2, 4), (2048, 1, 8), (4096, 2, 4), (8192, 1, 16),
                (16384, 1, 16))
LOOP_BLOCK = 4096
# Backward: (BLOCK_N, warps, pipeline stages, programs per multiprocessor). PER_SM is read by
# the C++ side to size the persistent grid (the kernels ignore it): as many programs as fit
# on a multiprocessor at once, by registers and shared memory on sm_90 (compiled offline: the
# aligned 4096 bf16 variant takes 123 registers and 32 KiB for two rows in flight). Past
# 8192 columns the dw / db / w vectors no longer fit in registers (16384 spills), so longer
# rows take the looped backward in LOOP_BWD chunks.
_BWD_BUCKETS = ((256, 4, 4, 8), (1024, 4, 4, 4), (2048, 8, 3, 4), (4096, 8, 3, 2),
                (8192, 16, 2, 1))
LOOP_BWD = (2048, 8, 2, 2)

_FWD_ARGS = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "mean_ptr", "rstd_ptr", "x_stride", "y_stride",
             "M", "N", "eps", "has_w", "has_b")
_BWD_ARGS = ("dy_ptr", "x_ptr", "w_ptr", "mean_ptr", "rstd_ptr", "dx_ptr", "dw_ptr", "db_ptr",
             "dy_stride", "x_stride", "dx_stride", "M", "N", "rows_per_program", "has_w",
             "need_dx", "need_dw", "need_db")
_DWDB_ARGS = ("partial_ptr", "dw_ptr", "db_ptr", "P", "N")
# (rows, columns, warps) per step of the dw / db reduction: latency-bound steps, so many rows
# of a narrow column block, as rms_norm's (benchmarks/NOTES.md v18, v19).
_DWDB_BLOCK = (256, 16, 8)
_TYPES = {"mean_ptr": "*fp32", "rstd_ptr": "*fp32", "partial_ptr": "*fp32", "P": "i32",
          "eps": "fp32", "x_stride": "i64", "y_stride": "i64", "dy_stride": "i64",
          "dx_stride": "i64", "M": "i64", "N": "i32", "rows_per_program": "i64", "has_w": "i32",
          "has_b": "i32", "need_dx": "i32", "need_dw": "i32", "need_db": "i32"}


def _signature(args, dt, constexprs, overrides=None):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update(overrides or {})
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    out = []
    strides = ("x_stride", "y_stride", "dy_stride", "dx_stride", "N")
    bwd_types = {"dw_ptr": "*fp32", "db_ptr": "*fp32"}  # the backward writes fp32 partials
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED):
            def add(family, kernel, args, block, constexprs, warps, overrides=None):
                sig = _signature(args, dt, constexprs, overrides)
                extra = tuple(a for a in strides if a in sig)
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                   signature=sig, constexprs=constexprs, num_warps=warps,
                                   flags=flags, divisible_by_16=aligned_args(sig, flags, extra)))

            for block, rows, warps in _FWD_BUCKETS:
                add("layer_norm_fwd", "layer_norm_fwd_kernel", _FWD_ARGS, block,
                    {"BLOCK_N": block, "ROWS": rows}, warps)
            for block, warps, stages, per_sm in _BWD_BUCKETS:
                add("layer_norm_bwd", "layer_norm_bwd_kernel", _BWD_ARGS, block,
                    {"BLOCK_N": block, "STAGES": stages, "PER_SM": per_sm}, warps, bwd_types)
            add("layer_norm_fwd_looped", "layer_norm_fwd_looped_kernel", _FWD_ARGS, LOOP_BLOCK,
                {"BLOCK_N": LOOP_BLOCK}, 8)
            block, warps, stages, per_sm = LOOP_BWD
            add("layer_norm_bwd_looped", "layer_norm_bwd_looped_kernel", _BWD_ARGS, block,
                {"BLOCK_N": block, "STAGES": stages, "PER_SM": per_sm}, warps, bwd_types)
        sig = _signature(_DWDB_ARGS, dt, ("BLOCK_P", "BLOCK_N"))
        out.append(Variant(family="layer_norm_dwdb", kernel="layer_norm_dwdb_kernel", dtype=dt,
                           block=_DWDB_BLOCK[1], signature=sig,
                           constexprs={"BLOCK_P": _DWDB_BLOCK[0], "BLOCK_N": _DWDB_BLOCK[1]},
                           num_warps=_DWDB_BLOCK[2]))
    return out
