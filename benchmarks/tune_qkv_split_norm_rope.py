"""Sweep launch configurations of the qkv_split_norm_rope kernels with Triton's JIT (tuning
only; the library uses the AOT variants in triton_src/qkv_split_norm_rope.py). At one shape
(Megatron's grouped (S, B, N) qkv, both norm weights, full rotary, bshd outputs) it times the
forward over tiles of BT tokens x BH heads and warps, and the backward over the same and the
persistent programs per multiprocessor, so the best ones can be written into
triton_src/qkv_split_norm_rope.py (FWD_TILES, BWD_TILES) and the CUDA dispatch as data.

--early: two forms of the forward. fwd_early_kernel issues a q / k tile's cos / sin loads
(L2-resident: every head of a token reuses them) before the loads of its rows, so that the
two are in flight together instead of one after the other (the library loads cos / sin after
the row's RMSNorm statistics). fwd_persistent_kernel also runs a persistent grid whose
programs load their next tile's rows before handling the current one. Checked equal to the
library kernel, then timed next to it over a few tiles (the persistent one at 2-16 programs
a multiprocessor). ``--device cpu`` under TRITON_INTERPRET=1 runs the checks only, at a small
shape.

    python benchmarks/tune_qkv_split_norm_rope.py [--tokens 8192] [--heads 32] [--kv-heads 4]
                                                  [--head-dim 128] [--top 8] [--early]
"""
import argparse
import itertools
import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import qkv_split_norm_rope as K  # noqa: E402


@triton.jit
def _halves(qkv_ptr, in_rows, mask, half, HB: tl.constexpr):
    """The rows' two rotating halves in fp32 (0 where masked)."""
    _p1, _m1, x1 = K._chunk(qkv_ptr, in_rows, mask, 0, half, HB)
    _p2, _m2, x2 = K._chunk(qkv_ptr, in_rows + half, mask, 0, half, HB)
    return x1, x2


@triton.jit
def _qk_rows(x1, x2, c1, c2, s1, s2, kind, qkv_ptr, in_rows, out_ptr, out_rows, mask, qw_ptr,
             kw_ptr, D, half, mode, eps, dtype, HB: tl.constexpr, BT: tl.constexpr,
             BH: tl.constexpr):
    """The library forward's q / k path given the rows' halves and cos / sin: RMSNorm, the
    rotation and the stores, the pass-through dims read and written here."""
    cols = tl.arange(0, HB)[None, None, :]
    m1 = mask[:, :, None] & (cols < half)
    rot = 2 * half
    w_ptr = tl.where(kind == 0, qw_ptr, kw_ptr)
    do_norm = tl.where(kind == 0, mode & K.HAS_QW, mode & K.HAS_KW)
    rstd = tl.zeros((BT, BH), dtype=tl.float32)
    if do_norm != 0:
        ss = tl.sum(x1 * x1 + x2 * x2, axis=2)
        for c0 in range(rot, D, HB):
            _p, _m, x = K._chunk(qkv_ptr, in_rows, mask, c0, D, HB)
            ss += tl.sum(x * x, axis=2)
        rstd = 1.0 / tl.sqrt(ss / D + eps)
    rstd = rstd[:, :, None]
    n1 = K._normed(x1, rstd, w_ptr, 0, half, do_norm, dtype, HB)
    n2 = K._normed(x2, rstd, w_ptr + half, 0, half, do_norm, dtype, HB)
    o1 = n1 * c1 - n2 * s1
    o2 = n2 * c2 + n1 * s2
    tl.store(out_ptr + out_rows[:, :, None] + cols, o1.to(dtype), mask=m1)
    tl.store(out_ptr + out_rows[:, :, None] + half + cols, o2.to(dtype), mask=m1)
    for c0 in range(rot, D, HB):
        _p, m, x = K._chunk(qkv_ptr, in_rows, mask, c0, D, HB)
        n = K._normed(x, rstd, w_ptr, c0, D, do_norm, dtype, HB)
        tl.store(out_ptr + out_rows[:, :, None] + c0 + cols, n.to(dtype), mask=m)


