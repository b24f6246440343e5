"""Fused SwiGLU projection: z = silu(x @ Wg^T) * (x @ Wu^T), and its backward.

x is (M, K) row-major, the weights Wg and Wu are (N, K) row-major (nn.Linear's layout), z is
(M, N). All tensors are contiguous (the C++ side copies once where needed), so row strides
are K and N.

Forward (``swiglu_linear_fwd_kernel``): one program per (BLOCK_M, BLOCK_N) tile of z, two
fp32 accumulators (a = x Wg^T, b = x Wu^T) fed by the same x tile, SiLU-mul epilogue in
fp32. With ``store_saved`` it also writes the two factors backward needs,
    s = silu(a)                      (the db factor: db = dz * s)
    t = b * silu'(a)                 (the da factor: da = dz * t)
rounded to the input dtype. The sigmoid is evaluated once here instead of once per output
tile in each backward GEMM. ``store_z`` and ``store_saved`` are run-time switches, so one
kernel serves training (z, s, t), inference (z) and the backward's recompute (s, t).

Backward, both GEMMs form [da, db] in their operand loads and never write them out:
  swiglu_linear_dx_kernel  dx = da @ Wg + db @ Wu, (BLOCK_M, BLOCK_K) tiles of dx, the
                           reduction runs over N in BLOCK_N steps.
  swiglu_linear_dw_kernel  dWg = da^T @ x, dWu = db^T @ x, (BLOCK_N, BLOCK_K) tiles of both,
                           two accumulators, the reduction runs over M in BLOCK_M steps.
da and db are rounded to the input dtype before the tensor-core product (what a separate
elementwise kernel followed by a GEMM would do); every accumulation is fp32.

Programs are ordered in groups of GROUP_M tile rows so that tiles running together share
operand panels in L2. Each tile's base offset is formed in int64 and the in-tile offsets in
int32, so tensors past 2^31 elements work. Edges are masked: any M, N, K.
"""
import os

import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args


