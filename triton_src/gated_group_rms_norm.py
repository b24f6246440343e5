"""Gated group RMSNorm, the output gate of linear-attention layers (Qwen3-Next's
Qwen3NextRMSNormGated, FLA's FusedRMSNormGated, "norm before gate"):

    y = round(round(w * round(x * rstd)) * act(gate)),  rstd = 1 / sqrt(mean(x^2) + eps)

over each group of G consecutive elements of a row of N (N a multiple of G), in fp32 with the
roundings to the input dtype where Hugging Face rounds; act = silu (``act`` 0) or sigmoid (1)
of the fp32 gate. w: (N,) (``w_per_group`` 0) or (G,) shared by the groups (1).

Output rows: row m of x (M rows) is stored at ``m * N`` or, transposed (``transpose`` 1:
x is (B, S, H, N) and y is (S, B, H * N)), at ``((s * B + b) * H + h) * N`` for
m = (b * S + s) * H + h.

Backward (norm before gate): a = act(g); n = w x_hat; dgate = dy n act'(g);
dn = dy a; dx = rstd (dn w - x_hat mean(dn w x_hat)); dw partials sum dn round(x_hat) in fp32
in the program's own row of a (programs, len(w)) buffer (rms_norm_dw sums them).

Work split: a tile is BM rows by one group (BG >= G columns); tiles ordered
[row block][group] (groups fastest). The forward runs one tile per program, the backward a
persistent grid. Row and tile indices are int32 (fewer than 2^31 - 2^16 rows: the launcher
checks), element offsets int64.
"""
import triton
import triton.language as tl

from _common import (DTYPES, FLAG_ALIGNED, FLAG_ROWS16, Variant, aligned_args, rms_normalize,
                     round_to)
from _common import sigmoid_f32


