"""Fused SwiGLU projection: z = silu(x @ Wg^T) * (x @ Wu^T), and the elementwise step of its
backward.

x is (M, K) row-major, the weights Wg and Wu are (N, K) row-major (nn.Linear's layout), z is
(M, N). All tensors are contiguous (the C++ side copies once where needed), so row strides
are K and N.

Forward (``swiglu_linear_fwd_kernel``): one program per (BLOCK_M, BLOCK_N) tile of z, two
fp32 accumulators (a = x Wg^T, b = x Wu^T) fed by the same x tile, SiLU-mul epilogue in
fp32. With ``store_saved`` it also writes the two factors backward needs,
    s = silu(a)                      (the db factor: db = dz * s)
    t = b * silu'(a)                 (the da factor: da = dz * t)
rounded to the input dtype. The sigmoid is evaluated once, here. The SCALED variants take
Falcon-H1's multipliers: z = silu(gm a) * b * dm, s = dm silu(gm a), t = gm dm b silu'(gm a)
(so the backward's kernel and products are unchanged); the plain ones ignore gm and dm.
``store_z`` and ``store_saved`` are run-time switches, so one kernel serves training (z, s, t), inference
(z) and the backward's recompute (s, t). An aligned 16-bit variant can instead use
``swiglu_linear_fwd_tma_kernel`` (operand tiles through TMA descriptors built on the
device); which one an arch uses is data in ``_CONFIGS`` below.

Backward: ``swiglu_linear_gate_grads_kernel`` forms da = dz * t and db = dz * s (fp32
product, one rounding) in one pass over dz, s and t; the C++ side may point da, db at t, s
themselves (each element is read and written by the same thread). The GEMMs dx = da Wg +
db Wu, dWg = da^T x, dWu = db^T x run through cuBLAS: at the Llama-3-8B shape on the H200,
Triton GEMMs that form da, db in their operand loads reached 59 % (dx) and 74 % (dW) of
cuBLAS (benchmarks/results/h200_tune_swiglu_linear.log), against about 5 % for writing
da, db out once.

Programs are ordered in groups of GROUP_M tile rows so that tiles running together share
operand panels in L2. Each tile's base offset is formed in int64 and the in-tile offsets in
int32, so tensors past 2^31 elements work. Edges are masked: any M, N, K.
"""
import os

import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

# Variant flag of the forward: the multipliers apply.
FLAG_SCALED = 2


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
def _fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z, store_saved,
                  gate_mult, down_mult, dtype, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  SCALED: tl.constexpr):
    """SiLU-mul of the two accumulators; z and / or the backward factors s, t stored (the
    switches are part of the store masks: no branch)."""
    if SCALED:
        z, s, t = _silu_factors(acc_g * gate_mult, acc_u)
        z = z * down_mult
        s = s * down_mult
        t = t * (gate_mult * down_mult)
    else:
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
                             store_saved, gate_mult, down_mult, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, PER_SM: tl.constexpr,
                             SCALED: tl.constexpr):
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
                  gate_mult, down_mult, dtype, BLOCK_M, BLOCK_N, SCALED)


# --- TMA version (16-bit dtypes, aligned variants only) --------------------------------
#
# The forward with operand tiles fetched by the tensor memory accelerator from descriptors
# built on the device (one 128-byte descriptor per operand and program, in Triton's global
# scratch, which the runtime allocates per launch). Loads past the edges read zeros, so the
# main loop carries no masks; stores stay masked pointer stores. Descriptors need a 16-byte
# aligned base and row strides of a multiple of 16 bytes: the aligned flag. Triton 3.6
# warp-specializes this loop only in a kernel of 4 warps; on the H200 that gave NaN in every
# form tried, and a plain warp-specialized GEMM reached 0.91 of cuBLAS (benchmarks/NOTES.md
# v11), so it is not used.


