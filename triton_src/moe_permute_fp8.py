"""fk::moe_permute_fp8: moe_permute's gather of tokens into expert-major rows with the rows
quantized to float8_e4m3fn on the way (the format: python/fk/ops/fp8_quantize.py; the op:
python/fk/ops/moe_permute_fp8.py).

The row map (row_map (T, E) int32, src (N,) int32 with the token of each row or -1 for a
padding row, tpe (E,) int32 padded segment sizes) comes from moe_permute's map kernels
(triton_src/moe_permute.py); these kernels only move and quantize the data. Permuted row r
holds token src[r] (zeros where src[r] < 0), and the quantized copies are those of that
(N, H) matrix, which is never written in the tokens' dtype:

  moe_permute_fp8_scatter_kernel  the row-wise copy only: T + cdiv(N, ZR) programs. Program
        t < T reads token t's row once, quantizes it in 1 x 128 blocks (NB blocks a step)
        and writes the bytes and the scales to each of its rows (q (N, H), s (cdiv(H, 128),
        N)); with want_pp also pout[row] = pin[t, e]. Each later program writes the
        padding rows (src < 0) of its ZR-row block: zero data, scales 1.0, pout 0. A
        token's quantized row is the same for all its rows, so it is computed once.
  moe_permute_fp8_tile_kernel  a column-wise copy (and the row-wise one with it): a program
        per 128-row block of a segment (blocks counted segment by segment, the column-wise
        scales' rows, read from the table at blocks_ptr that _common.segment_blocks_kernel,
        family moe_permute_fp8_blocks, writes from tpe just before) and TILE_K columns. It
        gathers the block's rows from the tokens (src) and quantizes the tile both ways
        (fp8_store_tile): the column-wise copy qt (H, N) per segment (scales st, row rb),
        the row-wise one when want_row. TILE_K is 128, which the row-wise copy's 1 x 128
        blocks need; a column-wise block is 128 rows x 1 column, so the column-wise copy
        alone runs narrower tiles in its aligned variant (FLAG_COLS, COLS_TILE). PACKED (the
        aligned variant; N % 4 == 0) reads the block as four slabs of rows row0 + 4 i + j
        and stores the column-wise copy in 32-bit words of four rows' bytes where the
        block's first row and end are multiples of 4 (every block when pad_to is), byte by
        byte elsewhere (_common.fp8_store_packed, as the MoE SwiGLU forward does); a block
        of at most 64 rows runs a half-height tile. Programs past the last block cover the
        rows after the last segment, 128 each, as zero rows (the launcher gives one program
        more than st has rows, and st one row more, which it drops). Programs with cb == 0
        write pout (want_pp).

Offsets are int64. Built for sm_90 and newer only (as fp8_quantize).
"""
import triton
import triton.language as tl

from _common import (COPIES_COLS, DTYPES, FLAG_ALIGNED, SEGMENT_BLOCKS, Variant, aligned_args,
                     fp8_amax, fp8_quantize_values, fp8_scale, fp8_store_packed, fp8_store_tile,
                     moe_routed, moe_routed_count, segment_block,
                     segment_blocks_kernel,  # noqa: F401 (a kernel of this op's variants)
                     segment_blocks_variants)

KB = 8  # routed entries per token handled per pass (as moe_permute's)
BE = 128  # experts per chunk of a token's row-map row
ZR = 32  # rows per padding program of the scatter kernel
TILE = tl.constexpr(128)  # rows of the tile kernel's tiles, and columns but in COLS_TILE's form