@triton.jit
def _tile(tile, M, N, G, B, S, H, transpose, BM: tl.constexpr, BG: tl.constexpr):
    """Rows (int64 [BM]) and their mask, the group j, columns / column mask [BG], input and
    output element offsets [BM, BG]."""
    ng = N // G
    j = tile % ng
    # Row indices in int32 (M < 2^31 - 2^16: the launcher checks), offsets in int64.
    rows32 = (tile // ng) * BM + tl.arange(0, BM)
    rows = rows32.to(tl.int64)
    rmask = rows32 < M
    cols = tl.arange(0, BG)
    cmask = cols < G
    mask = rmask[:, None] & cmask[None, :]
    col = j * G + cols
    in_off = rows[:, None] * N + col[None, :]
    if transpose != 0:
        h = rows32 % H
        s = (rows32 // H) % S
        b = rows32 // (H * S)
        out_rows = ((s * B + b) * H + h).to(tl.int64)
    else:
        out_rows = rows
    out_off = out_rows[:, None] * N + col[None, :]
    return j, mask, cmask, cols, in_off, out_off


@triton.jit
def _act(g, act):
    s = sigmoid_f32(g)
    if act == 0:
        s = g * s
    return s


@triton.jit
def _act_grad(g, act):
    s = sigmoid_f32(g)
    if act == 0:
        d = s * (1.0 + g * (1.0 - s))
    else:
        d = s * (1.0 - s)
    return d


@triton.jit
def gated_group_rms_norm_fwd_kernel(x_ptr, g_ptr, w_ptr, y_ptr, M, N, G, B, S, H, eps, has_w,
                                    w_per_group, act, transpose, BM: tl.constexpr,
                                    BG: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    j, mask, cmask, cols, in_off, out_off = _tile(tl.program_id(0), M, N, G, B, S, H,
                                                  transpose, BM, BG)
    x = tl.load(x_ptr + in_off, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + in_off, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / G + eps)
    n = rms_normalize(x, rstd[:, None], 1, dtype)
    if has_w != 0:
        w = tl.load(w_ptr + tl.where(w_per_group != 0, 0, j * G) + cols, mask=cmask,
                    other=0.0).to(tl.float32)
        n = round_to(n * w[None, :], dtype)
    tl.store(y_ptr + out_off, (n * _act(g, act)).to(dtype), mask=mask)


@triton.jit
def gated_group_rms_norm_bwd_kernel(dy_ptr, x_ptr, g_ptr, w_ptr, dx_ptr, dg_ptr, dw_ptr, M, N,
                                    G, B, S, H, eps, has_w, w_per_group, act, transpose,
                                    BM: tl.constexpr, BG: tl.constexpr):
    """Persistent: program p walks tiles p, p + P, ...; its fp32 dw partials accumulate in
    row p of dw_ptr ((P, len(w)), written whenever there is a weight)."""
    dtype = dx_ptr.dtype.element_ty
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    ntiles = tl.cdiv(M, BM) * (N // G)
    wn = tl.where(w_per_group != 0, G, N)
    dw_row = dw_ptr + pid.to(tl.int64) * wn
    for c0 in range(0, wn, BG):
        c = c0 + tl.arange(0, BG)
        tl.store(dw_row + c, tl.zeros((BG,), dtype=tl.float32), mask=(c < wn) & (has_w != 0))
    for tile in range(pid, ntiles, nprog):
        j, mask, cmask, cols, in_off, out_off = _tile(tile, M, N, G, B, S, H, transpose, BM,
                                                      BG)
        x = tl.load(x_ptr + in_off, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + in_off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + out_off, mask=mask, other=0.0).to(tl.float32)
        rstd = (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / G + eps))[:, None]
        xh = x * rstd
        w_at = dw_row + tl.where(w_per_group != 0, 0, j * G) + cols
        if has_w != 0:
            w = tl.load(w_ptr + tl.where(w_per_group != 0, 0, j * G) + cols, mask=cmask,
                        other=0.0).to(tl.float32)[None, :]
        else:
            w = tl.full((1, BG), 1.0, dtype=tl.float32)
        tl.store(dg_ptr + in_off, (dy * w * xh * _act_grad(g, act)).to(dtype), mask=mask)
        dn = dy * _act(g, act)
        dxh = dn * w
        c = tl.sum(dxh * xh, axis=1)[:, None] / G
        tl.store(dx_ptr + in_off, (rstd * (dxh - xh * c)).to(dtype), mask=mask)
        if has_w != 0:
            part = tl.sum(dn * rms_normalize(x, rstd, 1, dtype), axis=0)
            acc = tl.load(w_at, mask=cmask, other=0.0)
            tl.store(w_at, acc + part, mask=cmask)


FWD_ARGS = ("x_ptr", "g_ptr", "w_ptr", "y_ptr", "M", "N", "G", "B", "S", "H", "eps", "has_w",
            "w_per_group", "act", "transpose")
BWD_ARGS = ("dy_ptr", "x_ptr", "g_ptr", "w_ptr", "dx_ptr", "dg_ptr", "dw_ptr", "M", "N", "G",
            "B", "S", "H", "eps", "has_w", "w_per_group", "act", "transpose")
_TYPES = {"eps": "fp32", "dw_ptr": "*fp32"}

# Per group block BG (the smallest power of 2 >= group_size): (BM rows, warps). Up to BG 1024
# a tile holds 2048 elements, from an H100 sweep (benchmarks/tune_gated_group_rms_norm.py,
# x (2, 4096, 32, 128)): forward (16, 4) 72.8 us, 92 % of copy, against 83.5 us for the
# 4096-element tile it had; backward (16, 2) at 8 programs per SM 149.0 us against 173.8.
# Larger groups keep one or two rows of 4096-8192 elements (not swept).
FWD_TILES = {64: (32, 4), 128: (16, 4), 256: (8, 4), 512: (4, 4), 1024: (2, 4), 2048: (2, 8),
             4096: (1, 8), 8192: (1, 16)}
BWD_TILES = {64: (32, 2), 128: (16, 2), 256: (8, 2), 512: (4, 2), 1024: (2, 2), 2048: (2, 8),
             4096: (1, 8), 8192: (1, 16)}


def variants(arch: int) -> list:
    out = []
    for family, kernel, args, tiles in (
            ("gated_group_rms_norm_fwd", "gated_group_rms_norm_fwd_kernel", FWD_ARGS,
             FWD_TILES),
            ("gated_group_rms_norm_bwd", "gated_group_rms_norm_bwd_kernel", BWD_ARGS,
             BWD_TILES)):
        # Aligned variants with M a multiple of 16 hint it too (FLAG_ROWS16): the backward
        # ran 190 -> 156 us with that hint (H100, (2, 4096, 32, 128) bf16).
        for dt in DTYPES:
            for flags in (0, FLAG_ALIGNED, FLAG_ALIGNED | FLAG_ROWS16):
                hints = ("N", "G") + (("M",) if flags & FLAG_ROWS16 else ())
                for bg, (bm, warps) in tiles.items():
                    sig = {a: _TYPES.get(a, f"*{dt}" if a.endswith("_ptr") else "i32")
                           for a in args}
                    cx = {"BM": bm, "BG": bg}
                    sig.update({c: "constexpr" for c in cx})
                    out.append(Variant(family=family, kernel=kernel, dtype=dt, block=bg,
                                       signature=sig, constexprs=cx, num_warps=warps,
                                       flags=flags,
                                       divisible_by_16=aligned_args(sig, flags, hints)))
    return out
