"""Llama 4 rotary embedding of q and k in one launch: adjacent pairs times complex freqs_cis.

Each pair (x[2i], x[2i+1]) of a head is a complex number a + ib, multiplied by the pair's
entry c + is of freqs_cis (read as interleaved (real, imag) floats):
    o[2i]     = a * c - b * s
    o[2i + 1] = b * c + a * s
in fp32, rounded once to the output dtype. The backward (``conj`` = 1) multiplies by the
conjugate c - is, the inverse rotation (and the transpose of the forward map).

Layout: q (B, S, Hq, D), k (B, S, Hkv, D), outputs alike; any batch / seq / head strides,
last dim contiguous. freqs (B or 1, S, D / 2, 2) with its last two dims contiguous; batch
stride 0 broadcasts. Offsets are int64.

Work split: a program owns BS seq positions of one batch entry and STEPS blocks of BH heads
from the list [q head blocks..., k head blocks...]; the pairs run in chunks of HB (one chunk
when D / 2 <= HB). Each freqs chunk is loaded once per program and reused across its heads;
each (seq, head) row is read once and written once. The 1-D grid enumerates (seq block,
head group) with the head group fastest (``heads_fastest``, memory order of (B, S, H, D)
buffers) or the seq block fastest (memory order of (B, H, S, D) buffers viewed as
(B, S, H, D)).
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args, qk_head_rows

FLAG_FREQS_FP32 = 2  # freqs are float32 (otherwise they have q's dtype)


@triton.jit
def _rotate_tile(xr, orow, rmask, cols, ccols, fc, fs, HB: tl.constexpr):
    """Loads the pairs ``cols`` of rows xr [BS, BH], multiplies them by (fc + i fs)
    [BS, 1, HB] and stores them at orow."""
    m = rmask[:, :, None] & ccols[None, None, :]
    x = tl.load(xr[:, :, None] + cols[None, None, :], mask=m, other=0.0).to(tl.float32)
    a, bb = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], HB, 2)))
    o = tl.reshape(tl.join(a * fc - bb * fs, bb * fc + a * fs), (x.shape[0], x.shape[1], 2 * HB))
    tl.store(orow[:, :, None] + cols[None, None, :], o.to(orow.dtype.element_ty), mask=m)


@triton.jit
def llama4_rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, f_ptr, q_sb, q_ss, q_sh, k_sb, k_ss, k_sh,
                       qo_sb, qo_ss, qo_sh, ko_sb, ko_ss, ko_sh, f_sb, f_ss, S, Hq, Hkv, half,
                       conj, heads_fastest, HB: tl.constexpr, BS: tl.constexpr,
                       BH: tl.constexpr, STEPS: tl.constexpr):
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
    f_row = f_ptr + b * f_sb + s.to(tl.int64) * f_ss
    sign = 1.0 - 2.0 * conj.to(tl.float32)
    blk0 = group * STEPS

    for c0 in range(0, half, HB):
        cols = 2 * c0 + tl.arange(0, 2 * HB)
        ccols = cols < 2 * half
        fm = s_mask[:, None] & ccols[None, :]
        f = tl.load(f_row[:, None] + cols[None, :], mask=fm, other=0.0).to(tl.float32)
        fc, fs = tl.split(tl.reshape(f, (BS, HB, 2)))
        fc = fc[:, None, :]
        fs = sign * fs[:, None, :]
        for i in range(STEPS):
            xr, orow, rmask = qk_head_rows(blk0 + i, nqb, b, s, s_mask, q_ptr, k_ptr, qo_ptr,
                                           ko_ptr, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, qo_sb,
                                           qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, Hq, Hkv, BH)
            _rotate_tile(xr, orow, rmask, cols, ccols, fc, fs, HB)


ARGS = ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "f_ptr",
        "q_sb", "q_ss", "q_sh", "k_sb", "k_ss", "k_sh",
        "qo_sb", "qo_ss", "qo_sh", "ko_sb", "ko_ss", "ko_sh", "f_sb", "f_ss",
        "S", "Hq", "Hkv", "half", "conj", "heads_fastest")
STRIDES = ARGS[5:19]

# Tiles per pair block HB: (BS seq positions, BH heads, STEPS head blocks per program,
# warps): BS * BH rows of 2 * HB elements, 4096 elements per program (fk.rope's tiles).
_TILES = {
    "default": {32: (16, 4, 1, 2), 64: (8, 4, 1, 2), 128: (4, 4, 1, 2)},
}
HALF_BLOCKS = (32, 64, 128)


def _freq_dtypes(dt):
    return (dt,) if dt == "fp32" else (dt, "fp32")


def variants(arch: int) -> list:
    tiles = _TILES.get(arch, _TILES["default"])
    out = []
    extra = STRIDES + ("half",)
    for dt in DTYPES:
        for f_dt in _freq_dtypes(dt):
            for aligned in (0, FLAG_ALIGNED):
                flags = aligned | (FLAG_FREQS_FP32 if f_dt != dt else 0)
                for hb in HALF_BLOCKS:
                    bs, bh, steps, warps = tiles[hb]
                    sig = {a: f"*{dt}" for a in ARGS[:4]}
                    sig["f_ptr"] = f"*{f_dt}"
                    sig.update({a: "i64" for a in STRIDES})
                    sig.update({a: "i32" for a in ARGS[19:]})
                    cx = {"HB": hb, "BS": bs, "BH": bh, "STEPS": steps}
                    sig.update({c: "constexpr" for c in cx})
                    out.append(Variant(family="llama4_rope", kernel="llama4_rope_kernel",
                                       dtype=dt, block=hb, signature=sig, constexprs=cx,
                                       num_warps=warps, flags=flags,
                                       divisible_by_16=aligned_args(sig, aligned, extra)))
    return out