@triton.jit
def moe_permute_fp8_scatter_kernel(x_ptr, row_map_ptr, q_ptr, s_ptr, pin_ptr, pout_ptr, src_ptr,
                                   T, H, E, N, want_pp, pow2, KB: tl.constexpr,
                                   BE: tl.constexpr, NB: tl.constexpr, ZR: tl.constexpr):
    pid = tl.program_id(0)
    nk = (H + 127) // 128  # rows of s
    if pid < T:
        t = pid.to(tl.int64)
        map_row = row_map_ptr + t * E
        cnt = moe_routed_count(map_row, E, N, BE)
        last = tl.full((), -1, tl.int64)
        for jb in range(0, cnt, KB):
            rows, w, ex, valid, last = moe_routed(map_row, map_row, E, N, last, 0, KB, BE)
            if want_pp != 0:
                pv = tl.load(pin_ptr + t * E + ex, mask=valid, other=0.0)
                tl.store(pout_ptr + rows, pv, mask=valid)
            for h0 in range(0, H, NB * 128):
                cols = h0 + tl.arange(0, NB * 128)
                cm = cols < H
                x = tl.load(x_ptr + t * H + cols, mask=cm, other=0.0).to(tl.float32)
                xb = tl.reshape(x, (NB, 128))
                s = fp8_scale(fp8_amax(tl.abs(xb), 1), pow2)
                q = fp8_quantize_values(xb, s[:, None], q_ptr.dtype.element_ty)
                q = tl.reshape(q.to(q_ptr.dtype.element_ty), (NB * 128,))
                tl.store(q_ptr + rows[:, None] * H + cols[None, :],
                         tl.broadcast_to(q[None, :], (KB, NB * 128)),
                         mask=valid[:, None] & cm[None, :])
                kb = h0 // 128 + tl.arange(0, NB)
                tl.store(s_ptr + kb[None, :] * N + rows[:, None],
                         tl.broadcast_to(s[None, :], (KB, NB)),
                         mask=valid[:, None] & (kb < nk)[None, :])
    else:
        rows = (pid - T).to(tl.int64) * ZR + tl.arange(0, ZR)
        rm = rows < N
        src = tl.load(src_ptr + rows, mask=rm, other=0)
        pad = rm & (src < 0)
        if tl.sum(pad.to(tl.int32), axis=0) > 0:
            for h0 in range(0, H, NB * 128):
                cols = h0 + tl.arange(0, NB * 128)
                tl.store(q_ptr + rows[:, None] * H + cols[None, :],
                         tl.zeros((ZR, NB * 128), dtype=q_ptr.dtype.element_ty),
                         mask=pad[:, None] & (cols < H)[None, :])
                kb = h0 // 128 + tl.arange(0, NB)
                tl.store(s_ptr + kb[None, :] * N + rows[:, None],
                         tl.full((ZR, NB), 1.0, dtype=tl.float32),
                         mask=pad[:, None] & (kb < nk)[None, :])
            tl.store(pout_ptr + rows, tl.zeros((ZR,), dtype=pout_ptr.dtype.element_ty),
                     mask=pad & (want_pp != 0))


