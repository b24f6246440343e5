"""RMSNorm over the last dimension: y = x * rstd * (offset + w), rstd = 1/sqrt(mean(x^2) + eps).

``casting`` (a run-time int, uniform per launch) selects where values are rounded to the
input dtype, matching the model the norm comes from:
  0 ``none``  : rstd, x_hat and (offset + w) are rounded to the input dtype;
  1 ``llama`` : rstd in fp32, x_hat rounded to the input dtype, (offset + w) in the input
                dtype (Hugging Face Llama);
  2 ``gemma`` : everything in fp32, one rounding of y at the end (Hugging Face Gemma).
The sum of squares is always accumulated in fp32, and rstd is stored in fp32 for backward.
Without a weight (``has_w == 0``) the weight load is masked off and reads as zero; the C++
side passes offset 1 then.

Kernels:
  rms_norm_fwd_kernel        ROWS rows of at most BLOCK_N columns per program, one pass.
  rms_norm_fwd_looped_kernel one row per program, any N, two passes over BLOCK_N chunks.
  rms_norm_bwd_kernel        persistent: each program walks a range of rows, keeps its
                             fp32 partial dw in registers and writes it once.
  rms_norm_bwd_looped_kernel the same for any N, partial dw kept in the program's own row
                             of the fp32 partial buffer.
The C++ side reduces the partial dw rows to dw.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args, rms_norm_bwd_looped_rows
from _common import rms_normalize as _normalize
from _common import rms_weight as _weight

CASTING_NONE = 0
CASTING_LLAMA = 1
CASTING_GEMMA = 2


@triton.jit
def rms_norm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, x_stride, y_stride, M, N, eps, offset,
                        has_w, casting, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    wp = _weight(w_ptr, cols, col_mask, offset, has_w, casting, dtype)
    y = _normalize(x, rstd[:, None], casting, dtype) * wp[None, :]
    tl.store(y_ptr + rows[:, None] * y_stride + cols[None, :], y.to(dtype), mask=mask)


@triton.jit
def rms_norm_fwd_looped_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, x_stride, y_stride, M, N, eps,
                               offset, has_w, casting, BLOCK_N: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    y_row = y_ptr + row * y_stride
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        wp = _weight(w_ptr, cols, mask, offset, has_w, casting, dtype)
        y = _normalize(x, rstd, casting, dtype) * wp
        tl.store(y_row + cols, y.to(dtype), mask=mask)


@triton.jit
def rms_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, dy_stride, x_stride,
                        dx_stride, M, N, offset, rows_per_program, has_w, casting,
                        BLOCK_N: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    wp = _weight(w_ptr, cols, mask, offset, has_w, casting, dtype)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for row in range(row_start, row_end):
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xh = x * rstd
        dxh = dy * wp
        c = tl.sum(dxh * xh, axis=0) / N
        dx = rstd * (dxh - xh * c)
        tl.store(dx_ptr + row * dx_stride + cols, dx.to(dtype), mask=mask)
        dw += dy * _normalize(x, rstd, casting, dtype)
    tl.store(dw_ptr + pid.to(tl.int64) * N + cols, dw, mask=mask & (has_w != 0))


@triton.jit
def rms_norm_bwd_looped_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, dy_stride,
                               x_stride, dx_stride, M, N, offset, rows_per_program, has_w,
                               casting, BLOCK_N: tl.constexpr):
    # No gradient added to dx (has_ds 0), dx always stored, partial dw whenever a weight.
    rms_norm_bwd_looped_rows(dy_ptr, dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, dy_stride,
                             dy_stride, x_stride, dx_stride, M, N, offset, rows_per_program,
                             has_w, 0, 1, has_w, casting, BLOCK_N)


@triton.jit
def rms_norm_dw_kernel(partial_ptr, dw_ptr, dw2_ptr, P, N, N1, BLOCK_P: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    """Column sums of the (P, N) fp32 partial rows, summed in fp32 and written in the outputs'
    dtype: columns j < N1 to dw[j], the others to dw2[j - N1] (two weights' gradients from
    one launch; N1 = N for one)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        acc += tl.load(partial_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask,
                       other=0.0)
    dw = tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty)
    first = cols < N1
    tl.store(dw_ptr + cols, dw, mask=col_mask & first)
    tl.store(dw2_ptr + (cols - N1), dw, mask=col_mask & (cols >= N1))


