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

Each kernel has a pointer version (masked tl.load pipelined with cp.async, any shape and
alignment) and TMA versions (``*_tma_kernel``, ``*_tma_ws_kernel``: descriptors built on
the device, plain or warp-specialized main loop) for aligned 16-bit variants; which one an
arch uses is data in ``_CONFIGS`` below (benchmarks/tune_swiglu_linear.py measures them).

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
def _store_tile(ptr, acc, row0, col0, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """acc (BLOCK_R, BLOCK_C) into the (rows, cols) row-major tensor at (row0, col0), masked."""
    rr = tl.arange(0, BLOCK_R)
    rc = tl.arange(0, BLOCK_C)
    off = row0.to(tl.int64) * cols + col0 + (rr[:, None] * cols + rc[None, :])
    mask = (rr < rows - row0)[:, None] & (rc < cols - col0)[None, :]
    tl.store(ptr + off, acc.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z, store_saved,
                  dtype, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """SiLU-mul of the two accumulators; z and / or the backward factors s, t stored (the
    switches are part of the store masks: no branch)."""
    z, s, t = _silu_factors(acc_g, acc_u)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    off = row0.to(tl.int64) * N + col0 + (rm[:, None] * N + rn[None, :])
    mask = (rm < M - row0)[:, None] & (rn < N - col0)[None, :]
    tl.store(z_ptr + off, z.to(dtype), mask=mask & (store_z != 0))
    tl.store(s_ptr + off, s.to(dtype), mask=mask & (store_saved != 0))
    tl.store(t_ptr + off, t.to(dtype), mask=mask & (store_saved != 0))


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
    _fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z, store_saved,
                  dtype, BLOCK_M, BLOCK_N)


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
    _store_tile(dx_ptr, acc_g + acc_u, row0, col0, M, K, BLOCK_M, BLOCK_K)


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
    _store_tile(dwg_ptr, acc_g, row0, col0, N, K, BLOCK_N, BLOCK_K)
    _store_tile(dwu_ptr, acc_u, row0, col0, N, K, BLOCK_N, BLOCK_K)


# --- TMA versions (16-bit dtypes, aligned variants only) -------------------------------
#
# The same three kernels with operand tiles fetched by the tensor memory accelerator from
# descriptors built on the device (one 128-byte descriptor per operand and program, in
# Triton's global scratch, which the runtime allocates). Loads past the edges read zeros,
# so the main loops carry no masks; stores stay masked pointer stores. Descriptors need a
# 16-byte aligned base and row strides of a multiple of 16 bytes: the aligned flag.
# Each comes as two kernels: plain software pipelining, and Triton's warp specialization of
# the main loop (`_ws`: one warp group issues the loads, the others the products; it applies
# to 4-warp configs, where Triton adds the consumer warp groups itself).


@triton.jit
def _fwd_tma(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K, store_z, store_saved,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             GROUP_M: tl.constexpr, WS: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    wg_desc = tl.make_tensor_descriptor(wg_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    wu_desc = tl.make_tensor_descriptor(wu_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WS):
        xt = x_desc.load([row0, k * BLOCK_K])
        acc_g = _dot(xt, wg_desc.load([col0, k * BLOCK_K]).T, acc_g)
        acc_u = _dot(xt, wu_desc.load([col0, k * BLOCK_K]).T, acc_u)
    _fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z, store_saved,
                  dtype, BLOCK_M, BLOCK_N)


@triton.jit
def _dx_tma(dz_ptr, s_ptr, t_ptr, wg_ptr, wu_ptr, dx_ptr, M, N, K, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
            WS: tl.constexpr):
    dtype = dx_ptr.dtype.element_ty
    pid_m, pid_k = _grouped_tile(tl.program_id(0), M, K, BLOCK_M, BLOCK_K, GROUP_M)
    row0 = pid_m * BLOCK_M
    col0 = pid_k * BLOCK_K
    dz_desc = tl.make_tensor_descriptor(dz_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    s_desc = tl.make_tensor_descriptor(s_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    t_desc = tl.make_tensor_descriptor(t_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    wg_desc = tl.make_tensor_descriptor(wg_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    wu_desc = tl.make_tensor_descriptor(wu_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    acc_g = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n in tl.range(0, tl.cdiv(N, BLOCK_N), warp_specialize=WS):
        dz = dz_desc.load([row0, n * BLOCK_N]).to(tl.float32)
        da = (dz * t_desc.load([row0, n * BLOCK_N]).to(tl.float32)).to(dtype)
        db = (dz * s_desc.load([row0, n * BLOCK_N]).to(tl.float32)).to(dtype)
        acc_g = _dot(da, wg_desc.load([n * BLOCK_N, col0]), acc_g)
        acc_u = _dot(db, wu_desc.load([n * BLOCK_N, col0]), acc_u)
    _store_tile(dx_ptr, acc_g + acc_u, row0, col0, M, K, BLOCK_M, BLOCK_K)


@triton.jit
def _dw_tma(dz_ptr, s_ptr, t_ptr, x_ptr, dwg_ptr, dwu_ptr, M, N, K, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
            WS: tl.constexpr):
    dtype = dwg_ptr.dtype.element_ty
    pid_n, pid_k = _grouped_tile(tl.program_id(0), N, K, BLOCK_N, BLOCK_K, GROUP_M)
    row0 = pid_n * BLOCK_N
    col0 = pid_k * BLOCK_K
    dz_desc = tl.make_tensor_descriptor(dz_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    s_desc = tl.make_tensor_descriptor(s_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    t_desc = tl.make_tensor_descriptor(t_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for m in tl.range(0, tl.cdiv(M, BLOCK_M), warp_specialize=WS):
        dz = dz_desc.load([m * BLOCK_M, row0]).T.to(tl.float32)
        da = (dz * t_desc.load([m * BLOCK_M, row0]).T.to(tl.float32)).to(dtype)
        db = (dz * s_desc.load([m * BLOCK_M, row0]).T.to(tl.float32)).to(dtype)
        xt = x_desc.load([m * BLOCK_M, col0])
        acc_g = _dot(da, xt, acc_g)
        acc_u = _dot(db, xt, acc_u)
    _store_tile(dwg_ptr, acc_g, row0, col0, N, K, BLOCK_N, BLOCK_K)
    _store_tile(dwu_ptr, acc_u, row0, col0, N, K, BLOCK_N, BLOCK_K)


@triton.jit
def swiglu_linear_fwd_tma_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K, store_z,
                                 store_saved, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _fwd_tma(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K, store_z, store_saved,
             BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, False)


@triton.jit
def swiglu_linear_fwd_tma_ws_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K,
                                    store_z, store_saved, BLOCK_M: tl.constexpr,
                                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                    GROUP_M: tl.constexpr):
    _fwd_tma(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K, store_z, store_saved,
             BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True)


@triton.jit
def swiglu_linear_dx_tma_kernel(dz_ptr, s_ptr, t_ptr, wg_ptr, wu_ptr, dx_ptr, M, N, K,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _dx_tma(dz_ptr, s_ptr, t_ptr, wg_ptr, wu_ptr, dx_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
            GROUP_M, False)


@triton.jit
def swiglu_linear_dx_tma_ws_kernel(dz_ptr, s_ptr, t_ptr, wg_ptr, wu_ptr, dx_ptr, M, N, K,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _dx_tma(dz_ptr, s_ptr, t_ptr, wg_ptr, wu_ptr, dx_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
            GROUP_M, True)


@triton.jit
def swiglu_linear_dw_tma_kernel(dz_ptr, s_ptr, t_ptr, x_ptr, dwg_ptr, dwu_ptr, M, N, K,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _dw_tma(dz_ptr, s_ptr, t_ptr, x_ptr, dwg_ptr, dwu_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
            GROUP_M, False)


@triton.jit
def swiglu_linear_dw_tma_ws_kernel(dz_ptr, s_ptr, t_ptr, x_ptr, dwg_ptr, dwu_ptr, M, N, K,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _dw_tma(dz_ptr, s_ptr, t_ptr, x_ptr, dwg_ptr, dwu_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
            GROUP_M, True)


# --- AOT variants ----------------------------------------------------------------------

# Tile configs per arch and element size, per kernel:
#   (style, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
# style "ptr": pointer loads pipelined by num_stages (cp.async) for every variant; "tma" /
# "tma_ws": the aligned variant uses the TMA kernel (warp-specialized with "tma_ws"), the
# unaligned one the pointer kernel with the same tiles. Per kernel, the reduction runs over
# BLOCK_K (fwd), BLOCK_N (dx), BLOCK_M (dw).
#
# sm_90 (H200: 227 KB shared memory and 64K registers per SM). 16-bit: 8 warps (two
# warpgroups) own a 128 x 128 tile of each of the two fp32 accumulators (128 registers a
# thread), one program per SM. Per pipeline stage fwd loads x 128x64 + Wg, Wu 2x 64x128
# (48 KB; 3 stages 144 KB), dx loads dz, s, t 3x 128x64 + Wg, Wu 2x 64x128 (80 KB; Triton
# double-buffers dz, s, t: 192 KB), dw loads dz, s, t 3x 64x128 + x 64x128 (64 KB; 144 KB).
# Each stage feeds 4 MFLOP of tensor-core work from 48-80 KB of shared memory. float32
# (three TF32 products per step) halves the tiles. Every config here compiles without
# register spills (ptxas -v) on its arch.
# sm_80 / sm_120 (mma.sync: operands and accumulators in registers; 163 / 99 KB of shared
# memory): the 16-bit sm_90 tiles spill there, so each accumulator is 128 x 64 (16-bit)
# and smaller for float32, all under 64 KB of shared memory. sm_100 / sm_103 (tcgen05,
# accumulators in tensor memory): the sm_90 tiles. Every arch ships the pointer style
# until the TMA styles have been measured and tested on its GPU.
_SM90 = {
    2: {"fwd": ("ptr", 128, 128, 64, 8, 8, 3),
        "dx": ("ptr", 128, 64, 128, 8, 8, 3),
        "dw": ("ptr", 64, 128, 128, 8, 8, 3)},
    4: {"fwd": ("ptr", 128, 64, 32, 8, 8, 3),
        "dx": ("ptr", 128, 32, 64, 8, 8, 3),
        "dw": ("ptr", 32, 128, 64, 8, 8, 3)},
}
_SM80 = {
    2: {"fwd": ("ptr", 128, 64, 64, 8, 8, 3),
        "dx": ("ptr", 128, 32, 64, 8, 8, 3),
        "dw": ("ptr", 32, 128, 64, 8, 8, 3)},
    4: {"fwd": ("ptr", 128, 32, 32, 8, 8, 3),
        "dx": ("ptr", 64, 16, 64, 8, 4, 3),
        "dw": ("ptr", 16, 64, 64, 8, 4, 3)},
}
_CONFIGS = {80: _SM80, 90: _SM90, 100: _SM90, 103: _SM90, 120: _SM80}
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
    """{element size: {kernel: (style, BM, BN, BK, GROUP_M, warps, stages)}} for `arch`
    (archs without their own entry use sm_90's)."""
    return _CONFIGS.get(arch, _SM90)


def signature(which: str, dt: str) -> dict:
    sig = {a: _INT_ARGS.get(a, f"*{dt}") for a in _ARGS[which]}
    sig.update({c: "constexpr" for c in _CONSTEXPRS})
    return sig


def kernel_name(which: str, style: str, flags: int) -> str:
    """The kernel a variant of `which` uses: TMA styles only where the aligned flag holds."""
    suffix = {"ptr": "", "tma": "_tma", "tma_ws": "_tma_ws"}[style]
    return f"swiglu_linear_{which}{suffix if flags & FLAG_ALIGNED else ''}_kernel"


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        for which, cfg in configs(arch)[_ELEM[dt]].items():
            style, bm, bn, bk, group, warps, stages = cfg
            sig = signature(which, dt)
            cx = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group}
            for flags in (0, FLAG_ALIGNED):
                out.append(Variant(family=f"swiglu_linear_{which}",
                                   kernel=kernel_name(which, style, flags), dtype=dt, block=bm,
                                   signature=sig, constexprs=cx, num_warps=warps,
                                   num_stages=stages, flags=flags,
                                   divisible_by_16=aligned_args(sig, flags, ("N", "K"))))
    return out