@triton.jit
def _gathered(x_ptr, src_ptr, rows, cols, end, H):
    """Rows `rows` (< end) of P at columns `cols` (< H), fp32: the tokens src[row], zeros for
    padding rows (src < 0) and outside."""
    src = tl.load(src_ptr + rows, mask=rows < end, other=-1).to(tl.int64)
    return tl.load(x_ptr + src[:, None] * H + cols[None, :],
                   mask=(src >= 0)[:, None] & (cols < H)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _slab_tile(x_ptr, src_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row0, end, rb, cb, H, N, want_row,
               pow2, ROWS: tl.constexpr, TILE_K: tl.constexpr):
    """The block's rows row0 .. end - 1 (at most ROWS) at the cb-th TILE_K columns, read as
    four slabs of rows row0 + 4 i + j and quantized by _common.fp8_store_packed: the
    column-wise copy in 32-bit words when the block's first row and end are multiples of 4,
    byte by byte otherwise."""
    grp = (row0 >> 2) + tl.arange(0, ROWS // 4)
    off = row0 & 3
    r = 4 * grp + off
    cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
    fp8_store_packed(_gathered(x_ptr, src_ptr, r, cols, end, H),
                     _gathered(x_ptr, src_ptr, r + 1, cols, end, H),
                     _gathered(x_ptr, src_ptr, r + 2, cols, end, H),
                     _gathered(x_ptr, src_ptr, r + 3, cols, end, H),
                     grp, off, cols, N, H, rb, cb, q_ptr, s_ptr, qt_ptr, st_ptr, want_row, 1,
                     pow2, end, (off == 0) & ((end & 3) == 0))


@triton.jit
def moe_permute_fp8_tile_kernel(x_ptr, src_ptr, blocks_ptr, pin_ptr, pout_ptr, q_ptr, s_ptr,
                                qt_ptr, st_ptr, T, H, E, N, want_row, want_pp, pow2,
                                PACKED: tl.constexpr = 0, TILE_K: tl.constexpr = 128,
                                COPIES: tl.constexpr = 0):
    if COPIES == COPIES_COLS:  # the variant for the column-wise copy alone, fixed
        want_row = 0
    # Tile (rb, cb): rows of the rb-th block, columns cb * TILE_K ..; with want_row, TILE_K
    # must be 128 (cb is then the row-wise scales' row; the launcher sees to it).
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    row0, end, e = segment_block(blocks_ptr, rb)
    if e >= E:  # past the last segment: the rows after it, as zero rows
        end = N.to(tl.int64)
    end = tl.minimum(end, row0 + TILE)
    if PACKED:
        # N % 4 == 0: the tile as four slabs (the column-wise copy in words where the block
        # allows); a block of at most half a tile (a segment's short last block) as
        # half-height slabs, the same bytes for half the instructions.
        if end - row0 <= TILE // 2:
            _slab_tile(x_ptr, src_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row0, end, rb, cb, H, N,
                       want_row, pow2, TILE // 2, TILE_K)
        else:
            _slab_tile(x_ptr, src_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, row0, end, rb, cb, H, N,
                       want_row, pow2, TILE, TILE_K)
    else:
        rows = row0 + tl.arange(0, TILE)
        cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
        fp8_store_tile(_gathered(x_ptr, src_ptr, rows, cols, end, H), rows, cols, rows < end,
                       cols < H, q_ptr, s_ptr, qt_ptr, st_ptr, N, H, cb, rb, want_row, 1, pow2)
    if (want_pp != 0) & (cb == 0):
        rows = row0 + tl.arange(0, TILE)
        src = tl.load(src_ptr + rows, mask=rows < end, other=-1).to(tl.int64)
        p = tl.load(pin_ptr + src * E + e, mask=src >= 0, other=0.0)
        tl.store(pout_ptr + rows, p, mask=rows < end)


_FP8 = {a: "*fp8e4nv" for a in ("q_ptr", "qt_ptr")}
_TYPES = {**_FP8, "s_ptr": "*fp32", "st_ptr": "*fp32", "row_map_ptr": "*i32", "src_ptr": "*i32",
          "blocks_ptr": "*i64", "T": "i64", "H": "i64", "E": "i64", "N": "i64", "want_pp": "i32",
          "want_row": "i32", "pow2": "i32"}
_KERNELS = {
    # family: (kernel, arguments, constexprs)
    "moe_permute_fp8_scatter": ("moe_permute_fp8_scatter_kernel",
                                ("x_ptr", "row_map_ptr", "q_ptr", "s_ptr", "pin_ptr",
                                 "pout_ptr", "src_ptr", "T", "H", "E", "N", "want_pp", "pow2"),
                                ("KB", "BE", "NB", "ZR")),
    "moe_permute_fp8_tile": ("moe_permute_fp8_tile_kernel",
                             ("x_ptr", "src_ptr", "blocks_ptr", "pin_ptr", "pout_ptr", "q_ptr",
                              "s_ptr", "qt_ptr", "st_ptr", "T", "H", "E", "N", "want_row",
                              "want_pp", "pow2"), ("PACKED", "TILE_K", "COPIES")),
}
_PROBS_ARGS = ("pin_ptr", "pout_ptr")
_ALIGNED_ARGS = ("x_ptr", "q_ptr", "s_ptr", "qt_ptr", "st_ptr")
FLAG_PROBS_F32 = 2  # as triton_src/moe_permute.py: float32 probs with 16-bit tokens
FLAG_COLS = 4  # the tile kernel's form for the column-wise copy alone (aligned variants only)
# 128-column blocks per step of the scatter kernel (2 blocks: 512 bytes of a 16-bit row).
NB = {"fp32": 1, "bf16": 2, "fp16": 2}
SCATTER_WARPS = 1  # one token a program, as moe_permute's scatter
# Column-wise copy: at most this many experts (segment_blocks_kernel's largest E_BLOCK; the
# C++ launcher checks).
MAX_EXPERTS = SEGMENT_BLOCKS[-1][0]
# Warps of the tile kernel, plain (PACKED = 0) and slab (PACKED = 1) forms: as the MoE SwiGLU
# forward's (triton_src/swiglu_fp8.py), whose tiles are the same.
TILE_WARPS = (8, 4)
# (TILE_K, warps) of the slab form (PACKED = 1) writing the column-wise copy alone (FLAG_COLS):
# 128 x 64 tiles at 2 warps (tune_moe_permute_fp8.py, linghe's shape, H200, JIT: 187.0 us
# against 208.4 for 128 x 128 at 4 warps; 128 x 64 at 4 warps 231.1, and the library at that
# config 0.2321 -> 0.2558 ms; benchmarks/NOTES.md v33).
COLS_TILE = (64, 2)


def variants(arch: int) -> list:
    if arch < 89:  # no FP8 conversions before sm_89 (the sm_80 cubins serve all of 8.x)
        return []
    out = []
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED, FLAG_PROBS_F32, FLAG_ALIGNED | FLAG_PROBS_F32):
            if dt == "fp32" and flags & FLAG_PROBS_F32:
                continue  # fp32 tokens: probs are fp32 already
            pdt = "fp32" if flags & FLAG_PROBS_F32 else dt
            for family, (kernel, args, cx) in _KERNELS.items():
                sig = {a: _TYPES.get(a, f"*{pdt}" if a in _PROBS_ARGS else f"*{dt}")
                       for a in args}
                sig.update({k: "constexpr" for k in cx})
                # FLAG_ALIGNED: H a multiple of 16 and x 16-byte aligned (16-byte loads and
                # stores of rows; the outputs are fresh allocations)
                hints = aligned_args({a: sig[a] for a in _ALIGNED_ARGS if a in sig}, flags,
                                     ("H",))
                if family == "moe_permute_fp8_scatter":
                    out.append(Variant(family=family, kernel=kernel, dtype=dt, block=1,
                                       signature=sig,
                                       constexprs={"KB": KB, "BE": BE, "NB": NB[dt], "ZR": ZR},
                                       num_warps=SCATTER_WARPS, flags=flags,
                                       divisible_by_16=hints))
                    continue
                # The aligned variant (N % 4 == 0 too) reads slabs (PACKED = 1), at 128
                # columns and, for the column-wise copy alone, at COLS_TILE's (FLAG_COLS),
                # that one compiled for that copy (COPIES; H200, the library at linghe's
                # shape: 0.1874 -> 0.1599 ms). Both copies fixed so went 0.2416 -> 0.2470 ms
                # (three A/B pairs), so that form reads want_row (benchmarks/NOTES.md v35).
                packed = int(bool(flags & FLAG_ALIGNED))
                forms = [(0, TILE.value, TILE_WARPS[packed], 0)]
                if packed:
                    forms.append((FLAG_COLS, *COLS_TILE, COPIES_COLS.value))
                for form, tile_k, warps, copies in forms:
                    out.append(Variant(family=family, kernel=kernel, dtype=dt,
                                       block=MAX_EXPERTS, signature=sig,
                                       constexprs={"PACKED": packed, "TILE_K": tile_k,
                                                   "COPIES": copies},
                                       num_warps=warps, flags=flags | form,
                                       divisible_by_16=hints))
    # The column-wise copy's table of blocks (the padded counts, int32).
    return out + segment_blocks_variants("moe_permute_fp8_blocks", DTYPES, "*i32")
