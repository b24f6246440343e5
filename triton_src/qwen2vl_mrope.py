"""Multimodal rotary embedding (mRoPE) of Qwen2-VL / Qwen2.5-VL / Qwen3-VL, q and k in one
launch.

cos / sin hold three position streams (temporal, height, width): (3, B or 1, S, D). Each
rotating pair (i, i + half) of a head (rotate-half layout) takes its cos / sin values from
one stream, stream(i):
  sectioned (Qwen2-VL, Qwen2.5-VL): 0 for i < t, 1 for t <= i < t + h, 2 after;
  interleaved (Qwen3-VL): 1 when i % 3 == 1 and i < 3 h, 2 when i % 3 == 2 and i < 3 w,
  else 0;
where (t, h, w) = mrope_section. With c1 = cos[stream, i], c2 = cos[stream, i + half] (and
s1, s2 alike):
    o1 = x1 * c1 - x2 * s1
    o2 = x2 * c2 + x1 * s2
(``x * cos + rotate_half(x) * sin`` with the composed cos / sin), fp32 math, rounded once.
The backward (``inverse`` = 1) applies the transpose: s1 := -s2, s2 := -s1.

Layout: q (B, Hq, S, D), k (B, Hkv, S, D), outputs alike; any batch / head / seq strides,
last dim contiguous; D = 2 * half (the whole head rotates). cos and sin share strides;
batch stride 0 broadcasts. Offsets are int64.

Work split as in fk.rope: a program owns BS seq positions of one batch entry and STEPS
blocks of BH heads from [q head blocks..., k head blocks...]; pairs run in chunks of HB. The
composed cos / sin chunks are loaded once per program (one stream per pair, so the bytes
read are those of one (S, D) table) and reused across its heads.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args, qk_head_rows

FLAG_COS_FP32 = 2  # cos / sin are float32 (otherwise they have q's dtype)
FLAG_SEC8 = 4      # SEC8 = 1: sectioned streams, section bounds and cos strides multiples of 8

# Bits of the kernel's run-time ``mode`` argument.
MODE_INTERLEAVED = tl.constexpr(1)     # Qwen3-VL stream assignment
MODE_INVERSE = tl.constexpr(2)         # the backward (transposed) map
MODE_HEADS_FASTEST = tl.constexpr(4)   # grid order: head groups fastest


@triton.jit
def _rotate_tile(xr, orow, rmask, pairs, pmask, half, c1, c2, s1, s2):
    m = rmask[:, :, None] & pmask[None, None, :]
    x1p = xr[:, :, None] + pairs[None, None, :]
    x1 = tl.load(x1p, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x1p + half, mask=m, other=0.0).to(tl.float32)
    dtype = orow.dtype.element_ty
    o1p = orow[:, :, None] + pairs[None, None, :]
    tl.store(o1p, (x1 * c1 - x2 * s1).to(dtype), mask=m)
    tl.store(o1p + half, (x2 * c2 + x1 * s2).to(dtype), mask=m)


@triton.jit
def qwen2vl_mrope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, q_sb, q_sh, q_ss,
                         k_sb, k_sh, k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, cos_st,
                         cos_sb, cos_ss, S, Hq, Hkv, half, sec_t, sec_h, sec_w, mode,
                         HB: tl.constexpr, BS: tl.constexpr,
                         BH: tl.constexpr, STEPS: tl.constexpr, SEC8: tl.constexpr = 0):
    interleaved = mode & MODE_INTERLEAVED
    inverse = (mode & MODE_INVERSE) // MODE_INVERSE
    nqb = tl.cdiv(Hq, BH)
    groups = tl.cdiv(nqb + tl.cdiv(Hkv, BH), STEPS)
    pid = tl.program_id(0)
    if (mode & MODE_HEADS_FASTEST) != 0:
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
    row = b * cos_sb + s.to(tl.int64) * cos_ss
    # Forward: s1 at the pair's first entry, s2 at its second. Inverse: swapped, negated.
    s1_off = half * inverse
    s2_off = half - s1_off
    sign = 1.0 - 2.0 * inverse.to(tl.float32)
    blk0 = group * STEPS

    for c0 in range(0, half, HB):
        pairs = c0 + tl.arange(0, HB)
        pmask = pairs < half
        if interleaved != 0:
            r3 = pairs % 3
            stream = tl.where((r3 == 1) & (pairs < 3 * sec_h), 1,
                              tl.where((r3 == 2) & (pairs < 3 * sec_w), 2, 0))
        else:
            stream = (pairs >= sec_t).to(tl.int32) + (pairs >= sec_t + sec_h).to(tl.int32)
        col = stream.to(tl.int64) * cos_st + pairs
        if SEC8:
            # Sectioned streams whose bounds and cos_st are multiples of 8: col runs in
            # aligned groups of 8 contiguous entries, so cos / sin load as 16-byte vectors.
            col = tl.max_contiguous(tl.multiple_of(col, 8), 8)
        cmask = s_mask[:, None] & pmask[None, :]
        at = row[:, None] + col[None, :]
        c1 = tl.load(cos_ptr + at, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        c2 = tl.load(cos_ptr + at + half, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        s1 = sign * tl.load(sin_ptr + at + s1_off, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        s2 = sign * tl.load(sin_ptr + at + s2_off, mask=cmask, other=0.0).to(tl.float32)[:, None, :]
        for i in range(STEPS):
            xr, orow, rmask = qk_head_rows(blk0 + i, nqb, b, s, s_mask, q_ptr, k_ptr, qo_ptr,
                                           ko_ptr, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, qo_sb,
                                           qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, Hq, Hkv, BH)
            _rotate_tile(xr, orow, rmask, pairs, pmask, half, c1, c2, s1, s2)


ARGS = ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "cos_ptr", "sin_ptr",
        "q_sb", "q_sh", "q_ss", "k_sb", "k_sh", "k_ss",
        "qo_sb", "qo_sh", "qo_ss", "ko_sb", "ko_sh", "ko_ss", "cos_st", "cos_sb", "cos_ss",
        "S", "Hq", "Hkv", "half", "sec_t", "sec_h", "sec_w", "mode")
STRIDES = ARGS[6:21]

# Tiles per pair block HB and SEC8: (BS seq positions, BH heads, STEPS head blocks per
# program, warps). H100 sweep (benchmarks/tune_qwen2vl_mrope.py, Qwen2-VL-7B shapes, head
# groups fastest): with cos / sin as 16-byte vectors (SEC8) one head block per program is
# best (83 % of copy); with element-wise cos / sin loads the program amortizes them over 8
# head blocks (80 %; one block: 64-68 %).
_TILES = {
    "default": {
        0: {32: (16, 4, 8, 2), 64: (8, 4, 8, 2), 128: (4, 4, 8, 2)},
        1: {32: (16, 2, 1, 2), 64: (8, 2, 1, 2), 128: (4, 2, 1, 2)},
    },
}
HALF_BLOCKS = (32, 64, 128)


def _cos_dtypes(dt):
    return (dt,) if dt == "fp32" else (dt, "fp32")


def variants(arch: int) -> list:
    tiles = _TILES.get(arch, _TILES["default"])
    out = []
    extra = STRIDES + ("half",)
    for dt in DTYPES:
        for cos_dt in _cos_dtypes(dt):
            # SEC8's vector loads need the aligned variant's hints.
            for aligned, sec8 in ((0, 0), (FLAG_ALIGNED, 0), (FLAG_ALIGNED, 1)):
                flags = (aligned | (FLAG_COS_FP32 if cos_dt != dt else 0)
                         | (FLAG_SEC8 if sec8 else 0))
                for hb in HALF_BLOCKS:
                    bs, bh, steps, warps = tiles[sec8][hb]
                    sig = {a: (f"*{cos_dt}" if a in ("cos_ptr", "sin_ptr") else f"*{dt}")
                           for a in ARGS[:6]}
                    sig.update({a: "i64" for a in STRIDES})
                    sig.update({a: "i32" for a in ARGS[21:]})
                    cx = {"HB": hb, "BS": bs, "BH": bh, "STEPS": steps, "SEC8": sec8}
                    sig.update({c: "constexpr" for c in cx})
                    out.append(Variant(family="qwen2vl_mrope", kernel="qwen2vl_mrope_kernel",
                                       dtype=dt, block=hb, signature=sig, constexprs=cx,
                                       num_warps=warps, flags=flags,
                                       divisible_by_16=aligned_args(sig, aligned, extra)))
    return out