@triton.jit
def fwd_early_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, vo_ptr, in_sb,
                     in_ss, cos_sb, cos_ss, B, S, Hq, Hkv, D, half, c2_off, mode, eps,
                     HB: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr):
    """The library's forward with cos / sin loaded first in the q / k path."""
    dtype = qo_ptr.dtype.element_ty
    kind, in_rows, out_rows, mask, b, s, tmask = K._tile(tl.program_id(0), B, S, Hq, Hkv, D,
                                                         in_sb, in_ss, mode, BT, BH)
    out_ptr = tl.where(kind == 0, qo_ptr, tl.where(kind == 1, ko_ptr, vo_ptr))
    if kind == 2:
        K._copy_rows(qkv_ptr, in_rows, out_ptr, out_rows, mask, D, HB)
    else:
        c1, c2, s1, s2 = K._cos_sin(cos_ptr, sin_ptr, b, s, cos_sb, cos_ss, half, c2_off,
                                    tmask, HB)
        x1, x2 = _halves(qkv_ptr, in_rows, mask, half, HB)
        _qk_rows(x1, x2, c1, c2, s1, s2, kind, qkv_ptr, in_rows, out_ptr, out_rows, mask,
                 qw_ptr, kw_ptr, D, half, mode, eps, dtype, HB, BT, BH)


@triton.jit
def _ahead(qkv_ptr, tile, ntiles, B, S, Hq, Hkv, D, in_sb, in_ss, half, mode,
           HB: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr):
    """Tile ``tile``'s two rotating halves of its rows in fp32 (0 past the last tile: no
    memory is read then)."""
    _kind, in_rows, _o, mask, _b, _s, _t = K._tile(tile, B, S, Hq, Hkv, D, in_sb, in_ss, mode,
                                                   BT, BH)
    return _halves(qkv_ptr, in_rows, mask & (tile < ntiles), half, HB)


@triton.jit
def fwd_persistent_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, vo_ptr,
                          in_sb, in_ss, cos_sb, cos_ss, B, S, Hq, Hkv, D, half, c2_off, mode,
                          eps, HB: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr):
    """The library's forward over a persistent grid, each program loading its next tile's
    rotating halves (every kind's) before it handles the current tile; cos / sin first in the
    q / k path. The same arithmetic; v rows go through fp32 (exact)."""
    dtype = qo_ptr.dtype.element_ty
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    ntiles = tl.cdiv(B * S, BT) * (tl.cdiv(Hq, BH) + 2 * tl.cdiv(Hkv, BH))
    n1, n2 = _ahead(qkv_ptr, pid, ntiles, B, S, Hq, Hkv, D, in_sb, in_ss, half, mode, HB, BT,
                    BH)
    cols = tl.arange(0, HB)[None, None, :]
    for tile in range(pid, ntiles, step):
        x1 = n1
        x2 = n2
        n1, n2 = _ahead(qkv_ptr, tile + step, ntiles, B, S, Hq, Hkv, D, in_sb, in_ss, half,
                        mode, HB, BT, BH)
        kind, in_rows, out_rows, mask, b, s, tmask = K._tile(tile, B, S, Hq, Hkv, D, in_sb,
                                                             in_ss, mode, BT, BH)
        out_ptr = tl.where(kind == 0, qo_ptr, tl.where(kind == 1, ko_ptr, vo_ptr))
        if kind == 2:
            m1 = mask[:, :, None] & (cols < half)
            tl.store(out_ptr + out_rows[:, :, None] + cols, x1.to(dtype), mask=m1)
            tl.store(out_ptr + out_rows[:, :, None] + half + cols, x2.to(dtype), mask=m1)
            for c0 in range(2 * half, D, HB):
                _p, m, x = K._chunk(qkv_ptr, in_rows, mask, c0, D, HB)
                tl.store(out_ptr + out_rows[:, :, None] + c0 + cols, x.to(dtype), mask=m)
        else:
            c1, c2, s1, s2 = K._cos_sin(cos_ptr, sin_ptr, b, s, cos_sb, cos_ss, half, c2_off,
                                        tmask, HB)
            _qk_rows(x1, x2, c1, c2, s1, s2, kind, qkv_ptr, in_rows, out_ptr, out_rows, mask,
                     qw_ptr, kw_ptr, D, half, mode, eps, dtype, HB, BT, BH)


