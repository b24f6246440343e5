"""Sweep launch configurations of the qkv_split_norm_rope kernels with Triton's JIT (tuning
only; the library uses the AOT variants in triton_src/qkv_split_norm_rope.py). At one shape
(Megatron's grouped (S, B, N) qkv, both norm weights, full rotary, bshd outputs) it times the
forward over tiles of BT tokens x BH heads and warps (cos / sin loaded after the rows'
statistics, or first: COS_FIRST), and the backward over blocks of BT tokens walked BH heads at
a time, warps, the persistent programs per multiprocessor and register caps, so the best ones
can be written into triton_src/qkv_split_norm_rope.py (FWD_TILES, BWD_TILES) and the CUDA
dispatch as data. Every configuration must give the first one's outputs before it is timed.
The qkv is (S, B, N) with B = --batch (2 by default, as the benchmark's 8192 tokens in
sequences of 4096; at B = 1 the JIT makes the batch a constant, which the library's variants
do not). The backward's times are the kernel's alone: the library also sums the programs'
weight-gradient rows afterwards, so a grid of more programs gains less there than here
(benchmarks/NOTES.md v27).

    python benchmarks/tune_qkv_split_norm_rope.py [--tokens 8192] [--heads 32] [--kv-heads 4]
                                                  [--head-dim 128] [--top 8] [--cos-first 0,1]
                                                  [--per-sm 2,4,8,16,32] [--kernels fwd,bwd]
                                                  [--maxnreg 0,128]
"""
import argparse
import itertools
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import qkv_split_norm_rope as K  # noqa: E402


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def ints(text):
    return [int(v) for v in text.split(",")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2, help="sequences (B) of tokens / batch")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--warps", default="1,2,4,8", help="comma-separated warp counts to sweep")
    ap.add_argument("--bt", default="2,4,8,16,32", help="comma-separated tokens per tile")
    ap.add_argument("--bh", default="1,2,4,8", help="comma-separated heads per tile")
    ap.add_argument("--per-sm", default="2,4,8,16,32",
                    help="backward: comma-separated persistent programs per multiprocessor")
    ap.add_argument("--cos-first", default="0,1", help="forward forms: COS_FIRST 0 and / or 1")
    ap.add_argument("--kernels", default="fwd,bwd", help="which kernels to sweep")
    ap.add_argument("--maxnreg", default="0",
                    help="backward: comma-separated register caps (0: none; ptxas chooses)")
    args = ap.parse_args()
    t, hq, hkv, d = args.tokens, args.heads, args.kv_heads, args.head_dim
    dt = torch.bfloat16
    n = (hq + 2 * hkv) * d
    nb = args.batch
    seq = t // nb
    t = seq * nb
    qkv = torch.randn(seq, nb, n, device="cuda", dtype=dt)
    qw = torch.rand(d, device="cuda", dtype=dt) + 0.5
    kw = torch.rand(d, device="cuda", dtype=dt) + 0.5
    cos, sin = (torch.randn(seq, d, device="cuda", dtype=dt) for _ in range(2))
    outs = [torch.empty(nb, seq, h, d, device="cuda", dtype=dt) for h in (hq, hkv, hkv)]
    grads = [torch.randn_like(o) for o in outs]
    dqkv = torch.empty_like(qkv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    part = torch.empty(max(ints(args.per_sm)) * sms, 2 * d, device="cuda")
    half = d // 2
    hb = triton.next_power_of_2(half)
    mode = (K.GROUPED.value | K.TOKENS_SB.value | K.HAS_QW.value | K.HAS_KW.value)
    common = (qkv.stride(1), qkv.stride(0), 0, cos.stride(0), nb, seq, hq, hkv, d, half, half,
              mode, 1e-6)
    fwd_bytes = 2 * t * n * 2
    bwd_bytes = 3 * t * n * 2
    results = {"fwd": [], "bwd": []}
    first = {}

    def same_as_first(kind, got, bt, bh, warps):
        """The outputs of a configuration against the first one's, up to the order of the
        fp32 sums (which can move a bf16 rounding, and the rotation scales that by cos and
        sin)."""
        first.setdefault(kind, got)
        for a, b, what in zip(got, first[kind], range(len(got))):
            torch.testing.assert_close(
                a, b, rtol=2e-2, atol=5e-2,
                msg=lambda m: f"{kind} BT {bt} BH {bh} warps {warps}: output {what}: {m}")

    for bt, bh, warps in itertools.product(ints(args.bt), ints(args.bh), ints(args.warps)):
        if bt * bh * hb > 16384:
            continue
        tiles = triton.cdiv(t, bt) * (triton.cdiv(hq, bh) + 2 * triton.cdiv(hkv, bh))
        for cf in ints(args.cos_first) if "fwd" in args.kernels else ():
            def fwd():
                K.qkv_split_norm_rope_fwd_kernel[(tiles,)](
                    qkv, qw, kw, cos, sin, *outs, *common, HB=hb, BT=bt, BH=bh, COS_FIRST=cf,
                    num_warps=warps)
            for o in outs:
                o.fill_(float("nan"))
            fwd()
            same_as_first("fwd", [o.float() for o in outs], bt, bh, warps)
            ms = bench(fwd)
            results["fwd"].append((ms, bt, bh, warps, 0, 0, cf))
            print(f"fwd BT {bt:2d} BH {bh} warps {warps} COS_FIRST {cf}: {ms * 1e3:8.1f} us",
                  flush=True)
        bwd = itertools.product(ints(args.per_sm), ints(args.maxnreg))
        for per_sm, cap in bwd if "bwd" in args.kernels else ():
            # the backward walks blocks of BT tokens, each through all its heads
            progs = min(triton.cdiv(t, bt), per_sm * sms)
            opts = {"maxnreg": cap} if cap else {}

            def run():
                K.qkv_split_norm_rope_bwd_kernel[(progs,)](
                    *grads, qkv, qw, kw, cos, sin, dqkv, part, *common, HB=hb, BT=bt, BH=bh,
                    num_warps=warps, **opts)
            dqkv.fill_(float("nan"))
            run()
            same_as_first("bwd", (dqkv.float(), part[:progs].sum(0)), bt, bh, warps)
            ms = bench(run)
            results["bwd"].append((ms, bt, bh, warps, per_sm, cap, None))
            print(f"bwd BT {bt:2d} BH {bh} warps {warps} programs/SM {per_sm:2d} maxnreg "
                  f"{cap}: {ms * 1e3:8.1f} us", flush=True)
    name = torch.cuda.get_device_name(0)
    for kind, nbytes in (("fwd", fwd_bytes), ("bwd", bwd_bytes)):
        print(f"{kind}: tokens {t}, heads {hq} + 2 x {hkv}, head_dim {d}, bf16, {name}")
        best = sorted(results[kind], key=lambda r: r[0])[:args.top]
        for ms, bt, bh, warps, per_sm, cap, cf in best:
            print(f"  {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:7.0f} GB/s  BT {bt:2d} BH {bh} "
                  f"warps {warps}" + (f" programs/SM {per_sm}" if per_sm else "")
                  + (f" maxnreg {cap}" if cap else "")
                  + (f" COS_FIRST {cf}" if cf is not None else ""))


if __name__ == "__main__":
    main()
