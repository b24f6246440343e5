"""Shared pieces of the Triton kernel sources: the variant record and small helpers.

Everything here is plain data or ``@triton.jit`` code. Importing it needs Triton but no
GPU and no torch; the build-time compiler (``cmake/fk_aot.py``) reads the ``variants``
function of every op module and compiles each variant for each requested arch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import triton
import triton.language as tl

# Flags a variant can be specialized on. The C++ side builds the same mask from the
# actual arguments (see csrc/runtime/kernels.h) and asks for the variant that matches.
FLAG_ALIGNED = 1  # every pointer 16-byte aligned, every row length/stride a multiple of 16
# With FLAG_ALIGNED: the count of rows (tokens) the tiles run over is a multiple of 16 too, and
# hinted so; the row masks of 16-row tiles are then uniform (benchmarks/NOTES.md v18).
FLAG_ROWS16 = 256
# A variant tuned for GPUs whose peak DRAM bandwidth is below 4 TB/s (the H100's HBM3 at
# 3.35 TB/s, where one sm_90a cubin also serves the H200's HBM3e at 4.8 TB/s). Launchers never
# ask for it: the runtime's picker takes it in place of the variant with the same flags and
# block on such a GPU, where the family has one.
FLAG_LOW_BANDWIDTH = 512

DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}

# The FP8 copies a quantizing kernel's variant writes, fixed at compile time (its constexpr
# COPIES), for a variant the launcher picks only for that layout; 0 (the default) reads them
# from the kernel's want_row / want_col arguments. Fixed, every branch on them folds away, as
# the JIT does for a flag passed as 1: moe_swiglu_fp8's tile 228.5 -> 213.0 us (H200,
# benchmarks/NOTES.md v35).
COPIES_BOTH = tl.constexpr(1)
COPIES_COLS = tl.constexpr(2)  # the column-wise copy alone
COPIES_ROWS = tl.constexpr(3)  # the row-wise copy alone


@dataclass(frozen=True)
class Variant:
    """One AOT build of one kernel.

    family:  the name the C++ op asks for, e.g. ``"rms_norm_fwd"``.
    kernel:  the ``@triton.jit`` function's name in the op module.
    dtype:   the element type the variant is built for (``fp32`` / ``bf16`` / ``fp16``).
    block:   the bucket the variant covers (a block size); the runtime picks the smallest
             block that is at least what the shape needs.
    flags:   bit mask of ``FLAG_*`` specializations.
    signature: argument name -> Triton type (``*bf16``, ``i64``, ``fp32``, ``constexpr``).
    constexprs: values of the ``constexpr`` arguments.
    cluster: programs launched together as one thread-block cluster (sm_90 and newer, at
             most 8); the kernel is compiled for one CTA per program either way, and the
             runtime launches it on grids that are a multiple of ``cluster``.
    maxnreg: cap on registers per thread (0: ptxas chooses), for more programs per SM.
    """

    family: str
    kernel: str
    dtype: str
    block: int
    signature: dict
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 1
    flags: int = 0
    divisible_by_16: tuple = field(default=())
    cluster: int = 1
    maxnreg: int = 0

    def key(self) -> str:
        return f"{self.family}.{self.dtype}.b{self.block}.f{self.flags}"


def aligned_args(signature: dict, flags: int, extra: tuple = ()) -> tuple:
    """Arguments that get Triton's divisibility-by-16 hint in an aligned variant: every
    pointer, plus the integer arguments named in ``extra`` (row lengths, strides)."""
    if not flags & FLAG_ALIGNED:
        return ()
    ptrs = tuple(name for name, ty in signature.items() if ty.startswith("*"))
    return ptrs + tuple(extra)


@triton.jit
def cluster_arrive(x):
    """Returns x; this program has started (arrives at the cluster barrier without memory
    ordering). The first exchange of the cluster's programs (cross_entropy's
    _cluster_exchange with first != 0, cluster_sums) waits for the whole cluster's."""
    return tl.inline_asm_elementwise("barrier.cluster.arrive.relaxed;\nmov.b32 $0, $1;", "=r,r",
                                     [x], dtype=tl.int32, is_pure=False, pack=1)


