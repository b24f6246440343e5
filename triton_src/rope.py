"""Rotary position embedding (RoPE) of q and k in one launch, Hugging Face convention.

For each rotating pair (x1, x2) of a head's first R = 2 * half dims, with the cos / sin
entries (c1, c2) and (s1, s2) of the pair's two positions:
    o1 = x1 * c1 - x2 * s1
    o2 = x2 * c2 + x1 * s2
which is ``x * cos + rotate_half(x) * sin`` when pairs are (i, i + half) (rotate-half,
Llama / NeoX layout) and ``x * cos + rotate_every_two(x) * sin`` when pairs are
(2i, 2i + 1) (interleaved, GPT-J layout). Dims R..D pass through unchanged. Math is fp32,
rounded once to the output dtype.

cos / sin rows: ``c2_off`` is the distance from a pair's first cos entry to its second:
``half`` for rotate-half cos of width R (both halves stored, as HF's rotary embedding
returns them), 1 for interleaved cos of width R (each value stored twice, adjacent), 0 for
cos of width R / 2 (one value per pair). Interleaved pairs step 1 + c2_off through cos.
The backward (``inverse`` = 1) applies the transpose of the forward map: the same formula
with s1 := -s2 and s2 := -s1 (the inverse rotation, sin -> -sin, for duplicated cos / sin).

Layout: q (B, Hq, S, D), k (B, Hkv, S, D), outputs alike; any batch / head / seq strides,
last dim contiguous. cos / sin (B or 1, S, W): batch stride 0 broadcasts. Offsets are
int64.

Work split: a program owns BS seq positions of one batch entry and STEPS blocks of BH heads
from the list [q head blocks..., k head blocks...]; the rotation runs over the rotary dims
in chunks of HB pairs (one chunk when half <= HB). cos / sin chunks are loaded once per
program and reused across its heads; each (seq, head) tile is read once and written once.
The 1-D grid enumerates (seq block, head group) with the head group fastest
(``heads_fastest``, memory order for the (B, S, H, D) buffers models produce) or the seq
block fastest (memory order for contiguous (B, H, S, D)).
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args, qk_head_rows

FLAG_COS_FP32 = 2  # cos / sin are float32 (otherwise they have q's dtype)


@triton.jit
def _load_pairs(xr, rmask, c0, half, INTERLEAVED: tl.constexpr, HB: tl.constexpr):
    """The two members (x1, x2) of pairs c0 .. c0 + HB of rows xr [BS, BH], in fp32."""
    if INTERLEAVED:
        cols = 2 * c0 + tl.arange(0, 2 * HB)
        m = rmask[:, :, None] & (cols < 2 * half)[None, None, :]
        x = tl.load(xr[:, :, None] + cols[None, None, :], mask=m, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], HB, 2)))
    else:
        pairs = c0 + tl.arange(0, HB)
        m = rmask[:, :, None] & (pairs < half)[None, None, :]
        x1p = xr[:, :, None] + pairs[None, None, :]
        x1 = tl.load(x1p, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x1p + half, mask=m, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_pairs(orow, rmask, c0, half, o1, o2, INTERLEAVED: tl.constexpr, HB: tl.constexpr):
    dtype = orow.dtype.element_ty
    if INTERLEAVED:
        cols = 2 * c0 + tl.arange(0, 2 * HB)
        m = rmask[:, :, None] & (cols < 2 * half)[None, None, :]
        o = tl.reshape(tl.join(o1, o2), (o1.shape[0], o1.shape[1], 2 * HB))
        tl.store(orow[:, :, None] + cols[None, None, :], o.to(dtype), mask=m)
    else:
        pairs = c0 + tl.arange(0, HB)
        m = rmask[:, :, None] & (pairs < half)[None, None, :]
        o1p = orow[:, :, None] + pairs[None, None, :]
        tl.store(o1p, o1.to(dtype), mask=m)
        tl.store(o1p + half, o2.to(dtype), mask=m)


@triton.jit
def _rope_program(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, q_sb, q_sh, q_ss, k_sb, k_sh,
                  k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, cos_sb, cos_ss, S, Hq, Hkv,
                  half, D, c2_off, inverse, heads_fastest, INTERLEAVED: tl.constexpr,
                  HB: tl.constexpr, BS: tl.constexpr, BH: tl.constexpr, STEPS: tl.constexpr):
    nqb = tl.cdiv(Hq, BH)
    groups = tl.cdiv(nqb + tl.cdiv(Hkv, BH), STEPS)
    pid = tl.program_id(0)
    if heads_fastest != 0:
        group = pid % groups
        sblock = pid // groups
    else:
        seq_blocks = tl.num_programs(0) // groups
        group = pid // seq_blocks
        sblock = pid % seq_blocks
    nsb = tl.cdiv(S, BS)
    b = (sblock // nsb).to(tl.int64)
    s = (sblock % nsb) * BS + tl.arange(0, BS)
    s_mask = s < S
    s64 = s.to(tl.int64)
    cos_row = cos_ptr + b * cos_sb + s64 * cos_ss
    sin_row = sin_ptr + b * cos_sb + s64 * cos_ss
    # Forward: s1 at the pair's first entry, s2 at its second. Inverse: swapped, negated.
    s1_off = c2_off * inverse
    s2_off = c2_off - s1_off
    sign = 1.0 - 2.0 * inverse.to(tl.float32)
    blk0 = group * STEPS

    for c0 in range(0, half, HB):
        # The first tile's loads go out before the cos / sin loads, so that their
        # latencies overlap.
        xr, orow, rmask = qk_head_rows(blk0, nqb, b, s, s_mask, q_ptr, k_ptr, qo_ptr, ko_ptr,
                                      q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, qo_sb, qo_sh, qo_ss,
                                      ko_sb, ko_sh, ko_ss, Hq, Hkv, BH)
        x1, x2 = _load_pairs(xr, rmask, c0, half, INTERLEAVED, HB)
        # cos / sin chunks [BS, 1, HB], reused by all of the program's heads.
        pairs = c0 + tl.arange(0, HB)
        cmask = s_mask[:, None] & (pairs < half)[None, :]
        if INTERLEAVED:
            ci = pairs * (1 + c2_off)
        else:
            ci = pairs
        cos_at = cos_row[:, None] + ci[None, :]
        sin_at = sin_row[:, None] + ci[None, :]
        c1 = tl.load(cos_at, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        c2 = tl.load(cos_at + c2_off, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        s1 = sign * tl.load(sin_at + s1_off, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        s2 = sign * tl.load(sin_at + s2_off, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        _store_pairs(orow, rmask, c0, half, x1 * c1 - x2 * s1, x2 * c2 + x1 * s2, INTERLEAVED, HB)
        for i in range(1, STEPS):
            xr, orow, rmask = qk_head_rows(blk0 + i, nqb, b, s, s_mask, q_ptr, k_ptr, qo_ptr,
                                          ko_ptr, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, qo_sb,
                                          qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, Hq, Hkv, BH)
            x1, x2 = _load_pairs(xr, rmask, c0, half, INTERLEAVED, HB)
            _store_pairs(orow, rmask, c0, half, x1 * c1 - x2 * s1, x2 * c2 + x1 * s2,
                         INTERLEAVED, HB)

    # Dims 2 * half .. D pass through (D == 2 * half when there are none, or in place).
    for c0 in range(2 * half, D, HB):
        cols = c0 + tl.arange(0, HB)
        for i in range(STEPS):
            xr, orow, rmask = qk_head_rows(blk0 + i, nqb, b, s, s_mask, q_ptr, k_ptr, qo_ptr,
                                          ko_ptr, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, qo_sb,
                                          qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, Hq, Hkv, BH)
            m = rmask[:, :, None] & (cols < D)[None, None, :]
            x = tl.load(xr[:, :, None] + cols[None, None, :], mask=m)
            tl.store(orow[:, :, None] + cols[None, None, :], x.to(orow.dtype.element_ty), mask=m)


@triton.jit
def rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, q_sb, q_sh, q_ss, k_sb, k_sh,
                k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, cos_sb, cos_ss, S, Hq, Hkv, half,
                D, c2_off, inverse, heads_fastest, HB: tl.constexpr, BS: tl.constexpr,
                BH: tl.constexpr, STEPS: tl.constexpr):
    """Rotate-half pairs (i, i + half)."""
    _rope_program(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, q_sb, q_sh, q_ss, k_sb, k_sh,
                  k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, cos_sb, cos_ss, S, Hq, Hkv,
                  half, D, c2_off, inverse, heads_fastest, False, HB, BS, BH, STEPS)


@triton.jit
def rope_interleaved_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, q_sb, q_sh, q_ss,
                            k_sb, k_sh, k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, cos_sb,
                            cos_ss, S, Hq, Hkv, half, D, c2_off, inverse, heads_fastest,
                            HB: tl.constexpr, BS: tl.constexpr, BH: tl.constexpr,
                            STEPS: tl.constexpr):
    """Interleaved pairs (2i, 2i + 1)."""
    _rope_program(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, q_sb, q_sh, q_ss, k_sb, k_sh,
                  k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, cos_sb, cos_ss, S, Hq, Hkv,
                  half, D, c2_off, inverse, heads_fastest, True, HB, BS, BH, STEPS)


ARGS = ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "cos_ptr", "sin_ptr",
        "q_sb", "q_sh", "q_ss", "k_sb", "k_sh", "k_ss",
        "qo_sb", "qo_sh", "qo_ss", "ko_sb", "ko_sh", "ko_ss", "cos_sb", "cos_ss",
        "S", "Hq", "Hkv", "half", "D", "c2_off", "inverse", "heads_fastest")
STRIDES = ARGS[6:20]

# Tiles per half block HB (pairs per chunk): (BS seq positions, BH heads, STEPS head blocks
# per program, warps). Each tile is BS * BH rows of 2 * HB elements: 4096 elements, 8 KiB
# read and 8 KiB written in bf16, whatever the head dim. Rotary dims past the largest HB
# loop in chunks; the interleaved kernels have one HB (they loop or mask).
_TILES = {
    # HB 64 (head_dim 128) from the H200 sweep (benchmarks/tune_rope.py): 8 seq x 4 heads,
    # 2 warps is within 1 % of the best tile in both layouts; HB 32 / 128 keep its 4096
    # elements per program.
    "default": {32: (16, 4, 1, 2), 64: (8, 4, 1, 2), 128: (4, 4, 1, 2)},
}
HALF_BLOCKS = (32, 64, 128)
INTERLEAVED_HALF_BLOCKS = (64,)


def _cos_dtypes(dt):
    return (dt,) if dt == "fp32" else (dt, "fp32")


def variants(arch: int) -> list:
    tiles = _TILES.get(arch, _TILES["default"])
    out = []
    for family, kernel, blocks in (("rope", "rope_kernel", HALF_BLOCKS),
                                   ("rope_interleaved", "rope_interleaved_kernel",
                                    INTERLEAVED_HALF_BLOCKS)):
        # c2_off is 0 or half for rotate-half (divisible with half), 0 or 1 interleaved.
        extra = STRIDES + ("half", "D") + (("c2_off",) if family == "rope" else ())
        for dt in DTYPES:
            for cos_dt in _cos_dtypes(dt):
                for aligned in (0, FLAG_ALIGNED):
                    flags = aligned | (FLAG_COS_FP32 if cos_dt != dt else 0)
                    for hb in blocks:
                        bs, bh, steps, warps = tiles[hb]
                        sig = {a: (f"*{cos_dt}" if a in ("cos_ptr", "sin_ptr") else f"*{dt}")
                               for a in ARGS[:6]}
                        sig.update({a: "i64" for a in STRIDES})
                        sig.update({a: "i32" for a in ARGS[20:]})
                        cx = {"HB": hb, "BS": bs, "BH": bh, "STEPS": steps}
                        sig.update({c: "constexpr" for c in cx})
                        out.append(Variant(family=family, kernel=kernel, dtype=dt, block=hb,
                                           signature=sig, constexprs=cx, num_warps=warps,
                                           flags=flags,
                                           divisible_by_16=aligned_args(sig, aligned, extra)))
    return out
