"""Sparsemax over the last dimension (Martins and Astudillo, 2016): the Euclidean projection
of a row onto the probability simplex, y = max(x - tau, 0) with tau such that sum(y) = 1.
Backward from the saved output: with S = {y > 0}, dx = dy - mean_S(dy) on S and 0 elsewhere.

Finding tau without a sort. With z = x - max(x) (fp32), tau lies in [-1, 0) and is the root
of f(t) = sum(max(z - t, 0)) - 1, which is convex, piecewise linear and decreasing. Each
pass over the row held in registers takes the current t, forms S = {z > t} and the next
    t' = (sum_S z - 1) / |S|
(Michelot's algorithm, i.e. Newton's method on f). From t0 = -1, where f(t0) >= 0:
  - every iterate is a lower bound of tau (f(t) >= 0 gives S(t) containing tau's support,
    and the linear g(u) = sum_S (z - u) - 1 lies below f at tau, so its root t' <= tau);
  - t' >= t (f(t) = |S| (t' - t) >= 0), so the supports are nested and shrink;
  - the support stops shrinking exactly at tau: t' = t means f(t) = 0.
The kernel keeps t non-decreasing also under rounding (t' = max(t, ...)), so the supports
stay nested; it stops at the first pass whose support has the size of the previous one (then
both are the same set and t is the exact-support formula of that set). Every other pass
removes at least one element, so the loop ends after at most N + 1 passes whatever the
data: there is no iteration cap that could hand out an unconverged tau. Typical counts
(passes, including the final check), measured on the CPU: 2 for rows of equal values or
large spreads, 6 for randn rows of 4096 or 32768, 10-12 for uniform rows of 32768.

A +inf, a NaN or a row of only -inf (no finite maximum) gives a row of NaN; -inf entries
in a row with a finite maximum are 0. The C++ side moves any other dim to the last one
first (a copy).

Kernels (one row per program, held in registers; all offsets int64):
  sparsemax_fwd_kernel  read x once, write y once; the passes run on registers.
  sparsemax_bwd_kernel  read y and dy once, write dx once: one fused (sum, count) reduction.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _add_pair(a, b, c, d):
    return a + c, b + d


@triton.jit
def _add_triple(a, b, c, d, e, f):
    return a + d, b + e, c + f


@triton.jit
def _support_sum_count(z, t):
    """(sum of z over z > t, number of z > t) in one reduction."""
    inside = z > t
    return tl.reduce((tl.where(inside, z, 0.0), inside.to(tl.float32)), 0, _add_pair)


@triton.jit
def sparsemax_fwd_kernel(x_ptr, y_ptr, x_stride, y_stride, M, N, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=NEG_INF).to(tl.float32)
    m = tl.max(x, axis=0)
    z = x - m                             # masked lanes: -inf, never in a support
    inside = z > -1.0
    s, c, nans = tl.reduce((tl.where(inside, z, 0.0), inside.to(tl.float32),
                            (x != x).to(tl.float32)), 0, _add_triple)
    finite = ((m - m) == 0.0) & (nans == 0.0)   # a finite maximum and no NaN
    t = tl.maximum((s - 1.0) / c, -1.0)
    # Without a finite maximum no z exceeds t after the first pass (c stays 0): one more
    # pass, then the row is written as NaN below.
    done = False
    while not done:
        s, c_new = _support_sum_count(z, t)
        done = c_new == c
        t = tl.where(done, t, tl.maximum((s - 1.0) / c_new, t))
        c = c_new
    y = tl.maximum(z - t, 0.0)
    y = tl.where(finite, y, float("nan"))
    tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sparsemax_bwd_kernel(dy_ptr, y_ptr, dx_ptr, dy_stride, y_stride, dx_stride, M, N,
                         BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    y = tl.load(y_ptr + row * y_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
    on = y > 0.0
    s, c = tl.reduce((tl.where(on, dy, 0.0), on.to(tl.float32)), 0, _add_pair)
    mean = s / tl.maximum(c, 1.0)
    dx = tl.where(on, dy - mean, 0.0)
    tl.store(dx_ptr + row * dx_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# Floor at the target shape (bf16, 8192 x 32768: 512 MiB per tensor): forward reads x and
# writes y (2 x 512 MiB), backward reads y and dy and writes dx (3 x 512 MiB); each kernel
# moves exactly that. A row of BLOCK_N elements takes BLOCK_N / (32 * warps) fp32 registers
# per thread and value.
# Buckets: (BLOCK_N, warps). 32768 is the largest row on chip (32 fp32 values per thread at
# 32 warps); longer rows are rejected on CUDA.
_BUCKETS = {
    "fwd": ((256, 2), (1024, 4), (2048, 4), (4096, 8), (8192, 8), (16384, 16), (32768, 32)),
    "bwd": ((256, 2), (1024, 4), (2048, 4), (4096, 8), (8192, 16), (16384, 16), (32768, 32)),
}
MAX_BLOCK = 32768

_ARGS = {"fwd": ("x_ptr", "y_ptr", "x_stride", "y_stride", "M", "N"),
         "bwd": ("dy_ptr", "y_ptr", "dx_ptr", "dy_stride", "y_stride", "dx_stride", "M", "N")}
_TYPES = {"x_stride": "i64", "y_stride": "i64", "dy_stride": "i64", "dx_stride": "i64",
          "M": "i64", "N": "i32"}
_ALIGNED_INTS = ("x_stride", "y_stride", "dy_stride", "dx_stride", "N")


def variants(arch: int) -> list:
    """Per dtype, kind (fwd / bwd) and alignment: one variant per bucket, families
    sparsemax_{fwd,bwd} (16-aligned rows) and sparsemax_{fwd,bwd}_unaligned (any rows)."""
    out = []
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED):
            for kind in ("fwd", "bwd"):
                family = f"sparsemax_{kind}" + ("" if flags & FLAG_ALIGNED else "_unaligned")
                for block, warps in _BUCKETS[kind]:
                    sig = {a: _TYPES.get(a, f"*{dt}") for a in _ARGS[kind]}
                    sig["BLOCK_N"] = "constexpr"
                    extra = tuple(a for a in _ALIGNED_INTS if a in sig)
                    out.append(Variant(family=family, kernel=f"sparsemax_{kind}_kernel",
                                       dtype=dt, block=block, signature=sig,
                                       constexprs={"BLOCK_N": block}, num_warps=warps,
                                       flags=flags,
                                       divisible_by_16=aligned_args(sig, flags, extra)))
    return out
