"""The mixture-of-experts router's GEMMs with float32 logits: logits = x @ W^T in float32
from 16-bit (or float32) x and W, and its two backward products, without a float32 copy of
either input.

One kernel, ``router_gemm_kernel``, computes C = A @ B (M x N, reduction over K) with fp32
accumulation; constexpr layout flags say how A and B are stored, so the three products are
three variants of it:

    forward   logits (T, E) fp32 = x (T, H) @ W^T      A = x row-major, B = W stored (E, H)
    grad x    dx (T, H) x.dtype  = g (T, E) @ W         A = g fp32 row-major, B = W row-major
    grad W    dW (E, H) fp32     = g^T @ x              A = g stored (T, E) (A_T), B = x

Products of a float32 tile with a 16-bit tile (the backward's g with W or x): for bfloat16
the float32 tile is split into hi = bf16(a) and lo = bf16(a - hi) and both are multiplied on
bfloat16 tensor cores (hi + lo holds 16 of a's 24 significand bits; the error of the product
is about 2^-17 of |a| |b|, below the rounding of a bfloat16 dx and far below any fp32 GEMM
from TF32). float16 cannot split that way (its range would flush small gradients), so
float16 B tiles are widened to float32 and multiplied as three TF32 products, as float32
inputs are (about float32 accuracy, like torch's default matmul).

The grad-W product reduces over the tokens (K = T, thousands) into a small output (E x H):
its grid has a second axis of ``splits`` programs per output tile, each reducing
``k_per_split`` rows of K into its own float32 slice of C (C then holds ``splits`` partial
products, which the C++ side sums in a fixed order: deterministic).

Programs are ordered in groups of GROUP_M tile rows so that tiles running together share
operand panels in L2. Tile bases are formed in int64, so tensors past 2^31 elements work.
Edges are masked: any M, N, K (the aligned variants assume 16-byte aligned bases and leading
dimensions that are multiples of 16 elements, for 16-byte loads).
"""
import os

import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