# The most programs a cluster_sums cluster may hold (the portable cluster size).
CLUSTER_MAX = 8


@triton.constexpr_function
def _cluster_sums_asm():
    """PTX for cluster_sums. Operands: outputs $0, $1; inputs a ($2), b ($3), n ($4)."""
    lines = ["{", f".shared .align 8 .f32 fk_cluster_sums[{2 * CLUSTER_MAX}];",
             ".reg .b32 %fk_a, %fk_r, %fk_o;", ".reg .f32 %fk_x, %fk_y;",
             ".reg .pred %fk_t, %fk_q;",
             "barrier.cluster.wait.acquire;",
             "mov.u32 %fk_a, fk_cluster_sums;",
             "mov.u32 %fk_o, %cluster_ctarank;", "shl.b32 %fk_o, %fk_o, 3;",
             "mov.u32 %fk_r, %tid.x;", "setp.eq.u32 %fk_t, %fk_r, 0;"]
    for j in range(CLUSTER_MAX):
        lines += [f"setp.gt.and.u32 %fk_q, $4, {j}, %fk_t;",
                  f"@%fk_q mapa.shared::cluster.u32 %fk_r, %fk_a, {j};",
                  "@%fk_q add.u32 %fk_r, %fk_r, %fk_o;",
                  "@%fk_q st.shared::cluster.v2.f32 [%fk_r], {$2, $3};"]
    lines += ["barrier.cluster.arrive.release;", "barrier.cluster.wait.acquire;",
              "mov.f32 $0, 0f00000000;", "mov.f32 $1, 0f00000000;"]
    for j in range(CLUSTER_MAX):
        lines += [f"setp.gt.u32 %fk_q, $4, {j};",
                  f"@%fk_q ld.shared.v2.f32 {{%fk_x, %fk_y}}, [%fk_a+{8 * j}];",
                  "@%fk_q add.f32 $0, $0, %fk_x;", "@%fk_q add.f32 $1, $1, %fk_y;"]
    return "\n".join(lines + ["}"])


@triton.jit
def cluster_sums(a, b, key, rank, n):
    """(sum of a, sum of b) over the n programs (n <= CLUSTER_MAX) of this program's
    thread-block cluster (launched with a cluster of n along x), added in rank order from
    0.0, so that every program of the cluster gets the same bits. Once per program, after
    cluster_arrive at its start: the first thread of each program stores its (a, b) into
    every program's shared memory (distributed shared memory) once the whole cluster has
    started, the cluster meets at one hardware barrier (release / acquire), and each program
    adds the n pairs from its own shared memory; no program writes into another afterwards,
    so each may leave at once. key (the cluster's work item) and rank (this program's rank
    in the cluster) name the exchange for emulations; the hardware needs neither."""
    return tl.inline_asm_elementwise(_cluster_sums_asm(), "=f,=f,f,f,r", [a, b, n],
                                     dtype=(tl.float32, tl.float32), is_pure=False, pack=1)


@triton.jit
def sigmoid_f32(x):
    return 1.0 / (1.0 + tl.exp(-x))


# --- blockwise FP8 (float8_e4m3fn), the format of python/fk/ops/fp8_quantize.py ----------
# Shared by fp8_quantize and the ops that quantize their output (rms_norm_fp8).

FP8_MAX = tl.constexpr(448.0)
FP8_MIN_SCALE = tl.constexpr(1.1754943508222875e-38)  # 2^-126, the smallest normal float32
FP8_INV_MAX = tl.constexpr(0.0022321429569274187)  # 1 / 448 rounded to float32


@triton.jit
def div448_rn(a):
    """a / 448 correctly rounded for float32 a >= 0 (inf and NaN give NaN), by the product
    with 1 / 448 corrected once by its exact remainder (two FMAs; Brisebarre-Muller-Raina's
    division by a constant): 3 instructions where div.rn takes about 10 and a slow path.
    Exhaustively equal to div.rn over every float32 a >= 0 whose quotient is normal
    (benchmarks/NOTES.md v28); below 2^-126 fp8_scale clamps it. Under the interpreter,
    div_rn itself."""
    if INTERPRETED:
        return tl.math.div_rn(a, tl.full(a.shape, 448.0, tl.float32))
    q = a * FP8_INV_MAX
    r = tl.fma(-q, 448.0, a)
    return tl.fma(r, FP8_INV_MAX, q)