@triton.jit
def _grouped_tile(pid, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                  GROUP: tl.constexpr):
    """Tile (row, col) of program `pid`, walking GROUP tile rows column by column."""
    tiles_r = tl.cdiv(rows, BLOCK_R)
    tiles_c = tl.cdiv(cols, BLOCK_C)
    per_group = GROUP * tiles_c
    first_r = (pid // per_group) * GROUP
    size_r = tl.minimum(tiles_r - first_r, GROUP)
    in_group = pid % per_group
    return first_r + in_group % size_r, in_group // size_r


# Triton 3.6's interpreter multiplies bfloat16 blocks as their raw 16-bit patterns; under
# it, _dot widens them to float32 first (exact, and the products accumulate in float32 as
# on tensor cores). Compiled kernels never take that branch.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _dot(a, b, acc):
    """acc + a @ b on tensor cores; float32 inputs as three TF32 products (about float32
    accuracy, like torch's default matmul), 16-bit inputs as they are."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    if _INTERPRETED and a.dtype == tl.bfloat16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _silu_factors(a, b):
    """silu(a) * b, and the backward factors s = silu(a), t = b * silu'(a); fp32."""
    sig = tl.sigmoid(a)
    silu = a * sig
    return silu * b, silu, b * (sig + silu * (1.0 - sig))


@triton.jit
def swiglu_linear_fwd_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K, store_z,
                             store_saved, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M - row0
    n_ok = rn < N - col0
    # x tile (BLOCK_M, BLOCK_K); weight tiles (BLOCK_K, BLOCK_N) read from (N, K) rows.
    x_ptrs = x_ptr + row0.to(tl.int64) * K + (rm[:, None] * K + rk[None, :])
    w_off = col0.to(tl.int64) * K + (rn[None, :] * K + rk[:, None])
    wg_ptrs = wg_ptr + w_off
    wu_ptrs = wu_ptr + w_off
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = rk < K - k * BLOCK_K
        xt = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & n_ok[None, :]
        gt = tl.load(wg_ptrs, mask=w_mask, other=0.0)
        ut = tl.load(wu_ptrs, mask=w_mask, other=0.0)
        acc_g = _dot(xt, gt, acc_g)
        acc_u = _dot(xt, ut, acc_u)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K
        wu_ptrs += BLOCK_K
    z, s, t = _silu_factors(acc_g, acc_u)
    out = row0.to(tl.int64) * N + col0 + (rm[:, None] * N + rn[None, :])
    mask = m_ok[:, None] & n_ok[None, :]
    if store_z != 0:
        tl.store(z_ptr + out, z.to(dtype), mask=mask)
    if store_saved != 0:
        tl.store(s_ptr + out, s.to(dtype), mask=mask)
        tl.store(t_ptr + out, t.to(dtype), mask=mask)


@triton.jit
def swiglu_linear_dx_kernel(dz_ptr, s_ptr, t_ptr, wg_ptr, wu_ptr, dx_ptr, M, N, K,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    dtype = dx_ptr.dtype.element_ty
    pid_m, pid_k = _grouped_tile(tl.program_id(0), M, K, BLOCK_M, BLOCK_K, GROUP_M)
    row0 = pid_m * BLOCK_M
    col0 = pid_k * BLOCK_K
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M - row0
    k_ok = rk < K - col0
    # dz, s, t tiles (BLOCK_M, BLOCK_N) of (M, N) rows; weight tiles (BLOCK_N, BLOCK_K).
    a_off = row0.to(tl.int64) * N + (rm[:, None] * N + rn[None, :])
    dz_ptrs = dz_ptr + a_off
    s_ptrs = s_ptr + a_off
    t_ptrs = t_ptr + a_off
    w_off = col0 + (rn[:, None] * K + rk[None, :])
    wg_ptrs = wg_ptr + w_off
    wu_ptrs = wu_ptr + w_off
    # Two accumulators, so that the two products of a step are independent and both stay
    # in flight (one chained accumulator makes the second wait for the first).
    acc_g = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n in range(0, tl.cdiv(N, BLOCK_N)):
        n_ok = rn < N - n * BLOCK_N
        a_mask = m_ok[:, None] & n_ok[None, :]
        dz = tl.load(dz_ptrs, mask=a_mask, other=0.0).to(tl.float32)
        da = (dz * tl.load(t_ptrs, mask=a_mask, other=0.0).to(tl.float32)).to(dtype)
        db = (dz * tl.load(s_ptrs, mask=a_mask, other=0.0).to(tl.float32)).to(dtype)
        w_mask = n_ok[:, None] & k_ok[None, :]
        gt = tl.load(wg_ptrs, mask=w_mask, other=0.0)
        ut = tl.load(wu_ptrs, mask=w_mask, other=0.0)
        acc_g = _dot(da, gt, acc_g)
        acc_u = _dot(db, ut, acc_u)
        dz_ptrs += BLOCK_N
        s_ptrs += BLOCK_N
        t_ptrs += BLOCK_N
        wg_ptrs += BLOCK_N * K
        wu_ptrs += BLOCK_N * K
    out = row0.to(tl.int64) * K + col0 + (rm[:, None] * K + rk[None, :])
    tl.store(dx_ptr + out, (acc_g + acc_u).to(dtype), mask=m_ok[:, None] & k_ok[None, :])


@triton.jit
def swiglu_linear_dw_kernel(dz_ptr, s_ptr, t_ptr, x_ptr, dwg_ptr, dwu_ptr, M, N, K,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # GROUP_M groups tile rows of the output, which are BLOCK_N rows of dW here.
    dtype = dwg_ptr.dtype.element_ty
    pid_n, pid_k = _grouped_tile(tl.program_id(0), N, K, BLOCK_N, BLOCK_K, GROUP_M)
    row0 = pid_n * BLOCK_N
    col0 = pid_k * BLOCK_K
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N - row0
    k_ok = rk < K - col0
    # dz^T, s^T, t^T tiles (BLOCK_N, BLOCK_M) of (M, N) rows; x tiles (BLOCK_M, BLOCK_K).
    a_off = row0 + (rn[:, None] + rm[None, :] * N)
    dz_ptrs = dz_ptr + a_off
    s_ptrs = s_ptr + a_off
    t_ptrs = t_ptr + a_off
    x_ptrs = x_ptr + col0 + (rm[:, None] * K + rk[None, :])
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for m in range(0, tl.cdiv(M, BLOCK_M)):
        m_ok = rm < M - m * BLOCK_M
        a_mask = n_ok[:, None] & m_ok[None, :]
        dz = tl.load(dz_ptrs, mask=a_mask, other=0.0).to(tl.float32)
        da = (dz * tl.load(t_ptrs, mask=a_mask, other=0.0).to(tl.float32)).to(dtype)
        db = (dz * tl.load(s_ptrs, mask=a_mask, other=0.0).to(tl.float32)).to(dtype)
        xt = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc_g = _dot(da, xt, acc_g)
        acc_u = _dot(db, xt, acc_u)
        dz_ptrs += BLOCK_M * N
        s_ptrs += BLOCK_M * N
        t_ptrs += BLOCK_M * N
        x_ptrs += BLOCK_M * K
    out = row0.to(tl.int64) * K + col0 + (rn[:, None] * K + rk[None, :])
    mask = n_ok[:, None] & k_ok[None, :]
    tl.store(dwg_ptr + out, acc_g.to(dtype), mask=mask)
    tl.store(dwu_ptr + out, acc_u.to(dtype), mask=mask)


# --- AOT variants ----------------------------------------------------------------------

# Tile configs per arch and element size: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages),
# where for each kernel BLOCK_K is its reduction step only in the forward (see the kernels).
# Default entries are used for archs without their own.
_CONFIGS = {
    "default": {
        2: {"fwd": (128, 128, 64, 8, 8, 3),
            "dx": (128, 64, 128, 8, 8, 3),
            "dw": (64, 128, 128, 8, 8, 3)},
        4: {"fwd": (64, 64, 32, 8, 4, 3),
            "dx": (64, 32, 64, 8, 4, 3),
            "dw": (32, 64, 64, 8, 4, 3)},
    },
}
_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}

_ARGS = {
    "fwd": ("x_ptr", "wg_ptr", "wu_ptr", "z_ptr", "s_ptr", "t_ptr", "M", "N", "K", "store_z",
            "store_saved"),
    "dx": ("dz_ptr", "s_ptr", "t_ptr", "wg_ptr", "wu_ptr", "dx_ptr", "M", "N", "K"),
    "dw": ("dz_ptr", "s_ptr", "t_ptr", "x_ptr", "dwg_ptr", "dwu_ptr", "M", "N", "K"),
}
_INT_ARGS = {"M": "i32", "N": "i32", "K": "i32", "store_z": "i32", "store_saved": "i32"}
_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")


def configs(arch: int) -> dict:
    """The tile configs of `arch`: {element size: {kernel: (BM, BN, BK, GROUP_M, warps, stages)}}."""
    return _CONFIGS.get(arch, _CONFIGS["default"])


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        cfgs = configs(arch)[_ELEM[dt]]
        for which, args in _ARGS.items():
            bm, bn, bk, group, warps, stages = cfgs[which]
            sig = {a: _INT_ARGS.get(a, f"*{dt}") for a in args}
            sig.update({c: "constexpr" for c in _CONSTEXPRS})
            cx = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group}
            for flags in (0, FLAG_ALIGNED):
                out.append(Variant(family=f"swiglu_linear_{which}",
                                   kernel=f"swiglu_linear_{which}_kernel", dtype=dt, block=bm,
                                   signature=sig, constexprs=cx, num_warps=warps,
                                   num_stages=stages, flags=flags,
                                   divisible_by_16=aligned_args(sig, flags, ("N", "K"))))
    return out
