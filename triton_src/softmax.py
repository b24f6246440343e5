"""Softmax over the last dimension: y = exp(x - max(x)) / sum(exp(x - max(x))), in fp32,
rounded once to the input dtype. Backward from the saved output: dx = y * (dy - sum(dy * y)).

Rows of -inf (fully masked) give NaN, like torch (max is -inf and -inf - (-inf) is NaN); a
+inf or a NaN anywhere in a row makes the whole row NaN, also like torch. The C++ side moves
any other softmax dim to the last one first (a copy).

The forward kernels shift by a per-group max instead of the row max: a group is the G
contiguous elements one thread loads with one 16-byte load (8 for 2-byte dtypes, 4 for
fp32), so each thread exponentiates its values as soon as they arrive, without waiting for
a row-wide max, and only the group maxima and sums are combined across threads:
  e = exp(x - m_g),  s_g = sum(e),  m = max(m_g),  y = e * exp(m_g - m) / sum(s_g * exp(m_g - m)).
A group of only -inf is shifted by 0 instead of -inf, so it adds 0 rather than NaN.
With ROW_MAX = 1 the single-pass forward shifts by the row max instead (a row-wide max
before any exp, then exp and sum): the H200 sweep found that form faster for the 32768
bucket (329 vs 335 us at 8192 x 32768 bf16), where a thread holds 32 values of the row.

Kernels:
  softmax_fwd_kernel         ROWS rows of at most BLOCK_N columns per program, held in
                             registers: one read of x, one write of y. ROW_MAX picks the
                             shift (per group or per row).
  softmax_fwd_looped_kernel  any N, in BLOCK_N chunks: pass 1 keeps running group maxima and
                             rescaled sums (online softmax), pass 2 writes y; each step loads
                             the next chunk before using this one. x is read twice;
                             the grid is persistent (PER_SM programs per multiprocessor, each
                             striding over rows) so that the rows in flight stay in L2 for the
                             second read.
  softmax_bwd_kernel         ROWS rows per program in registers: read y, dy; write dx.
                             With RELOAD = 1 only y stays in registers: dy is loaded once
                             for sum(dy * y) (marked evict_last) and again for dx, from L1 /
                             L2, which frees registers for wide rows (32768: 374.5 vs 379.6
                             us on the H200, at 32 warps instead of 16).
  softmax_bwd_looped_kernel  any N: pass 1 sums dy * y, pass 2 writes dx (persistent grid).
All offsets are int64, so tensors past 2^31 elements work.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _group_cols(BLOCK_N: tl.constexpr, G: tl.constexpr):
    """Column indices as a (BLOCK_N // G, G) tile: row g holds columns g*G .. g*G + G-1."""
    return (tl.arange(0, BLOCK_N // G) * G)[:, None] + tl.arange(0, G)[None, :]


@triton.jit
def _safe_shift(m):
    """m, or 0 where m is -inf (then exp(x - shift) is 0 for the -inf values, not NaN)."""
    return tl.where(m == NEG_INF, 0.0, m)


@triton.jit
def softmax_fwd_kernel(x_ptr, y_ptr, x_stride, y_stride, M, N, BLOCK_N: tl.constexpr,
                       ROWS: tl.constexpr, ROW_MAX: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    if ROW_MAX:
        cols = tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < M)[:, None] & (cols < N)
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols, mask=mask, other=NEG_INF)
        x = x.to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=1)[:, None])          # a row of -inf: NaN, as torch
        y = e * (1.0 / tl.sum(e, axis=1))[:, None]
        tl.store(y_ptr + rows[:, None] * y_stride + cols, y.to(y_ptr.dtype.element_ty),
                 mask=mask)
    else:
        G: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth
        cols = _group_cols(BLOCK_N, G)[None, :, :]
        mask = (rows < M)[:, None, None] & (cols < N)
        x = tl.load(x_ptr + rows[:, None, None] * x_stride + cols, mask=mask, other=NEG_INF)
        x = x.to(tl.float32)
        mg = tl.max(x, axis=2)                               # (ROWS, groups)
        e = tl.exp(x - _safe_shift(mg)[:, :, None])
        m = tl.max(mg, axis=1)                               # (ROWS,)
        w = tl.exp(mg - m[:, None])
        r = 1.0 / tl.sum(tl.sum(e, axis=2) * w, axis=1)
        y = e * (w * r[:, None])[:, :, None]
        tl.store(y_ptr + rows[:, None, None] * y_stride + cols,
                 y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _chunk(row_ptr, cols, N, other):
    """One chunk of a row (masked past N, so the prefetch past the last chunk reads nothing)."""
    return tl.load(row_ptr + cols, mask=cols < N, other=other)


@triton.jit
def softmax_fwd_looped_kernel(x_ptr, y_ptr, x_stride, y_stride, M, N, BLOCK_N: tl.constexpr,
                              PER_SM: tl.constexpr):
    G: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth
    cols0 = _group_cols(BLOCK_N, G)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):  # row: int64, as M
        x_row = x_ptr + row * x_stride
        y_row = y_ptr + row * y_stride
        # Running max and sum per group lane, rescaled when the max grows. Each step loads
        # the next chunk before working on this one, so two chunks are in flight.
        m_run = tl.full((BLOCK_N // G,), NEG_INF, tl.float32)
        d_run = tl.zeros((BLOCK_N // G,), tl.float32)
        x_next = _chunk(x_row, cols0, N, NEG_INF)
        for start in range(0, N, BLOCK_N):
            x = x_next.to(tl.float32)
            x_next = _chunk(x_row, start + BLOCK_N + cols0, N, NEG_INF)
            m_new = tl.maximum(m_run, tl.max(x, axis=1))
            shift = _safe_shift(m_new)
            d_run = d_run * tl.exp(m_run - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
            m_run = m_new
        m = tl.max(m_run, axis=0)
        r = 1.0 / tl.sum(d_run * tl.exp(m_run - m), axis=0)
        x_next = _chunk(x_row, cols0, N, NEG_INF)
        for start in range(0, N, BLOCK_N):
            x = x_next.to(tl.float32)
            x_next = _chunk(x_row, start + BLOCK_N + cols0, N, NEG_INF)
            cols = start + cols0
            tl.store(y_row + cols, (tl.exp(x - m) * r).to(y_ptr.dtype.element_ty), mask=cols < N)


@triton.jit
def softmax_bwd_kernel(dy_ptr, y_ptr, dx_ptr, dy_stride, y_stride, dx_stride, M, N,
                       BLOCK_N: tl.constexpr, ROWS: tl.constexpr, RELOAD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    dy_ptrs = dy_ptr + rows[:, None] * dy_stride + cols[None, :]
    y = tl.load(y_ptr + rows[:, None] * y_stride + cols[None, :], mask=mask, other=0.0)
    y = y.to(tl.float32)
    if RELOAD:
        # The two loads of dy differ in their eviction hint, so they stay two loads: dy
        # need not live in registers across the row-wide sum.
        dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy="evict_last")
        dot = tl.sum(y * dy.to(tl.float32), axis=1)
        dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
    else:
        dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
        dot = tl.sum(y * dy, axis=1)
    tl.store(dx_ptr + rows[:, None] * dx_stride + cols[None, :],
             (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _next_pair(y_row, dy_row, y_next, dy_next, next_cols, N):
    """The prefetched chunks of y and dy in fp32, and the loads of the next ones."""
    return (y_next.to(tl.float32), dy_next.to(tl.float32), _chunk(y_row, next_cols, N, 0.0),
            _chunk(dy_row, next_cols, N, 0.0))


@triton.jit
def softmax_bwd_looped_kernel(dy_ptr, y_ptr, dx_ptr, dy_stride, y_stride, dx_stride, M, N,
                              BLOCK_N: tl.constexpr, PER_SM: tl.constexpr):
    cols0 = tl.arange(0, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):  # row: int64, as M
        y_row = y_ptr + row * y_stride
        dy_row = dy_ptr + row * dy_stride
        dx_row = dx_ptr + row * dx_stride
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        y_next, dy_next = _chunk(y_row, cols0, N, 0.0), _chunk(dy_row, cols0, N, 0.0)
        for start in range(0, N, BLOCK_N):
            y, dy, y_next, dy_next = _next_pair(y_row, dy_row, y_next, dy_next,
                                                start + BLOCK_N + cols0, N)
            acc += y * dy
        dot = tl.sum(acc, axis=0)
        y_next, dy_next = _chunk(y_row, cols0, N, 0.0), _chunk(dy_row, cols0, N, 0.0)
        for start in range(0, N, BLOCK_N):
            y, dy, y_next, dy_next = _next_pair(y_row, dy_row, y_next, dy_next,
                                                start + BLOCK_N + cols0, N)
            cols = start + cols0
            tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty),
                     mask=cols < N)


# Floor at the target shape (H200, bf16, 8192 x 32768: 512 MiB per tensor, 4.2 TB/s copy
# bandwidth): forward reads x and writes y, 1.07 GB, 0.256 ms; backward reads y and dy and
# writes dx, 1.61 GB, 0.383 ms; forward + backward 2.68 GB, 0.639 ms. The single-pass
# kernels move exactly that; the looped ones read their input a second time (from L2 when
# the rows in flight fit).
#
# Single-pass buckets: (BLOCK_N, rows per program, warps, alt). Short rows: several per
# program, 2048 elements each. A row of BLOCK_N elements takes BLOCK_N / (32 * warps) fp32
# registers per thread and value; ptxas (sm_90a) fits the 32768 x 32-warp forward in 51
# (bf16) / 61 (fp32) registers without spilling. The backward holds y and dy: at 32768 it
# spills 32 B (bf16) / 60 B (fp32) per thread at 16 warps, so fp32 rows past 16384 take the
# looped backward. Without the alignment hints the loads are not vectorized and every
# element keeps its own address: past 16384 that spills 100+ B, so unaligned rows stop
# there. Longer rows take the looped kernels.
# alt = 1: the forward shifts by the row max (ROW_MAX), the backward reloads dy (RELOAD).
# The sweep measured both only at 32768, where each won (fwd 32 warps: 329.4 vs 334.8 us;
# bwd 32 warps: 374.5 vs 379.6 us for the plain kernel's best, 16 warps); the other
# buckets keep the per-group shift and the y + dy backward.
_BUCKETS = {  # sm_90 sweep (benchmarks/tune_softmax.py on the H200), fastest per bucket
    "fwd": ((256, 4, 2, 0), (1024, 2, 4, 0), (2048, 1, 4, 0), (4096, 2, 16, 0),
            (8192, 1, 16, 0), (16384, 1, 16, 0), (32768, 1, 32, 1)),
    "bwd": ((256, 32, 32, 0), (1024, 8, 8, 0), (2048, 1, 8, 0), (4096, 2, 16, 0),
            (8192, 1, 16, 0), (16384, 1, 16, 0), (32768, 1, 32, 1)),
}
_ALT = {"fwd": "ROW_MAX", "bwd": "RELOAD"}  # the constexpr that alt sets, per kind


def _max_block(kind: str, dt: str, flags: int) -> int:
    if not flags & FLAG_ALIGNED or (kind == "bwd" and dt == "fp32"):
        return 16384
    return 32768


# Looped kernels: (chunk, warps, programs per multiprocessor). Two resident programs per
# multiprocessor keep 2 * 132 rows in flight on an H200: 17 MB of 32768-wide bf16 rows for
# the forward (34 MB of y and dy for the backward), inside its 50 MB L2, so the second read
# of a row hits L2.
_LOOPED = {"fwd": (4096, 8, 2), "bwd": (4096, 8, 2)}

_ARGS = {"fwd": ("x_ptr", "y_ptr", "x_stride", "y_stride", "M", "N"),
         "bwd": ("dy_ptr", "y_ptr", "dx_ptr", "dy_stride", "y_stride", "dx_stride", "M", "N")}
_TYPES = {"x_stride": "i64", "y_stride": "i64", "dy_stride": "i64", "dx_stride": "i64",
          "M": "i64", "N": "i32"}
_ALIGNED_INTS = ("x_stride", "y_stride", "dy_stride", "dx_stride", "N")


def _variant(family, kernel, dt, flags, block, constexprs, warps, args):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    extra = tuple(a for a in _ALIGNED_INTS if a in sig)
    return Variant(family=family, kernel=kernel, dtype=dt, block=block, signature=sig,
                   constexprs=constexprs, num_warps=warps, flags=flags,
                   divisible_by_16=aligned_args(sig, flags, extra))


def variants(arch: int) -> list:
    """Per dtype and alignment: single-pass buckets up to the register limit (families
    softmax_{fwd,bwd} for aligned rows, softmax_{fwd,bwd}_unaligned for the others) and one
    looped kernel each (softmax_{fwd,bwd}_looped, both alignments). The same configs on
    every arch: sm_80, sm_100 and sm_120 have the same 64K registers per multiprocessor."""
    out = []
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED):
            for kind in ("fwd", "bwd"):
                family = f"softmax_{kind}" + ("" if flags & FLAG_ALIGNED else "_unaligned")
                for block, rows, warps, alt in _BUCKETS[kind]:
                    if block <= _max_block(kind, dt, flags):
                        out.append(_variant(family, f"softmax_{kind}_kernel", dt, flags, block,
                                            {"BLOCK_N": block, "ROWS": rows, _ALT[kind]: alt},
                                            warps, _ARGS[kind]))
                block, warps, per_sm = _LOOPED[kind]
                out.append(_variant(f"softmax_{kind}_looped", f"softmax_{kind}_looped_kernel",
                                    dt, flags, block, {"BLOCK_N": block, "PER_SM": per_sm},
                                    warps, _ARGS[kind]))
    return out
