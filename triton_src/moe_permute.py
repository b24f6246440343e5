"""Mixture-of-experts token permutation: fk::moe_permute and fk::moe_unpermute (the
semantics and the row map are defined in python/fk/ops/moe_permute.py).

routing_map (T, E) holds one byte per (token, expert) (a bool tensor's storage, 0 / 1).
The row map is built on the device in three small launches, with no host synchronisation:

  moe_permute_count_kernel  (cdiv(T, BT), cdiv(E, BE)) programs: the number of routed
        tokens of each block of BT tokens per expert, into blk (cdiv(T, BT), E) int32.
  moe_permute_scan_kernel   cdiv(E, BE) programs: blk becomes, per expert, the exclusive
        prefix sum over the token blocks; tokens_per_expert[e] = its count rounded up to a
        multiple of pad_to.
  moe_permute_map_kernel    (cdiv(T, BT), cdiv(E, BE)) programs: each expert's segment
        starts at the sum of the padded counts of the experts before it; token t's row for
        expert e is that start + blk[t's block, e] + the number of routed tokens of e before
        t in its block. row_map[t, e] = that row, or -1 where t is not routed to e (or the
        row is not below N, the rows allocated); src[row] = t for every row written (src
        starts as -1: the rows left at -1 are padding); *ok = whether the padded segments
        fit in the N rows (for the device-side assert of a row bound: no host reduction).

Then one launch moves the data (int64 element offsets throughout):

  moe_permute_scatter_kernel  T + cdiv(N, ZR) programs. Program t < T reads token t's row
        of x once and writes it (times w[t, e] when has_w) to each of its rows; with want_pp
        it also writes pin[t, e] to pout[row]; with want_dot it writes dw[t, e] = the dot
        product of x's row with other[row] (0 for the experts t is not routed to). Each
        later program zeroes the rows of its ZR-row block whose src is -1 (padding, and the
        rows past the last segment), and their pout.
  moe_unpermute_gather_kernel  T programs: out[t] = sum over t's routed experts e, in
        expert order, of y[row_map[t, e]] (times w[t, e] when has_w), in fp32, rounded
        once; with want_gpp also dp[t, e] = gpp[row_map[t, e]] (0 where not routed).
  moe_permute_invert_kernel  src[row_map[t, e]] = t for every routed (t, e): the padding
        rows of a given row map, for the backward of moe_unpermute.

A token's routed experts are found in its row of row_map, KB at a time (_common.moe_routed):
the j-th routed expert above the last one picked is found in each BE-wide chunk by a masked
minimum, so that any number of experts per token (and any E) works; up to KB experts per
token take one pass.
Entries that are negative or not below N read as not routed.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args, moe_routed, moe_routed_count

# probs-typed pointers (w, pin, pout, dw, gpp, dp) are float32 while the tokens are 16-bit
FLAG_PROBS_F32 = 2

KB = 8  # routed entries per token handled per pass
BE = 128  # experts per chunk of the compaction
BT_MAP = 64  # tokens per block of the map kernels
BE_MAP = 64  # experts per block of the map kernels
# The scan: token blocks per step and experts per program; each program's steps are one
# dependent chain, so fewer, taller steps over more programs (H200, 8192 tokens x 256
# experts: 3.74 us at 64 x 64, 2.11 at these; tune_moe_permute.py --part map,
# benchmarks/NOTES.md v31)
NBB = 128
BE_SCAN = 16
ZR = 32  # rows per zeroing program of the scatter kernel


@triton.jit
def moe_permute_count_kernel(map_ptr, blk_ptr, T, E, BT: tl.constexpr, BE: tl.constexpr):
    b = tl.program_id(0)
    t = b.to(tl.int64) * BT + tl.arange(0, BT)
    e = tl.program_id(1).to(tl.int64) * BE + tl.arange(0, BE)
    mask = (t < T)[:, None] & (e < E)[None, :]
    m = tl.load(map_ptr + t[:, None] * E + e[None, :], mask=mask, other=0)
    cnt = tl.sum((m != 0).to(tl.int32), axis=0)
    tl.store(blk_ptr + b * E + e, cnt, mask=e < E)


@triton.jit
def moe_permute_scan_kernel(blk_ptr, tpe_ptr, NB, E, pad_to, NBB: tl.constexpr,
                            BE: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BE + tl.arange(0, BE)
    emask = e < E
    running = tl.zeros((BE,), dtype=tl.int32)
    for b0 in range(0, NB, NBB):
        b = b0 + tl.arange(0, NBB).to(tl.int64)
        mask = (b < NB)[:, None] & emask[None, :]
        offs = b[:, None] * E + e[None, :]
        c = tl.load(blk_ptr + offs, mask=mask, other=0)
        excl = tl.cumsum(c, axis=0) - c + running[None, :]
        tl.store(blk_ptr + offs, excl, mask=mask)
        running += tl.sum(c, axis=0)
    padded = (running + pad_to - 1) // pad_to * pad_to
    tl.store(tpe_ptr + e, padded, mask=emask)


@triton.jit
def moe_permute_map_kernel(map_ptr, blk_ptr, tpe_ptr, row_map_ptr, src_ptr, ok_ptr, T, E, N,
                           BT: tl.constexpr, BE: tl.constexpr):
    b = tl.program_id(0)
    e0 = tl.program_id(1) * BE
    # the start of this chunk's first segment: the padded counts of the experts before it
    base = tl.zeros((BE,), dtype=tl.int64)
    for c0 in range(0, e0, BE):
        base += tl.load(tpe_ptr + c0 + tl.arange(0, BE)).to(tl.int64)
    start = tl.sum(base, axis=0)
    e = e0.to(tl.int64) + tl.arange(0, BE)
    emask = e < E
    p = tl.load(tpe_ptr + e, mask=emask, other=0).to(tl.int64)
    seg = start + tl.cumsum(p, axis=0) - p
    prefix = tl.load(blk_ptr + b * E + e, mask=emask, other=0).to(tl.int64)
    t = b.to(tl.int64) * BT + tl.arange(0, BT)
    mask = (t < T)[:, None] & emask[None, :]
    m = tl.load(map_ptr + t[:, None] * E + e[None, :], mask=mask, other=0) != 0
    rank = tl.cumsum(m.to(tl.int32), axis=0).to(tl.int64) - 1
    row = (seg + prefix)[None, :] + rank
    ok = m & (row < N)
    tl.store(row_map_ptr + t[:, None] * E + e[None, :], tl.where(ok, row, -1).to(tl.int32),
             mask=mask)
    tl.store(src_ptr + row, (t[:, None] + tl.zeros_like(row)).to(tl.int32), mask=ok & mask)
    if (b == 0) & (e0 + BE >= E):  # whether the padded segments fit in the N rows
        tl.store(ok_ptr, (start + tl.sum(p, axis=0) <= N).to(tl.int8))


@triton.jit
def moe_permute_invert_kernel(row_map_ptr, src_ptr, T, E, N, BT: tl.constexpr,
                              BE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    e = tl.program_id(1).to(tl.int64) * BE + tl.arange(0, BE)
    mask = (t < T)[:, None] & (e < E)[None, :]
    r = tl.load(row_map_ptr + t[:, None] * E + e[None, :], mask=mask, other=-1).to(tl.int64)
    ok = mask & (r >= 0) & (r < N)
    tl.store(src_ptr + r, (t[:, None] + tl.zeros_like(r)).to(tl.int32), mask=ok)


@triton.jit
def moe_permute_scatter_kernel(x_ptr, row_map_ptr, w_ptr, out_ptr, pin_ptr, pout_ptr,
                               other_ptr, dw_ptr, src_ptr, T, H, E, N, has_w, want_pp,
                               want_dot, KB: tl.constexpr, BE: tl.constexpr,
                               BLOCK_H: tl.constexpr, ZR: tl.constexpr):
    pid = tl.program_id(0)
    if pid < T:
        t = pid.to(tl.int64)
        map_row = row_map_ptr + t * E
        cnt = moe_routed_count(map_row, E, N, BE)
        last = tl.full((), -1, tl.int64)
        for jb in range(0, cnt, KB):
            rows, w, ex, valid, last = moe_routed(map_row, w_ptr + t * E, E, N, last, has_w,
                                                  KB, BE)
            if want_pp != 0:
                pv = tl.load(pin_ptr + t * E + ex, mask=valid, other=0.0)
                tl.store(pout_ptr + rows, pv, mask=valid)
            dot = tl.zeros((KB,), dtype=tl.float32)
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + tl.arange(0, BLOCK_H)
                cm = cols < H
                x = tl.load(x_ptr + t * H + cols, mask=cm, other=0.0).to(tl.float32)
                offs = rows[:, None] * H + cols[None, :]
                mask = valid[:, None] & cm[None, :]
                y = x[None, :] * w[:, None]
                tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
                if want_dot != 0:
                    o = tl.load(other_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                    dot += tl.sum(o * x[None, :], axis=1)
            if want_dot != 0:
                tl.store(dw_ptr + t * E + ex, dot.to(dw_ptr.dtype.element_ty), mask=valid)
        if want_dot != 0:
            for e0 in range(0, E, BE):
                e = e0 + tl.arange(0, BE)
                r = tl.load(map_row + e, mask=e < E, other=0)
                unrouted = (e < E) & ((r < 0) | (r >= N))
                tl.store(dw_ptr + t * E + e, tl.zeros((BE,), dtype=dw_ptr.dtype.element_ty),
                         mask=unrouted)
    else:
        rows = (pid - T).to(tl.int64) * ZR + tl.arange(0, ZR)
        rm = rows < N
        s = tl.load(src_ptr + rows, mask=rm, other=0)
        pad = rm & (s < 0)
        if tl.sum(pad.to(tl.int32), axis=0) > 0:
            for h0 in range(0, H, BLOCK_H):
                cols = h0 + tl.arange(0, BLOCK_H)
                tl.store(out_ptr + rows[:, None] * H + cols[None, :],
                         tl.zeros((ZR, BLOCK_H), dtype=out_ptr.dtype.element_ty),
                         mask=pad[:, None] & (cols < H)[None, :])
            tl.store(pout_ptr + rows, tl.zeros((ZR,), dtype=pout_ptr.dtype.element_ty),
                     mask=pad & (want_pp != 0))


@triton.jit
def moe_unpermute_gather_kernel(y_ptr, row_map_ptr, w_ptr, out_ptr, gpp_ptr, dp_ptr, T, H,
                                E, N, has_w, want_gpp, KB: tl.constexpr, BE: tl.constexpr,
                                BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    map_row = row_map_ptr + t * E
    w_row = w_ptr + t * E
    rows, w, ex, valid, last = moe_routed(map_row, w_row, E, N, tl.full((), -1, tl.int64),
                                          has_w, KB, BE)
    cnt = tl.sum(valid.to(tl.int32), axis=0)
    if cnt == KB:  # maybe more than KB: count them all
        cnt = moe_routed_count(map_row, E, N, BE)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        cm = cols < H
        v = tl.load(y_ptr + rows[:, None] * H + cols[None, :],
                    mask=valid[:, None] & cm[None, :], other=0.0).to(tl.float32)
        acc = tl.sum(v * w[:, None], axis=0)
        prev = last
        for jb in range(KB, cnt, KB):
            rows2, w2, ex2, valid2, prev = moe_routed(map_row, w_row, E, N, prev, has_w, KB,
                                                      BE)
            v2 = tl.load(y_ptr + rows2[:, None] * H + cols[None, :],
                         mask=valid2[:, None] & cm[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(v2 * w2[:, None], axis=0)
        tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=cm)
    if want_gpp != 0:
        for e0 in range(0, E, BE):
            e = e0 + tl.arange(0, BE)
            emask = e < E
            r = tl.load(map_row + e, mask=emask, other=-1).to(tl.int64)
            routed = (r >= 0) & (r < N)
            g = tl.load(gpp_ptr + r, mask=emask & routed, other=0.0)
            tl.store(dp_ptr + t * E + e, g.to(dp_ptr.dtype.element_ty), mask=emask)


_MAP_KERNELS = {
    # family: (kernel, arguments, constexprs, warps). The count at one warp: 3.65 -> 2.78 us
    # on an H200 at 8192 tokens x 256 experts (tune_moe_permute.py --part map; NOTES.md v31).
    "moe_permute_count": ("moe_permute_count_kernel", ("map_ptr", "blk_ptr", "T", "E"),
                          {"BT": BT_MAP, "BE": BE_MAP}, 1),
    "moe_permute_scan": ("moe_permute_scan_kernel", ("blk_ptr", "tpe_ptr", "NB", "E", "pad_to"),
                         {"NBB": NBB, "BE": BE_SCAN}, 4),
    "moe_permute_map": ("moe_permute_map_kernel",
                        ("map_ptr", "blk_ptr", "tpe_ptr", "row_map_ptr", "src_ptr", "ok_ptr",
                         "T", "E", "N"), {"BT": BT_MAP, "BE": BE_MAP}, 4),
    "moe_permute_invert": ("moe_permute_invert_kernel",
                           ("row_map_ptr", "src_ptr", "T", "E", "N"),
                           {"BT": BT_MAP, "BE": BE_MAP}, 4),
}
_INT_TYPES = {"map_ptr": "*i8", "blk_ptr": "*i32", "tpe_ptr": "*i32", "row_map_ptr": "*i32",
              "src_ptr": "*i32", "ok_ptr": "*i8", "T": "i64", "E": "i64", "N": "i64", "NB": "i64",
              "pad_to": "i32", "H": "i64", "has_w": "i32", "want_pp": "i32", "want_dot": "i32",
              "want_gpp": "i32"}
_DATA_ARGS = ("x_ptr", "out_ptr", "other_ptr", "y_ptr")  # (rows, H) of the tokens' dtype
_PROBS_ARGS = ("w_ptr", "pin_ptr", "pout_ptr", "dw_ptr", "gpp_ptr", "dp_ptr")

_MOVE_KERNELS = {
    "moe_permute_scatter": ("moe_permute_scatter_kernel",
                            ("x_ptr", "row_map_ptr", "w_ptr", "out_ptr", "pin_ptr", "pout_ptr",
                             "other_ptr", "dw_ptr", "src_ptr", "T", "H", "E", "N", "has_w",
                             "want_pp", "want_dot"), {"ZR": ZR}),
    "moe_unpermute_gather": ("moe_unpermute_gather_kernel",
                             ("y_ptr", "row_map_ptr", "w_ptr", "out_ptr", "gpp_ptr", "dp_ptr",
                              "T", "H", "E", "N", "has_w", "want_gpp"), {}),
}
# Columns of the hidden dim per step: KB x BLOCK_H elements per program step (512 bytes of a
# row), at MOVE_WARPS warps. One token a program, one warp: the fastest in
# benchmarks/tune_moe_permute.py on the H100 (8192 x 2048 bf16, top 8 of 256; against the
# 512 columns at 4 warps before): the gather 255 -> 124 us, the scatter 156 -> 136, the
# scatter with the dot (moe_unpermute's backward) 286 -> 229 (benchmarks/NOTES.md v19).
BLOCK_H = {"fp32": 128, "bf16": 256, "fp16": 256}
MOVE_WARPS = 1


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        # the map kernels do not depend on the tokens' dtype; they are built per dtype so
        # that the op picks them with the tokens like every other kernel
        for family, (kernel, args, cx, warps) in _MAP_KERNELS.items():
            sig = {a: _INT_TYPES[a] for a in args}
            sig.update({k: "constexpr" for k in cx})
            out.append(Variant(family=family, kernel=kernel, dtype=dt, block=1, signature=sig,
                               constexprs=dict(cx), num_warps=warps))
        for family, (kernel, args, cx) in _MOVE_KERNELS.items():
            for flags in (0, FLAG_ALIGNED, FLAG_PROBS_F32, FLAG_ALIGNED | FLAG_PROBS_F32):
                if dt == "fp32" and flags & FLAG_PROBS_F32:
                    continue  # fp32 tokens: probs are fp32 already
                pdt = "fp32" if flags & FLAG_PROBS_F32 else dt
                sig = {a: _INT_TYPES.get(a, f"*{pdt}" if a in _PROBS_ARGS else f"*{dt}")
                       for a in args}
                cxs = {"KB": KB, "BE": BE, "BLOCK_H": BLOCK_H[dt], **cx}
                sig.update({k: "constexpr" for k in cxs})
                # FLAG_ALIGNED: H a multiple of 16 and the token tensors 16-byte aligned, so
                # that every row starts 16-byte aligned (16-byte loads and stores)
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=BLOCK_H[dt],
                                   signature=sig, constexprs=cxs, num_warps=MOVE_WARPS,
                                   flags=flags,
                                   divisible_by_16=aligned_args(
                                       {a: sig[a] for a in _DATA_ARGS if a in sig}, flags,
                                       ("H",))))
    return out
