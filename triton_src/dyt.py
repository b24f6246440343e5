"""Dynamic Tanh (DyT) over the last dimension: y = gamma * tanh(alpha * x) + beta.

x is an (M, N) contiguous view; alpha holds one value, gamma and beta N values. The math is
fp32 throughout: x, dy and the parameters are loaded and widened, the result rounded once to
x's dtype. The parameters are float32 (``*fp32`` pointers) or x's dtype (variants with
``FLAG_PARAMS_X``). Without beta (``has_beta == 0``) its load is masked off and reads as 0.

Kernels:
  dyt_fwd_kernel    a (ROWS, BLOCK_N) tile per program, grid (row tiles, column blocks);
                    elementwise, so any N.
  dyt_bwd_kernel    grid (P, column blocks): program (p, c) walks row range p in tiles of
                    ROWS rows over column block c, writes dx, and keeps fp32 partial sums in
                    registers: dgamma = sum dy * t, dbeta = sum dy, dalpha = sum x * s with
                    t = tanh(alpha * x), s = (1 - t^2) * gamma * dy (dx = alpha * s). They go
                    once to row p of the fp32 partial buffer, laid out [dgamma (N) |
                    dbeta (N) | dalpha (one per column block)].
  dyt_reduce_kernel sums the partial rows: programs 0 .. cdiv(N, BLOCK_N) - 1 the dgamma and
                    dbeta columns, the last program every dalpha slot; written in the
                    parameters' dtype.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

FLAG_PARAMS_X = 2  # alpha, gamma, beta in x's dtype (bf16 / fp16 x); else float32

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _tanh(u):
    """tanh in fp32 through exp2: exact at +-inf, absolute error about 1e-7 near 0."""
    return 1.0 - 2.0 / (tl.exp2(u * (2.0 * LOG2E)) + 1.0)


@triton.jit
def dyt_fwd_kernel(x_ptr, alpha_ptr, gamma_ptr, beta_ptr, y_ptr, M, N, has_beta,
                   BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    alpha = tl.load(alpha_ptr).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + cols, mask=col_mask & (has_beta != 0), other=0.0).to(tl.float32)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = _tanh(alpha * x) * gamma[None, :] + beta[None, :]
    tl.store(y_ptr + offs, y.to(dtype), mask=mask)


@triton.jit
def dyt_bwd_kernel(dy_ptr, x_ptr, alpha_ptr, gamma_ptr, dx_ptr, partial_ptr, M, N,
                   rows_per_program, n_col_blocks, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    dtype = dx_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = cb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    alpha = tl.load(alpha_ptr).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dg = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    db = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    da = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for start in range(row_start, row_end, ROWS):
        rows = start + tl.arange(0, ROWS)
        mask = (rows < row_end)[:, None] & col_mask[None, :]
        offs = rows[:, None] * N + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        t = _tanh(alpha * x)
        s = (1.0 - t * t) * (dy * gamma[None, :])
        tl.store(dx_ptr + offs, (alpha * s).to(dtype), mask=mask)
        dg += dy * t
        db += dy
        da += x * s
    part = partial_ptr + pid * (2 * N + n_col_blocks)
    tl.store(part + cols, tl.sum(dg, axis=0), mask=col_mask)
    tl.store(part + N + cols, tl.sum(db, axis=0), mask=col_mask)
    tl.store(part + 2 * N + cb, tl.sum(tl.sum(da, axis=1), axis=0))


@triton.jit
def dyt_reduce_kernel(partial_ptr, dalpha_ptr, dgamma_ptr, dbeta_ptr, P, N, n_col_blocks,
                      has_beta, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    out_dtype = dgamma_ptr.dtype.element_ty
    pid = tl.program_id(0)
    width = 2 * N + n_col_blocks
    if pid * BLOCK_N < N:
        cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        acc_g = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        for start in range(0, P, BLOCK_P):
            rows = start + tl.arange(0, BLOCK_P)
            mask = (rows < P)[:, None] & col_mask[None, :]
            base = partial_ptr + rows[:, None].to(tl.int64) * width + cols[None, :]
            acc_g += tl.load(base, mask=mask, other=0.0)
            acc_b += tl.load(base + N, mask=mask & (has_beta != 0), other=0.0)
        tl.store(dgamma_ptr + cols, tl.sum(acc_g, axis=0).to(out_dtype), mask=col_mask)
        tl.store(dbeta_ptr + cols, tl.sum(acc_b, axis=0).to(out_dtype),
                 mask=col_mask & (has_beta != 0))
    else:
        acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        for start in range(0, P, BLOCK_P):
            rows = start + tl.arange(0, BLOCK_P)
            for c0 in range(0, n_col_blocks, BLOCK_N):
                cols = c0 + tl.arange(0, BLOCK_N)
                mask = (rows < P)[:, None] & (cols < n_col_blocks)[None, :]
                acc += tl.load(partial_ptr + rows[:, None].to(tl.int64) * width + 2 * N
                               + cols[None, :], mask=mask, other=0.0)
        tl.store(dalpha_ptr, tl.sum(tl.sum(acc, axis=1), axis=0).to(out_dtype))


# (BLOCK_N, ROWS, warps). The runtime picks the smallest block >= min(N, largest block).
# The 4096 buckets from benchmarks/tune_dyt.py on an H100 (8192 x 4096 bf16): forward 49.7 us
# (90 % of copy bandwidth) against 52.8 us at (1024, 4, 4); backward at 2 programs per
# multiprocessor (csrc/ops/dyt/dyt_cuda.cpp) 80.0 us (84 %) against 107.1 us at (1024, 4, 8)
# and 4 per multiprocessor. The 2048 buckets were the best of that sweep at their block.
_FWD_BUCKETS = ((256, 16, 4), (1024, 4, 4), (2048, 4, 8), (4096, 2, 16))
_BWD_BUCKETS = ((256, 16, 8), (1024, 4, 8), (2048, 2, 8), (4096, 1, 8))
# (rows, columns, warps) per step of the reduction, whose steps are latency-bound (as
# rms_norm_dw's: benchmarks/NOTES.md v18)
REDUCE_BLOCK = (256, 16, 8)

_FWD_ARGS = ("x_ptr", "alpha_ptr", "gamma_ptr", "beta_ptr", "y_ptr", "M", "N", "has_beta")
_BWD_ARGS = ("dy_ptr", "x_ptr", "alpha_ptr", "gamma_ptr", "dx_ptr", "partial_ptr", "M", "N",
             "rows_per_program", "n_col_blocks")
_REDUCE_ARGS = ("partial_ptr", "dalpha_ptr", "dgamma_ptr", "dbeta_ptr", "P", "N",
                "n_col_blocks", "has_beta")
_PARAMS = ("alpha_ptr", "gamma_ptr", "beta_ptr", "dalpha_ptr", "dgamma_ptr", "dbeta_ptr")
_TYPES = {"partial_ptr": "*fp32", "M": "i64", "N": "i32", "rows_per_program": "i64",
          "n_col_blocks": "i32", "P": "i32", "has_beta": "i32"}


def _signature(args, dt, pdt, constexprs):
    sig = {a: _TYPES.get(a, f"*{pdt}" if a in _PARAMS else f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        # bf16 / fp16 x: parameters in float32 (flag clear) or in x's dtype (FLAG_PARAMS_X).
        for pdt, pflag in ((("fp32", 0),) if dt == "fp32" else (("fp32", 0), (dt, FLAG_PARAMS_X))):
            for aligned in (0, FLAG_ALIGNED):
                flags = aligned | pflag

                def add(family, kernel, args, block, constexprs, warps):
                    sig = _signature(args, dt, pdt, constexprs)
                    out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                       signature=sig, constexprs=constexprs, num_warps=warps,
                                       flags=flags,
                                       divisible_by_16=aligned_args(sig, aligned, ("N",))))

                for block, rows, warps in _FWD_BUCKETS:
                    add("dyt_fwd", "dyt_fwd_kernel", _FWD_ARGS, block,
                        {"BLOCK_N": block, "ROWS": rows}, warps)
                for block, rows, warps in _BWD_BUCKETS:
                    add("dyt_bwd", "dyt_bwd_kernel", _BWD_ARGS, block,
                        {"BLOCK_N": block, "ROWS": rows}, warps)
        # The reduction's dtype is the parameters' (its outputs).
        sig = _signature(_REDUCE_ARGS, dt, dt, ("BLOCK_P", "BLOCK_N"))
        out.append(Variant(family="dyt_reduce", kernel="dyt_reduce_kernel", dtype=dt,
                           block=REDUCE_BLOCK[1], signature=sig,
                           constexprs={"BLOCK_P": REDUCE_BLOCK[0], "BLOCK_N": REDUCE_BLOCK[1]},
                           num_warps=REDUCE_BLOCK[2]))
    return out