# Triton 3.6's interpreter multiplies bfloat16 blocks as their raw 16-bit patterns; under
# it, products of 16-bit tiles are formed from tiles widened to float32 (exact, and the
# products accumulate in float32 as on tensor cores). Compiled kernels never take that
# branch.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _mma(a, b, acc):
    """acc + a @ b for tiles of one dtype: 16-bit on tensor cores, float32 as three TF32
    products."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    if _INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _mixed_dot(a, b, acc):
    """acc + a @ b where a may be float32 and b 16-bit (see the module docstring)."""
    if a.dtype == b.dtype:
        acc = _mma(a, b, acc)
    elif b.dtype == tl.bfloat16:
        hi = a.to(tl.bfloat16)
        lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
        acc = _mma(lo, b, _mma(hi, b, acc))
    else:
        acc = _mma(a, b.to(tl.float32), acc)
    return acc


@triton.jit
def _tile_of(pid, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
             GROUP: tl.constexpr):
    """Tile (row, col) of program `pid`, walking GROUP tile rows column by column."""
    tiles_r = tl.cdiv(rows, BLOCK_R)
    tiles_c = tl.cdiv(cols, BLOCK_C)
    per_group = GROUP * tiles_c
    first_r = (pid // per_group) * GROUP
    size_r = tl.minimum(tiles_r - first_r, GROUP)
    in_group = pid % per_group
    return first_r + in_group % size_r, in_group // size_r


@triton.jit
def router_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, lda, ldb, ldc, k_per_split,
                       A_T: tl.constexpr, B_T: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] (+ split s's slice at c_ptr + s * M * ldc) = A @ B over K rows
    [s * k_per_split, min(K, (s + 1) * k_per_split)). A is (M, K) row-major with leading
    dimension lda, or with A_T stored as (K, M) (element (m, k) at k * lda + m); B is
    (K, N) row-major with ldb, or with B_T stored as (N, K) (element (k, n) at n * ldb + k).
    C is row-major with ldc, in c_ptr's dtype (one rounding of the fp32 accumulator)."""
    pid_m, pid_n = _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    split = tl.program_id(1)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    k0 = split * k_per_split
    k_len = tl.minimum(K - k0, k_per_split)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M - row0
    n_ok = rn < N - col0
    if A_T:
        a_ptrs = a_ptr + (k0.to(tl.int64) * lda + row0) + (rk[None, :] * lda + rm[:, None])
        a_step = BLOCK_K * lda.to(tl.int64)
    else:
        a_ptrs = a_ptr + (row0.to(tl.int64) * lda + k0) + (rm[:, None] * lda + rk[None, :])
        a_step = BLOCK_K
    if B_T:
        b_ptrs = b_ptr + (col0.to(tl.int64) * ldb + k0) + (rn[None, :] * ldb + rk[:, None])
        b_step = BLOCK_K
    else:
        b_ptrs = b_ptr + (k0.to(tl.int64) * ldb + col0) + (rk[:, None] * ldb + rn[None, :])
        b_step = BLOCK_K * ldb.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(k_len, BLOCK_K)):
        k_ok = rk < k_len - k * BLOCK_K
        at = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        bt = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _mixed_dot(at, bt, acc)
        a_ptrs += a_step
        b_ptrs += b_step
    c_off = (split.to(tl.int64) * M + row0) * ldc + col0 + (rm[:, None] * ldc + rn[None, :])
    tl.store(c_ptr + c_off, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


# --- AOT variants ----------------------------------------------------------------------
#
# The three products per dtype ("fwd", "dx", "dw": A, B, C element types and layouts),
# each aligned or not. Tile configs per arch and product: (BLOCK_M, BLOCK_N, BLOCK_K,
# GROUP_M, warps, stages). At the shape the router runs at (8192 tokens, hidden 2048, 256
# experts) the forward is as much a stream of x (32 MiB bf16) as a GEMM (8.6 GFLOP): 128 x
# 128 tiles give 128 programs over 2 expert tiles, x read once per expert tile (the second
# read mostly from L2). The float32 (and the split bf16) products do twice or three times
# the tensor-core work per step, so they take half as deep K steps. sm_80 / sm_120 (mma.sync,
# accumulators in registers, less shared memory): 128 x 64 tiles.
_PRODUCTS = {
    # name: (A dtype, B dtype, C dtype, A_T, B_T); "x" is the variant's dtype
    "fwd": ("x", "x", "fp32", 0, 1),
    "dx": ("fp32", "x", "x", 0, 0),
    "dw": ("fp32", "x", "fp32", 1, 0),
}
_SM90 = {"fwd": (128, 128, 64, 8, 8, 3), "dx": (128, 128, 32, 8, 8, 3),
         "dw": (128, 128, 32, 8, 8, 3)}
_SM80 = {"fwd": (128, 64, 64, 8, 8, 3), "dx": (128, 64, 32, 8, 8, 3),
         "dw": (128, 64, 32, 8, 8, 3)}
_CONFIGS = {80: _SM80, 90: _SM90, 100: _SM90, 103: _SM90, 120: _SM80}
# float32 operands (three TF32 products a step): half the K depth again.
_FP32_BLOCK_K = 32

ARGS = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "lda", "ldb", "ldc", "k_per_split")
CONSTEXPRS = ("A_T", "B_T", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
# Flag bits above FLAG_ALIGNED name the product (the C++ side asks for exactly one).
PRODUCT_FLAGS = {"fwd": 2, "dx": 4, "dw": 8}


def configs(arch: int) -> dict:
    return _CONFIGS.get(arch, _SM90)


def signature(product: str, dt: str) -> dict:
    a, b, c, _, _ = _PRODUCTS[product]
    types = [dt if t == "x" else t for t in (a, b, c)]
    sig = {"a_ptr": f"*{types[0]}", "b_ptr": f"*{types[1]}", "c_ptr": f"*{types[2]}"}
    sig.update({n: "i32" for n in ("M", "N", "K", "lda", "ldb", "ldc", "k_per_split")})
    sig.update({n: "constexpr" for n in CONSTEXPRS})
    return sig


# An aligned variant's divisibility hints: the strides and the problem's sizes (with them the
# bounds masks of whole tiles are uniform, so the loads vectorize; the C++ side asks for an
# aligned variant only where all of them are multiples of 16).
_ALIGNED_INTS = ("lda", "ldb", "ldc", "M", "N", "K", "k_per_split")


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        for product, (_, _, _, a_t, b_t) in _PRODUCTS.items():
            bm, bn, bk, group, warps, stages = configs(arch)[product]
            if dt == "fp32":
                bk = min(bk, _FP32_BLOCK_K)
            sig = signature(product, dt)
            for flags in (0, FLAG_ALIGNED):
                out.append(Variant(family="router_gemm", kernel="router_gemm_kernel", dtype=dt,
                                   block=bm, signature=sig,
                                   constexprs={"A_T": a_t, "B_T": b_t, "BLOCK_M": bm,
                                               "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                                   num_warps=warps, num_stages=stages,
                                   flags=flags | PRODUCT_FLAGS[product],
                                   divisible_by_16=aligned_args(sig, flags, _ALIGNED_INTS)))
    return out