@triton.jit
def rcp_rn(s):
    """1 / s correctly rounded for float32 s in [2^-126, 2^126] (NaN gives NaN): the
    hardware's approximate reciprocal refined by one Newton step in FMAs (3 instructions where
    div.rn takes about 10 and a slow path); exhaustively equal to div.rn over that range
    (benchmarks/NOTES.md v28). Under the interpreter, div_rn itself."""
    if INTERPRETED:
        return tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    y = rcp_approx(s)
    return tl.fma(tl.fma(-s, y, 1.0), y, y)


@triton.jit
def rcp_approx(x):
    """1 / x by rcp.approx.ftz.f32 (within an ulp or so; subnormals flush to 0): one MUFU op.
    Compiled kernels only (inline PTX)."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def fp8_scale(amax, pow2):
    """The dequantization scale of blocks of absolute maximum ``amax`` (fp8_amax's: NaN for a
    block holding a NaN): max(amax / 448, 2^-126) correctly rounded, 1 for amax 0, rounded
    up to a power of two when ``pow2 != 0``, NaN for amax inf or NaN."""
    s = div448_rn(amax)
    s = tl.where(amax == 0.0, 1.0, tl.maximum(s, FP8_MIN_SCALE))
    if pow2 != 0:
        bits = s.to(tl.int32, bitcast=True)
        up = (bits + 0x7FFFFF) & -0x800000  # next power of two; inf stays inf
        s = up.to(tl.float32, bitcast=True)
    return tl.where((amax == float("inf")) | (amax != amax), float("nan"), s)


@triton.jit
def fp8_quantize_values(x, s, out_ty: tl.constexpr = tl.float32):
    """x times the correctly rounded reciprocal of its block's scale s, clamped to [-448, 448]
    (NaN stays NaN), in fp32, for a store of element type ``out_ty`` to round. Pass s as one
    value per block (e.g. s[:, None]), so that the reciprocal is taken once a block. For
    float8_e4m3fn stores the clamp is the conversion's own (cvt.rn.satfinite: to +-448, NaN
    kept) and is not repeated here: the same bytes, 20-30 % fewer instructions with the
    NaN-propagating maxima of fp8_amax (benchmarks/NOTES.md v24); other element types (the
    interpreter tests' float32) get it explicitly."""
    q = x * rcp_rn(s)
    if out_ty != tl.float8e4nv:
        q = tl.where(q > FP8_MAX, FP8_MAX, tl.where(q < -FP8_MAX, -FP8_MAX, q))
    return q


@triton.jit
def max_nan(a, b):
    """max(a, b), NaN where either is NaN (PTX max.NaN)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


# Triton's interpreter (the CPU tests of the kernel sources) runs a reduction with a combine
# function element by element in Python; there fp8_amax takes an equivalent form that it runs
# as one numpy reduction. Compiled kernels never take it.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def sigmoid_approx(x):
    """1 / (1 + exp(-x)) in fp32 through the approximate exp2 and reciprocal of the hardware
    (ex2 / rcp .approx.ftz: within a few ulp of fp32; results below 2^-126 flush to 0): 4
    instructions an element, where tl.sigmoid's exp and division, careful of subnormals and of
    huge denominators, take about 12. NaN gives NaN, +inf 1, -inf 0. Under the interpreter,
    the formula itself."""
    if INTERPRETED:
        return sigmoid_f32(x)
    e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f",
                                  [x * -1.4426950408889634], dtype=tl.float32, is_pure=True,
                                  pack=1)
    return rcp_approx(1.0 + e)


@triton.jit
def fp8_amax(a, axis: tl.constexpr):
    """The maximum of a (absolute values) along axis, NaN where any is NaN: a block holding a
    NaN gets a NaN scale (fp8_scale). Under the interpreter a NaN reads as inf instead, which
    gives fp8_scale the same NaN scale."""
    if INTERPRETED:
        return tl.max(tl.where(a == a, a, float("inf")), axis)
    return tl.reduce(a, axis, max_nan)


@triton.jit
def fp8_store_rowwise(v, a, rows, cols, M, K, cb, q_ptr, s_ptr, pow2, end):
    """The row-wise copy of the fp32 rows v (rows `rows`, columns `cols` of an (M, K)
    matrix; each row one 1 x 128 block, a = |v|): data at q[rows, cols], scales at
    s[cb, rows]; rows from ``end`` (<= M) on are not stored."""
    s_r = fp8_scale(fp8_amax(a, 1), pow2)
    q = fp8_quantize_values(v, s_r[:, None], q_ptr.dtype.element_ty)
    tl.store(q_ptr + rows[:, None] * K + cols[None, :], q.to(q_ptr.dtype.element_ty),
             mask=(rows < end)[:, None] & (cols < K)[None, :])
    tl.store(s_ptr + cb * M + rows, s_r, mask=rows < end)


@triton.jit
def fp8_store_1x128(v, rb, cb, rows, cols, M, K, q_ptr, s_ptr, qt_ptr, st_ptr, want_row,
                    want_col, pow2):
    """Quantizes the fp32 tile v (rows x cols, tile (rb, cb) of an (M, K) matrix) in 1 x 128
    blocks and stores it: the row-wise copy (each row of the tile one block, so 128 columns
    a tile; data at q[rows, cols], scales at s[cb, rows]) when ``want_row``, the column-wise
    copy (each column of the tile one block, so 128 rows a tile; data at qt[cols, rows],
    stored as a transposed tile contiguous along M, scales at st[rb, cols]) when
    ``want_col``. Elements outside the matrix must read as 0 (they then neither raise nor
    NaN an amax) and are not stored."""
    rmask = rows < M
    cmask = cols < K
    a = tl.abs(v)
    if want_row != 0:
        fp8_store_rowwise(v, a, rows, cols, M, K, cb, q_ptr, s_ptr, pow2, M)
    if want_col != 0:
        s_c = fp8_scale(fp8_amax(a, 0), pow2)
        qt = fp8_quantize_values(v, s_c[None, :], qt_ptr.dtype.element_ty)
        tl.store(qt_ptr + cols[:, None] * M + rows[None, :],
                 tl.trans(qt).to(qt_ptr.dtype.element_ty), mask=cmask[:, None] & rmask[None, :])
        tl.store(st_ptr + rb * K + cols, s_c, mask=cmask)


@triton.jit
def fp8_bits(x, s, shift: tl.constexpr):
    """The float8_e4m3fn bits of x quantized with scale s, in a uint32 shifted left."""
    q = fp8_quantize_values(x, s, tl.float8e4nv).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return q.to(tl.uint32) << shift


@triton.jit
def fp8_word(x0, x1, x2, x3, s):
    """The float8_e4m3fn bytes of x0 .. x3 quantized with scale s as one little-endian
    int32 (x0 the lowest byte): two paired conversions (cvt.rn.satfinite.e4m3x2, the
    conversion Triton's own float8 cast uses, so the same bytes) and one move, where
    converting each value, widening its byte and shifting it in took about 4 instructions a
    value. Under the interpreter, the same word from fp8_bits."""
    if INTERPRETED:
        w = fp8_bits(x0, s, 0) | fp8_bits(x1, s, 8) | fp8_bits(x2, s, 16) | fp8_bits(x3, s, 24)
        return w.to(tl.int32, bitcast=True)
    r = rcp_rn(s)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 fk_lo, fk_hi; cvt.rn.satfinite.e4m3x2.f32 fk_lo, $2, $1; "
        "cvt.rn.satfinite.e4m3x2.f32 fk_hi, $4, $3; mov.b32 $0, {fk_lo, fk_hi}; }",
        "=r,f,f,f,f", [x0 * r, x1 * r, x2 * r, x3 * r], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def fp8_store_packed(x0, x1, x2, x3, grp, off, cols, M, K, rb, cb, q_ptr, s_ptr, qt_ptr, st_ptr,
                     want_row, want_col, pow2, end, words):
    """fp8_store_1x128 of a tile read as four slabs: xj (fp32, R x cols) holds rows
    4 * grp + off + j of an (M, K) matrix (0 <= off < 4; tile (rb, cb), its column-wise
    scales in row rb of st); rows from ``end`` (<= M) on are not stored. With ``words``
    (off == 0, M % 4 == 0, end % 4 == 0 and a 4-byte aligned qt) the column-wise copy is
    stored in 32-bit words: the float8 bytes of rows 4i .. 4i + 3 of a column make one
    little-endian word of qt (K, M) viewed as (K, M / 4) int32, so the transposed store
    moves a quarter as many elements (benchmarks/NOTES.md v17); without, each slab's bytes
    are stored as they are (the same bytes). Elements of rows from ``end`` on must read as
    0."""
    a0, a1, a2, a3 = tl.abs(x0), tl.abs(x1), tl.abs(x2), tl.abs(x3)
    if want_row != 0:
        fp8_store_rowwise(x0, a0, 4 * grp + off, cols, M, K, cb, q_ptr, s_ptr, pow2, end)
        fp8_store_rowwise(x1, a1, 4 * grp + (off + 1), cols, M, K, cb, q_ptr, s_ptr, pow2, end)
        fp8_store_rowwise(x2, a2, 4 * grp + (off + 2), cols, M, K, cb, q_ptr, s_ptr, pow2, end)
        fp8_store_rowwise(x3, a3, 4 * grp + (off + 3), cols, M, K, cb, q_ptr, s_ptr, pow2, end)
    if want_col != 0:
        s_c = fp8_scale(fp8_amax(max_nan(max_nan(a0, a1), max_nan(a2, a3)), 0), pow2)
        sc = s_c[None, :]
        if words:
            w = fp8_word(x0, x1, x2, x3, sc)
            wp = qt_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
            tl.store(wp + cols[None, :] * (M // 4) + grp[:, None], w,
                     mask=(grp < end // 4)[:, None] & (cols < K)[None, :])
        else:
            ty = qt_ptr.dtype.element_ty
            r = 4 * grp + off
            base = qt_ptr + cols[None, :] * M + r[:, None]
            cmask = (cols < K)[None, :]
            tl.store(base, fp8_quantize_values(x0, sc, ty).to(ty),
                     mask=(r < end)[:, None] & cmask)
            tl.store(base + 1, fp8_quantize_values(x1, sc, ty).to(ty),
                     mask=(r + 1 < end)[:, None] & cmask)
            tl.store(base + 2, fp8_quantize_values(x2, sc, ty).to(ty),
                     mask=(r + 2 < end)[:, None] & cmask)
            tl.store(base + 3, fp8_quantize_values(x3, sc, ty).to(ty),
                     mask=(r + 3 < end)[:, None] & cmask)
        tl.store(st_ptr + rb * K + cols, s_c, mask=cols < K)


@triton.jit
def fp8_store_tile(v, rows, cols, rmask, cmask, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, sb_row,
                   sb_col, want_row, want_col, pow2):
    """Quantizes the fp32 tile v of an (M, K) matrix at (rows, cols) (rmask, cmask: the rows
    and columns to store; elements outside must read as 0): its rows are 1 x 128 blocks of
    the row-wise copy (data q (M, K), scales in row sb_row of s (.., M)) when ``want_row``,
    its columns blocks of the column-wise copy (data qt (K, M), scales in row sb_col of
    st (.., K)) when ``want_col``."""
    a = tl.abs(v)  # a NaN in a block makes its scale NaN (fp8_amax)
    if want_row != 0:
        s_r = fp8_scale(fp8_amax(a, 1), pow2)
        q = fp8_quantize_values(v, s_r[:, None], q_ptr.dtype.element_ty)
        tl.store(q_ptr + rows[:, None] * K + cols[None, :], q.to(q_ptr.dtype.element_ty),
                 mask=rmask[:, None] & cmask[None, :])
        tl.store(s_ptr + sb_row * M + rows, s_r, mask=rmask)
    if want_col != 0:
        s_c = fp8_scale(fp8_amax(a, 0), pow2)
        qt = fp8_quantize_values(v, s_c[None, :], qt_ptr.dtype.element_ty)
        tl.store(qt_ptr + cols[:, None] * M + rows[None, :],
                 tl.trans(qt).to(qt_ptr.dtype.element_ty), mask=cmask[:, None] & rmask[None, :])
        tl.store(st_ptr + sb_col * K + cols, s_c, mask=cmask)


# --- expert segments: the per-segment column-wise copy of the MoE FP8 ops ------------------

@triton.jit
def segment_blocks_kernel(tpe_ptr, table_ptr, E, M, R, E_BLOCK: tl.constexpr, RB: tl.constexpr):
    """Row rb < R of table (R, 3) int64: (first row, end row, expert) of the rb-th 128-row
    block counted segment by segment, RB rows a program. The segments are the E
    (<= E_BLOCK) counts at tpe_ptr in order (negative ones read as 0); segment e's blocks are
    blocks blk_e .. blk_e + cdiv(M_e, 128) - 1 with blk_e = sum_{f<e} cdiv(M_f, 128); rows
    end at the segment's end (and at M). A block past the last one gets expert E, its first
    row 128 (rb - blocks) after the segments' end, and end = that end (no rows). The MoE
    FP8 ops' tile kernels read their block's row (segment_block): each used to scan the
    counts itself, a cumulative sum and four reductions across its warps before any data
    moved (benchmarks/NOTES.md v34)."""
    rb = tl.program_id(0).to(tl.int64) * RB + tl.arange(0, RB)
    ei = tl.arange(0, E_BLOCK)
    counts = tl.maximum(tl.load(tpe_ptr + ei, mask=ei < E, other=0), 0).to(tl.int64)
    nblk = (counts + 127) // 128
    # the segment holding block rb (E past the last one)
    e = tl.minimum(tl.sum((tl.cumsum(nblk, 0)[None, :] <= rb[:, None]).to(tl.int64), 1), E)
    before = ei[None, :] < e[:, None]
    start = tl.sum(tl.where(before, counts[None, :], 0), 1)
    blk0 = tl.sum(tl.where(before, nblk[None, :], 0), 1)
    count = tl.sum(tl.where(ei[None, :] == e[:, None], counts[None, :], 0), 1)
    row = table_ptr + rb * 3
    m = rb < R
    tl.store(row, start + (rb - blk0) * 128, mask=m)
    tl.store(row + 1, tl.minimum(start + count, M), mask=m)
    tl.store(row + 2, e, mask=m)


@triton.jit
def segment_block(table_ptr, rb):
    """(first row, end row, expert) of block rb, from segment_blocks_kernel's table."""
    row = table_ptr + rb.to(tl.int64) * 3
    return tl.load(row), tl.load(row + 1), tl.load(row + 2)


# The table kernel's variants: (E_BLOCK, RB) pairs, a [RB, E_BLOCK] tile a program.
SEGMENT_BLOCKS = ((64, 64), (256, 16), (1024, 4))


def segment_blocks_variants(family: str, dtypes, tpe_type: str) -> list:
    """The variants of segment_blocks_kernel under an op's family name, one per E_BLOCK
    (block) and dtype (the op picks them with its data, as every other kernel; the kernel
    does not depend on it), for counts of Triton type ``tpe_type``."""
    sig = {"tpe_ptr": tpe_type, "table_ptr": "*i64", "E": "i64", "M": "i64", "R": "i64",
           "E_BLOCK": "constexpr", "RB": "constexpr"}
    return [Variant(family=family, kernel="segment_blocks_kernel", dtype=dt, block=eb,
                    signature=dict(sig), constexprs={"E_BLOCK": eb, "RB": rb}, num_warps=4)
            for dt in dtypes for eb, rb in SEGMENT_BLOCKS]


# --- tokens routed to experts: one token's row of a (T, E) row map of moe_permute ----------
# (entries that are negative or not below N read as not routed)

@triton.jit
def moe_routed_count(map_row, E, N, BE: tl.constexpr):
    """How many experts the token whose row_map row starts at ``map_row`` is routed to."""
    n = 0
    for e0 in range(0, E, BE):
        e = e0 + tl.arange(0, BE)
        r = tl.load(map_row + e, mask=e < E, other=-1)
        n += tl.sum(((r >= 0) & (r < N)).to(tl.int32), axis=0)
    return n


@triton.jit
def moe_routed(map_row, w_row, E, N, prev, has_w, KB: tl.constexpr, BE: tl.constexpr):
    """The token's next KB routed entries in expert order, those of the experts above
    ``prev`` (-1 for the first ones): their rows (int64), weights (fp32, read at w_row; 1
    without has_w) and experts (int64), which of the KB exist, and the last expert picked
    (the ``prev`` of the call for the KB after them; only called again when all KB exist).
    The j-th entry's expert is picked out of each BE-wide chunk of the row by a masked
    minimum (in int32: E < 2^31), its weight by a masked sum of the chunk's weights (read
    with the chunk), and its row is then read at that expert: one reduction of a (KB, BE)
    tile a chunk without weights, where masked sums of rows, experts and weights took three
    (benchmarks/NOTES.md v30)."""
    j = tl.arange(0, KB)
    none = E.to(tl.int32)
    ex = tl.full((KB,), 0, dtype=tl.int32) + none
    w = tl.zeros((KB,), dtype=tl.float32)
    seen = 0
    for e0 in range(0, E, BE):
        e = e0 + tl.arange(0, BE)
        emask = e < E
        r = tl.load(map_row + e, mask=emask, other=-1)
        m = (r >= 0) & (r < N) & (e > prev)
        pos = seen + tl.cumsum(m.to(tl.int32), axis=0) - 1
        sel = m[None, :] & (pos[None, :] == j[:, None])
        ex = tl.minimum(ex, tl.min(tl.where(sel, e[None, :].to(tl.int32), none), axis=1))
        if has_w != 0:
            wv = tl.load(w_row + e, mask=emask & m, other=0.0).to(tl.float32)
            w += tl.sum(tl.where(sel, wv[None, :], 0.0), axis=1)
        seen += tl.sum(m.to(tl.int32), axis=0)
    valid = ex < none
    ex = ex.to(tl.int64)
    rows = tl.load(map_row + ex, mask=valid, other=0).to(tl.int64)
    if has_w == 0:
        w = tl.full((KB,), 1.0, dtype=tl.float32)
    return rows, w, ex, valid, tl.max(tl.where(valid, ex, prev), axis=0)


# --- RMSNorm pieces, shared by rms_norm and fused_add_rms_norm -----------------------------
# ``casting`` is the run-time casting mode of triton_src/rms_norm.py: 0 none, 1 llama,
# 2 gemma.

@triton.jit
def round_to(x, dtype):
    """x rounded to ``dtype`` and returned in fp32."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def rms_weight(w_ptr, cols, mask, offset, has_w, casting, dtype):
    """(offset + w) in fp32, rounded to ``dtype`` except in gemma mode; reads as ``offset``
    without a weight (``has_w == 0``: the load is masked off)."""
    w = tl.load(w_ptr + cols, mask=mask & (has_w != 0), other=0.0).to(tl.float32)
    wp = offset + w
    if casting != 2:
        wp = round_to(wp, dtype)
    return wp


@triton.jit
def rms_normalize(x, rstd, casting, dtype):
    """x * rstd, with rstd rounded to ``dtype`` in none mode and the product rounded to
    ``dtype`` except in gemma mode; in fp32."""
    if casting == 0:
        rstd = round_to(rstd, dtype)
    xh = x * rstd
    if casting != 2:
        xh = round_to(xh, dtype)
    return xh


@triton.jit
def _rms_bwd_chunk(dy_ptr, x_ptr, w_ptr, dy_row, x_row, start, N, offset, has_w, casting, dtype,
                   BLOCK_N: tl.constexpr):
    """One BLOCK_N chunk of a row for the looped backward: columns, mask, dy, x, offset + w
    (fp32). ``dy_row`` / ``x_row``: the row's first element offsets."""
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + x_row + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + dy_row + cols, mask=mask, other=0.0).to(tl.float32)
    return cols, mask, dy, x, rms_weight(w_ptr, cols, mask, offset, has_w, casting, dtype)


@triton.jit
def rms_norm_bwd_looped_rows(dy_ptr, ds_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, dy_stride,
                             ds_stride, x_stride, dx_stride, M, N, offset, rows_per_program,
                             has_w, has_ds, want_dx, want_dw, casting, BLOCK_N: tl.constexpr):
    """The RMSNorm backward of one program of a persistent grid, for any N (chunks of
    BLOCK_N, two passes per row): over its range of rows, dx = rstd * (dy * (offset + w) -
    x_hat * c) plus ds when ``has_ds`` (rounded once to x's dtype, stored when ``want_dx``),
    and its fp32 partial dw accumulated in row ``program_id`` of ``dw_ptr`` when
    ``want_dw``."""
    dtype = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    dw_row = dw_ptr + pid.to(tl.int64) * N
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        tl.store(dw_row + cols, tl.zeros((BLOCK_N,), dtype=tl.float32),
                 mask=(cols < N) & (want_dw != 0))
    for row in range(row_start, row_end):
        rstd = tl.load(rstd_ptr + row)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols, mask, dy, x, wp = _rms_bwd_chunk(dy_ptr, x_ptr, w_ptr, row * dy_stride,
                                                   row * x_stride, start, N, offset, has_w,
                                                   casting, dtype, BLOCK_N)
            acc += dy * wp * x * rstd
        c = tl.sum(acc, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols, mask, dy, x, wp = _rms_bwd_chunk(dy_ptr, x_ptr, w_ptr, row * dy_stride,
                                                   row * x_stride, start, N, offset, has_w,
                                                   casting, dtype, BLOCK_N)
            xh = x * rstd
            dx = rstd * (dy * wp - xh * c)
            ds = tl.load(ds_ptr + row * ds_stride + cols, mask=mask & (has_ds != 0), other=0.0)
            dx += ds.to(tl.float32)
            tl.store(dx_ptr + row * dx_stride + cols, dx.to(dtype), mask=mask & (want_dx != 0))
            wmask = mask & (want_dw != 0)
            dw = tl.load(dw_row + cols, mask=wmask, other=0.0)
            dw += dy * rms_normalize(x, rstd, casting, dtype)
            tl.store(dw_row + cols, dw, mask=wmask)


@triton.jit
def qk_head_rows(bi, nqb, b, s, s_mask, q_ptr, k_ptr, qo_ptr, ko_ptr, q_sb, q_sh, q_ss, k_sb,
                 k_sh, k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, Hq, Hkv,
                 BH: tl.constexpr):
    """The rotary-embedding ops' tiles over q and k together (rope, llama4_rope,
    qwen2vl_mrope): row pointers (input, output) and row mask [BS, BH] of head block ``bi``
    of the list [q head blocks..., k head blocks...] (nqb of q's), at batch b and sequence
    positions s (masked by s_mask), with each tensor's batch / head / seq strides. A block
    past the last one has an all-false mask."""
    is_q = bi < nqb
    h = tl.where(is_q, bi, bi - nqb) * BH + tl.arange(0, BH)
    mask = s_mask[:, None] & (h < tl.where(is_q, Hq, Hkv))[None, :]
    s64 = s.to(tl.int64)[:, None]
    h64 = h.to(tl.int64)[None, :]
    x_rows = (b * tl.where(is_q, q_sb, k_sb) + s64 * tl.where(is_q, q_ss, k_ss)
              + h64 * tl.where(is_q, q_sh, k_sh))
    o_rows = (b * tl.where(is_q, qo_sb, ko_sb) + s64 * tl.where(is_q, qo_ss, ko_ss)
              + h64 * tl.where(is_q, qo_sh, ko_sh))
    return tl.where(is_q, q_ptr, k_ptr) + x_rows, tl.where(is_q, qo_ptr, ko_ptr) + o_rows, mask
