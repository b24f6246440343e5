"""PolyNorm over the last dimension:
    y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b,  norm(u) = u * rsqrt(mean(u^2) + eps).

Everything is fp32 inside: x is widened, the three mean squares are summed in fp32 and their
rsqrt values (r3, r2, r1) stored per row (fp32, (M, 3)) for the backward; y is rounded once.
weight (3,) and bias (one element) are float32 (``*fp32`` pointers) or x's dtype (variants
with ``FLAG_PARAMS_X``).

Backward, per row with S_p = sum(dy * x^p):
    dx = w0 r3 (3 x^2 dy - (3/N) r3^2 S3 x^5) + w1 r2 (2 x dy - (2/N) r2^2 S2 x^3)
         + w2 r1 (dy - (1/N) r1^2 S1 x)
    dw_p = sum over rows of r_p S_p,  db = sum of dy.

Kernels:
  poly_norm_fwd_kernel    ROWS rows of at most BLOCK_N columns per program, one pass.
  poly_norm_bwd_kernel    persistent: each program walks a range of rows (one pass each,
                          x and dy read once, dx written once), keeps its fp32 partial
                          (dw0, dw1, dw2, db) in registers and writes it once.
  poly_norm_reduce_kernel sums the (programs, 4) partials into dweight and dbias.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

FLAG_PARAMS_X = 2  # weight and bias in x's dtype (bf16 / fp16 x); else float32


@triton.jit
def poly_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, rstd_ptr, M, N, eps,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w0 = tl.load(w_ptr).to(tl.float32)
    w1 = tl.load(w_ptr + 1).to(tl.float32)
    w2 = tl.load(w_ptr + 2).to(tl.float32)
    b = tl.load(b_ptr).to(tl.float32)
    x2 = x * x
    x3 = x2 * x
    r1 = 1.0 / tl.sqrt(tl.sum(x2, axis=1) / N + eps)
    r2 = 1.0 / tl.sqrt(tl.sum(x2 * x2, axis=1) / N + eps)
    r3 = 1.0 / tl.sqrt(tl.sum(x3 * x3, axis=1) / N + eps)
    tl.store(rstd_ptr + rows * 3, r3, mask=row_mask)
    tl.store(rstd_ptr + rows * 3 + 1, r2, mask=row_mask)
    tl.store(rstd_ptr + rows * 3 + 2, r1, mask=row_mask)
    y = (x3 * (w0 * r3)[:, None] + x2 * (w1 * r2)[:, None] + x * (w2 * r1)[:, None]) + b
    tl.store(y_ptr + offs, y.to(dtype), mask=mask)


@triton.jit
def poly_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, partial_ptr, M, N,
                         rows_per_program, BLOCK_N: tl.constexpr):
    dtype = dx_ptr.dtype.element_ty
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w0 = tl.load(w_ptr).to(tl.float32)
    w1 = tl.load(w_ptr + 1).to(tl.float32)
    w2 = tl.load(w_ptr + 2).to(tl.float32)
    dw0 = 0.0
    dw1 = 0.0
    dw2 = 0.0
    db = 0.0
    for row in range(row_start, row_end):
        x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        r3 = tl.load(rstd_ptr + row * 3)
        r2 = tl.load(rstd_ptr + row * 3 + 1)
        r1 = tl.load(rstd_ptr + row * 3 + 2)
        x2 = x * x
        dyx = dy * x
        s1 = tl.sum(dyx, axis=0)
        s2 = tl.sum(dyx * x, axis=0)
        s3 = tl.sum(dyx * x2, axis=0)
        c3 = w0 * r3
        c2 = w1 * r2
        c1 = w2 * r1
        k3 = 3.0 * c3 * r3 * r3 * s3 / N
        k2 = 2.0 * c2 * r2 * r2 * s2 / N
        k1 = c1 * r1 * r1 * s1 / N
        dx = dy * (3.0 * c3 * x2 + 2.0 * c2 * x + c1) - x * ((k3 * x2 + k2) * x2 + k1)
        tl.store(dx_ptr + row * N + cols, dx.to(dtype), mask=mask)
        dw0 += r3 * s3
        dw1 += r2 * s2
        dw2 += r1 * s1
        db += tl.sum(dy, axis=0)
    part = partial_ptr + pid.to(tl.int64) * 4
    tl.store(part, dw0)
    tl.store(part + 1, dw1)
    tl.store(part + 2, dw2)
    tl.store(part + 3, db)


@triton.jit
def poly_norm_reduce_kernel(partial_ptr, dw_ptr, db_ptr, P, BLOCK_P: tl.constexpr):
    """dweight[j] = sum_p partial[p, j] (j < 3), dbias = sum_p partial[p, 3]; fp32 sums."""
    out_dtype = dw_ptr.dtype.element_ty
    cols = tl.arange(0, 4)
    acc = tl.zeros((BLOCK_P, 4), dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        acc += tl.load(partial_ptr + rows[:, None].to(tl.int64) * 4 + cols[None, :],
                       mask=(rows < P)[:, None], other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(dw_ptr + cols, total.to(out_dtype), mask=cols < 3)
    tl.store(db_ptr + (cols - 3), total.to(out_dtype), mask=cols == 3)


# Single-pass buckets: (BLOCK_N, rows per program, warps); the runtime picks the smallest
# block that holds a row. Rows past the largest block are refused. The 4096 buckets from
# benchmarks/tune_poly_norm.py on an H100 (8192 x 4096 bf16): forward at 4 warps 52.8 us (85 %
# of copy bandwidth) against 58.7 us at 8; backward at 4 warps and 16 programs per
# multiprocessor (csrc/ops/poly_norm/poly_norm_cuda.cpp) 79.4 us (85 %) against 91.1 us at 8
# warps and 2 per multiprocessor.
_FWD_BUCKETS = ((256, 8, 4), (1024, 2, 4), (2048, 1, 8), (4096, 1, 4), (8192, 1, 16),
                (16384, 1, 16))
_BWD_BUCKETS = ((256, 4), (1024, 4), (2048, 8), (4096, 4), (8192, 16), (16384, 16))
# (rows per step, warps) of the reduction: its steps are latency-bound, and the backward's
# 16 programs per multiprocessor leave 2112 partial rows on an H100 (benchmarks/NOTES.md v18).
REDUCE_ROWS, REDUCE_WARPS = 1024, 8

_FWD_ARGS = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "rstd_ptr", "M", "N", "eps")
_BWD_ARGS = ("dy_ptr", "x_ptr", "w_ptr", "rstd_ptr", "dx_ptr", "partial_ptr", "M", "N",
             "rows_per_program")
_REDUCE_ARGS = ("partial_ptr", "dw_ptr", "db_ptr", "P")
_PARAMS = ("w_ptr", "b_ptr", "dw_ptr", "db_ptr")
_TYPES = {"rstd_ptr": "*fp32", "partial_ptr": "*fp32", "M": "i64", "N": "i32", "eps": "fp32",
          "rows_per_program": "i64", "P": "i32"}


def _signature(args, dt, pdt, constexprs):
    sig = {a: _TYPES.get(a, f"*{pdt}" if a in _PARAMS else f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        for pdt, pflag in ((("fp32", 0),) if dt == "fp32" else (("fp32", 0), (dt, FLAG_PARAMS_X))):
            for aligned in (0, FLAG_ALIGNED):
                flags = aligned | pflag

                def add(family, kernel, args, block, constexprs, warps):
                    sig = _signature(args, dt, pdt, constexprs)
                    # Scalar parameters (weight, bias) may sit anywhere: no alignment hint.
                    hinted = tuple(a for a in aligned_args(sig, aligned, ("N",))
                                   if a not in _PARAMS)
                    out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                       signature=sig, constexprs=constexprs, num_warps=warps,
                                       flags=flags, divisible_by_16=hinted))

                for block, rows, warps in _FWD_BUCKETS:
                    add("poly_norm_fwd", "poly_norm_fwd_kernel", _FWD_ARGS, block,
                        {"BLOCK_N": block, "ROWS": rows}, warps)
                for block, warps in _BWD_BUCKETS:
                    add("poly_norm_bwd", "poly_norm_bwd_kernel", _BWD_ARGS, block,
                        {"BLOCK_N": block}, warps)
        sig = _signature(_REDUCE_ARGS, dt, dt, ("BLOCK_P",))
        out.append(Variant(family="poly_norm_reduce", kernel="poly_norm_reduce_kernel",
                           dtype=dt, block=REDUCE_ROWS, signature=sig,
                           constexprs={"BLOCK_P": REDUCE_ROWS}, num_warps=REDUCE_WARPS))
    return out