@triton.jit
def swiglu_linear_fwd_tma_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K, store_z,
                                 store_saved, gate_mult, down_mult, BLOCK_M: tl.constexpr,
                                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, PER_SM: tl.constexpr,
                                 SCALED: tl.constexpr):
    """P programs walk the tiles pid, pid + P, ... in the grouped order. The launcher starts
    one program per tile (PER_SM 0: one step each) or PER_SM per SM (a persistent grid:
    each program builds its descriptors once, and the tiles running together share operand
    panels in L2)."""
    dtype = x_ptr.dtype.element_ty
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    wg_desc = tl.make_tensor_descriptor(wg_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    wu_desc = tl.make_tensor_descriptor(wu_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            xt = x_desc.load([row0, k * BLOCK_K])
            acc_g = _dot(xt, wg_desc.load([col0, k * BLOCK_K]).T, acc_g)
            acc_u = _dot(xt, wu_desc.load([col0, k * BLOCK_K]).T, acc_u)
        _fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z,
                      store_saved, gate_mult, down_mult, dtype, BLOCK_M, BLOCK_N, SCALED)


# --- backward: the gate gradients ------------------------------------------------------

@triton.jit
def swiglu_linear_gate_grads_kernel(dz_ptr, t_ptr, s_ptr, da_ptr, db_ptr, n,
                                    BLOCK: tl.constexpr):
    """da = dz * t, db = dz * s over n elements, fp32 products; full blocks without a mask
    (16-byte accesses without a divisibility hint on n), the last one masked."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        dz = tl.load(dz_ptr + offs).to(tl.float32)
        t = tl.load(t_ptr + offs).to(tl.float32)
        s = tl.load(s_ptr + offs).to(tl.float32)
        tl.store(da_ptr + offs, (dz * t).to(da_ptr.dtype.element_ty))
        tl.store(db_ptr + offs, (dz * s).to(db_ptr.dtype.element_ty))
    else:
        mask = offs < n
        dz = tl.load(dz_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(t_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(da_ptr + offs, (dz * t).to(da_ptr.dtype.element_ty), mask=mask)
        tl.store(db_ptr + offs, (dz * s).to(db_ptr.dtype.element_ty), mask=mask)


# --- AOT variants ----------------------------------------------------------------------

# Forward tile configs per arch and element size:
#   (style, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
# style "ptr": pointer loads pipelined by num_stages (cp.async) for every variant; "tma":
# the aligned variant uses the TMA kernel with one program per tile, the unaligned one the
# pointer kernel with the same tiles; "persistent": the same, with the TMA kernel on a
# persistent grid (PER_SM 1: one program per SM).
#
# sm_90 (H200: 227 KB shared memory and 64K registers per SM). 16-bit: 8 warps (two
# warpgroups) own a 128 x 128 tile of each of the two fp32 accumulators (128 registers a
# thread), one program per SM. Each pipeline stage loads x 128x64 + Wg, Wu 2x 64x128
# (48 KB; 3 stages 144 KB) and feeds 4 MFLOP of tensor-core work. H200 sweeps at Llama-3-8B
# (8192 x 4096 -> 14336, bf16, writing z, s, t): one tile per program, TMA 618 TFLOP/s (86 %
# of cuBLAS), the best pointer config (BLOCK_K 32, 5 stages) 606, the pointer kernel at
# these tiles 576 (the unaligned fallback); the persistent TMA kernel at these tiles
# 647-677 with GROUP_M 32 (93-98 % of cuBLAS in two runs; GROUP_M 8 and 16 within noise of
# it, 64 slower; benchmarks/NOTES.md v6). float32 (three TF32 products per step)
# halves the tiles. Every config here compiles without register spills (ptxas -v) on its
# arch.
# sm_80 / sm_120 (mma.sync: operands and accumulators in registers; 163 / 99 KB of shared
# memory): the 16-bit sm_90 tiles spill there, so each accumulator is 128 x 64 (16-bit)
# and smaller for float32, all under 64 KB of shared memory. sm_100 / sm_103 (tcgen05,
# accumulators in tensor memory): the sm_90 tiles, pointer style until TMA has been
# measured and tested on those GPUs.
_SM90 = {2: ("persistent", 128, 128, 64, 32, 8, 3), 4: ("ptr", 128, 64, 32, 8, 8, 3)}
_SM100 = {2: ("ptr", 128, 128, 64, 8, 8, 3), 4: _SM90[4]}
_SM80 = {2: ("ptr", 128, 64, 64, 8, 8, 3), 4: ("ptr", 128, 32, 32, 8, 8, 3)}
_CONFIGS = {80: _SM80, 90: _SM90, 100: _SM100, 103: _SM100, 120: _SM80}
_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}

# The gate-gradient kernel: BLOCK elements per program, 8 warps (8 elements a thread: one
# 16-byte access per 16-bit tensor). It moves 5 x 2 bytes an element: 1.17 GB at 8192 x
# 14336 bf16, 0.28 ms at 4.2 TB/s.
GATE_GRADS_BLOCK, GATE_GRADS_WARPS = 2048, 8

FWD_ARGS = ("x_ptr", "wg_ptr", "wu_ptr", "z_ptr", "s_ptr", "t_ptr", "M", "N", "K", "store_z",
            "store_saved", "gate_mult", "down_mult")
_SCALAR_ARGS = {"M": "i32", "N": "i32", "K": "i32", "store_z": "i32", "store_saved": "i32",
             "gate_mult": "fp32", "down_mult": "fp32"}


def configs(arch: int) -> dict:
    """{element size: (style, BM, BN, BK, GROUP_M, warps, stages)} of the forward for `arch`
    (archs without their own entry use sm_90's pointer style)."""
    return _CONFIGS.get(arch, _SM100)


def fwd_signature(dt: str) -> dict:
    sig = {a: _SCALAR_ARGS.get(a, f"*{dt}") for a in FWD_ARGS}
    sig.update({c: "constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "PER_SM",
                                         "SCALED")})
    return sig


def kernel_name(style: str, flags: int) -> str:
    """The forward kernel a variant uses: TMA only where the aligned flag holds."""
    tma = style != "ptr" and flags & FLAG_ALIGNED
    return f"swiglu_linear_fwd{'_tma' if tma else ''}_kernel"


def programs_per_sm(style: str, kernel: str) -> int:
    """PER_SM of a variant: 1 (a persistent grid) for the TMA kernel in the persistent
    style, else 0 (one program per tile; the pointer kernel handles one tile only)."""
    return int(style == "persistent" and kernel == "swiglu_linear_fwd_tma_kernel")


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        style, bm, bn, bk, group, warps, stages = configs(arch)[_ELEM[dt]]
        fwd_sig = fwd_signature(dt)
        gate_sig = {"dz_ptr": f"*{dt}", "t_ptr": f"*{dt}", "s_ptr": f"*{dt}",
                    "da_ptr": f"*{dt}", "db_ptr": f"*{dt}", "n": "i64", "BLOCK": "constexpr"}
        for flags in (0, FLAG_ALIGNED):
            kernel = kernel_name(style, flags)
            per_sm = programs_per_sm(style, kernel)
            for scaled in (0, FLAG_SCALED):
                out.append(Variant(family="swiglu_linear_fwd", kernel=kernel,
                                   dtype=dt, block=bm, signature=fwd_sig,
                                   constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                                               "GROUP_M": group, "PER_SM": per_sm,
                                               "SCALED": int(scaled != 0)},
                                   num_warps=warps, num_stages=stages, flags=flags | scaled,
                                   divisible_by_16=aligned_args(fwd_sig, flags, ("N", "K"))))
            out.append(Variant(family="swiglu_linear_gate_grads",
                               kernel="swiglu_linear_gate_grads_kernel", dtype=dt,
                               block=GATE_GRADS_BLOCK, signature=gate_sig,
                               constexprs={"BLOCK": GATE_GRADS_BLOCK},
                               num_warps=GATE_GRADS_WARPS, flags=flags,
                               divisible_by_16=aligned_args(gate_sig, flags)))
    return out