def check_early(qkv, qw, kw, cos, sin, outs, common, hb, tiles_of, shapes, grids):
    """fwd_early_kernel's and fwd_persistent_kernel's (at each grid size, capped by the
    tiles) q, k, v equal to the library kernel's at each (BT, BH, warps)."""
    for bt, bh, warps in shapes:
        ref = [torch.full_like(o, float("nan")) for o in outs]
        tiles = tiles_of(bt, bh)
        K.qkv_split_norm_rope_fwd_kernel[(tiles,)](qkv, qw, kw, cos, sin, *ref, *common,
                                                   HB=hb, BT=bt, BH=bh, num_warps=warps)
        written = not any(torch.isnan(r).any().item() for r in ref)
        runs = [("early", fwd_early_kernel, tiles)]
        runs += [("persistent", fwd_persistent_kernel, min(g, tiles)) for g in grids]
        for name, kern, grid in runs:
            got = [torch.full_like(o, float("nan")) for o in outs]
            kern[(grid,)](qkv, qw, kw, cos, sin, *got, *common, HB=hb, BT=bt, BH=bh,
                          num_warps=warps)
            same = all(torch.equal(a, b) for a, b in zip(ref, got))
            print(f"{name} form BT {bt} BH {bh} warps {warps} ({grid} programs) equal to the "
                  f"library: {same} (every element written: {written})", flush=True)
            if not (same and written):
                raise SystemExit(f"{name} form WRONG")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--warps", default="1,2,4,8", help="comma-separated warp counts to sweep")
    ap.add_argument("--bt", default="2,4,8,16,32", help="comma-separated tokens per tile")
    ap.add_argument("--bh", default="1,2,4,8", help="comma-separated heads per tile")
    ap.add_argument("--early", action="store_true",
                    help="only the forward with cos / sin loaded first, against the library's")
    ap.add_argument("--device", default="cuda",
                    help="cpu (under TRITON_INTERPRET=1): the early form's check only")
    args = ap.parse_args()
    dev = args.device
    if dev != "cuda":  # a small shape with partial token and head tiles
        args.tokens, args.heads, args.kv_heads, args.head_dim = 21, 6, 2, 16
    t, hq, hkv, d = args.tokens, args.heads, args.kv_heads, args.head_dim
    dt = torch.bfloat16
    n = (hq + 2 * hkv) * d
    qkv = torch.randn(t, 1, n, device=dev, dtype=dt)
    qw = torch.rand(d, device=dev, dtype=dt) + 0.5
    kw = torch.rand(d, device=dev, dtype=dt) + 0.5
    cos, sin = torch.randn(t, d, device=dev, dtype=dt), torch.randn(t, d, device=dev, dtype=dt)
    outs = [torch.empty(1, t, h, d, device=dev, dtype=dt) for h in (hq, hkv, hkv)]
    half = d // 2
    hb = triton.next_power_of_2(half)
    mode = (K.GROUPED.value | K.TOKENS_SB.value | K.HAS_QW.value | K.HAS_KW.value)
    common = (qkv.stride(1), qkv.stride(0), 0, cos.stride(0), 1, t, hq, hkv, d, half, half,
              mode, 1e-6)

    def tiles_of(bt, bh):
        return triton.cdiv(t, bt) * (triton.cdiv(hq, bh) + 2 * triton.cdiv(hkv, bh))

    if dev != "cuda":
        check_early(qkv, qw, kw, cos, sin, outs, common, hb, tiles_of,
                    ((16, 2, 4), (8, 1, 1), (4, 4, 2)), (3, 7))
        # partial rotary: rotary_dim d / 2 (cos / sin of that width), the rest passed through
        rh = d // 4
        pcos, psin = cos[:, :2 * rh].contiguous(), sin[:, :2 * rh].contiguous()
        pcommon = (qkv.stride(1), qkv.stride(0), 0, pcos.stride(0), 1, t, hq, hkv, d, rh, rh,
                   mode, 1e-6)
        check_early(qkv, qw, kw, pcos, psin, outs, pcommon, triton.next_power_of_2(rh),
                    tiles_of, ((16, 2, 4), (4, 4, 2)), (3, 7))
        return
    if args.early:
        shapes = ((16, 2, 4), (8, 1, 1), (16, 1, 4), (8, 2, 2), (32, 2, 8), (16, 4, 4))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        per_sm = (2, 4, 8, 16)
        check_early(qkv, qw, kw, cos, sin, outs, common, hb, tiles_of, shapes[:2],
                    [p * sms for p in per_sm])
        for bt, bh, warps in shapes:
            runs = [("library", K.qkv_split_norm_rope_fwd_kernel, tiles_of(bt, bh)),
                    ("early", fwd_early_kernel, tiles_of(bt, bh))]
            runs += [(f"persistent {p:2d}/SM", fwd_persistent_kernel,
                      min(p * sms, tiles_of(bt, bh))) for p in per_sm]
            for name, kern, grid in runs:
                ms = bench(lambda: kern[(grid,)](
                    qkv, qw, kw, cos, sin, *outs, *common, HB=hb, BT=bt, BH=bh,
                    num_warps=warps))
                print(f"fwd {name:16s} BT {bt:2d} BH {bh} warps {warps}: {ms * 1e3:8.1f} us",
                      flush=True)
        return
    grads = [torch.randn_like(o) for o in outs]
    dqkv = torch.empty_like(qkv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    parts = [torch.empty(16 * sms, d, device="cuda") for _ in range(2)]
    fwd_bytes = 2 * t * n * 2
    bwd_bytes = 3 * t * n * 2
    results = {"fwd": [], "bwd": []}

    def ints(text):
        return [int(v) for v in text.split(",")]

    for bt, bh, warps in itertools.product(ints(args.bt), ints(args.bh), ints(args.warps)):
        if bt * bh * hb > 16384:
            continue
        tiles = tiles_of(bt, bh)
        ms = bench(lambda: K.qkv_split_norm_rope_fwd_kernel[(tiles,)](
            qkv, qw, kw, cos, sin, *outs, *common, HB=hb, BT=bt, BH=bh, num_warps=warps))
        results["fwd"].append((ms, bt, bh, warps, 0))
        print(f"fwd BT {bt:2d} BH {bh} warps {warps}: {ms * 1e3:8.1f} us", flush=True)
        for per_sm in (1, 2, 4, 8, 16):
            progs = min(tiles, per_sm * sms)
            ms = bench(lambda: K.qkv_split_norm_rope_bwd_kernel[(progs,)](
                *grads, qkv, qw, kw, cos, sin, dqkv, *parts, *common, HB=hb, BT=bt, BH=bh,
                num_warps=warps))
            results["bwd"].append((ms, bt, bh, warps, per_sm))
            print(f"bwd BT {bt:2d} BH {bh} warps {warps} programs/SM {per_sm:2d}: "
                  f"{ms * 1e3:8.1f} us", flush=True)
    name = torch.cuda.get_device_name(0)
    for kind, nbytes in (("fwd", fwd_bytes), ("bwd", bwd_bytes)):
        print(f"{kind}: tokens {t}, heads {hq} + 2 x {hkv}, head_dim {d}, bf16, {name}")
        for ms, bt, bh, warps, per_sm in sorted(results[kind])[:args.top]:
            print(f"  {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:7.0f} GB/s  BT {bt:2d} BH {bh} "
                  f"warps {warps}" + (f" programs/SM {per_sm}" if per_sm else ""))


if __name__ == "__main__":
    main()