# Single-pass buckets: (BLOCK_N, rows per program, warps). Rows past the largest bucket go
# to the looped kernels, which take any N in chunks of LOOP_BLOCK.
_FWD_BUCKETS = ((256, 8, 4), (1024, 2, 4), (2048, 1, 8), (4096, 1, 8), (8192, 1, 16),
                (16384, 1, 16))
_BWD_BUCKETS = ((256, 4), (1024, 4), (2048, 8), (4096, 8), (8192, 16), (16384, 16))
LOOP_BLOCK = 4096

_FWD_ARGS = ("x_ptr", "w_ptr", "y_ptr", "rstd_ptr", "x_stride", "y_stride", "M", "N", "eps",
             "offset", "has_w", "casting")
_BWD_ARGS = ("dy_ptr", "x_ptr", "w_ptr", "rstd_ptr", "dx_ptr", "dw_ptr", "dy_stride",
             "x_stride", "dx_stride", "M", "N", "offset", "rows_per_program", "has_w",
             "casting")
_DW_ARGS = ("partial_ptr", "dw_ptr", "dw2_ptr", "P", "N", "N1")
# (rows, columns, warps) per step of the dw reduction, by flags. Its steps are latency-bound
# (one load round trip each), so a step takes many rows of a narrow column block: 1056
# partial rows of 128 columns took 24 us as 33 steps of (32, 64) (benchmarks/NOTES.md v18).
# FLAG_DW_TALL, which the CUDA side takes from 1024 partial rows on: fewer, taller steps for
# the grids of many small programs (qkv_split_norm_rope's backward, 2112 rows; H100, 128
# columns: 13.0 -> 7.6 us at 2112 rows, 9.1 -> 6.1 at 1056; NOTES v27).
FLAG_DW_TALL = 2
_DW_BLOCKS = {0: (256, 16, 8), FLAG_DW_TALL: (2048, 8, 16)}
_TYPES = {"rstd_ptr": "*fp32", "dw_ptr": "*fp32", "partial_ptr": "*fp32", "P": "i32",
          "eps": "fp32", "offset": "fp32",
          "x_stride": "i64", "y_stride": "i64", "dy_stride": "i64", "dx_stride": "i64",
          "M": "i64", "N": "i32", "rows_per_program": "i64", "has_w": "i32", "casting": "i32"}


def _signature(args, dt, constexprs):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    out = []
    strides = ("x_stride", "y_stride", "dy_stride", "dx_stride", "N")
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED):
            def add(family, kernel, args, block, constexprs, warps):
                sig = _signature(args, dt, constexprs)
                extra = tuple(a for a in strides if a in sig)
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                   signature=sig, constexprs=constexprs, num_warps=warps,
                                   flags=flags, divisible_by_16=aligned_args(sig, flags, extra)))

            for block, rows, warps in _FWD_BUCKETS:
                add("rms_norm_fwd", "rms_norm_fwd_kernel", _FWD_ARGS, block,
                    {"BLOCK_N": block, "ROWS": rows}, warps)
            for block, warps in _BWD_BUCKETS:
                add("rms_norm_bwd", "rms_norm_bwd_kernel", _BWD_ARGS, block,
                    {"BLOCK_N": block}, warps)
            add("rms_norm_fwd_looped", "rms_norm_fwd_looped_kernel", _FWD_ARGS, LOOP_BLOCK,
                {"BLOCK_N": LOOP_BLOCK}, 8)
            add("rms_norm_bwd_looped", "rms_norm_bwd_looped_kernel", _BWD_ARGS, LOOP_BLOCK,
                {"BLOCK_N": LOOP_BLOCK}, 8)
        sig = _signature(_DW_ARGS, dt, ("BLOCK_P", "BLOCK_N"))
        sig.update(dw_ptr=f"*{dt}", N1="i32")
        for flags, (rows, cols, warps) in _DW_BLOCKS.items():
            out.append(Variant(family="rms_norm_dw", kernel="rms_norm_dw_kernel", dtype=dt,
                               block=cols, signature=sig, flags=flags,
                               constexprs={"BLOCK_P": rows, "BLOCK_N": cols},
                               num_warps=warps))
    return out
