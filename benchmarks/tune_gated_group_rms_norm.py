"""Sweep launch configurations of the gated_group_rms_norm kernels with Triton's JIT (tuning
only; the library uses the AOT variants in triton_src/gated_group_rms_norm.py). At one shape
(Qwen3-Next's gated norm: x and gate (2, 4096, 32, 128), a (128,) weight shared by the
groups, silu) it times the forward over tiles of BM rows and warps, and the backward over the
same and the persistent programs per multiprocessor, so the best ones can be written into
triton_src/gated_group_rms_norm.py (FWD_TILES, BWD_TILES) and the CUDA dispatch as data.

    python benchmarks/tune_gated_group_rms_norm.py [--batch 2] [--seq 4096] [--heads 32]
                                                   [--group 128] [--top 8]
"""
import argparse
import itertools

import torch
import triton

import _tune as T
import gated_group_rms_norm as K  # noqa: E402 (triton_src, on the path _tune sets)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    b, s, h, g = args.batch, args.seq, args.heads, args.group
    dt = torch.bfloat16
    x, gate = (torch.randn(b, s, h, g, device="cuda", dtype=dt) for _ in range(2))
    w = 1 + 0.1 * torch.randn(g, device="cuda", dtype=dt)
    y, dy = torch.empty_like(x), torch.randn_like(x)
    dx, dg = torch.empty_like(x), torch.empty_like(x)
    m, n = b * s * h, g
    bg = triton.next_power_of_2(g)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    part = torch.empty(16 * sms, g, device="cuda")
    common = (m, n, g, b, s, h, 1e-6, 1, 1, 0, 0)  # eps, has_w, w_per_group, silu, no transpose
    T.setup("cuda")
    ceiling = T.COPY_BW * 1e9
    sizes = {"fwd": 3 * x.numel() * 2, "bwd": 5 * x.numel() * 2}  # x, gate, y / + dy, dx, dg
    results = {"fwd": [], "bwd": []}
    for bm, warps in itertools.product((4, 8, 16, 32, 64, 128), (1, 2, 4, 8)):
        if bm * bg > 16384 or bm * bg // (32 * warps) < 4:
            continue
        tiles = triton.cdiv(m, bm) * (n // g)
        ms = T.bench(lambda: K.gated_group_rms_norm_fwd_kernel[(tiles,)](
            x, gate, w, y, *common, BM=bm, BG=bg, num_warps=warps))
        results["fwd"].append((ms, bm, warps, 0))
        for per_sm in (1, 2, 4, 8, 16):
            progs = min(tiles, per_sm * sms)
            ms = T.bench(lambda: K.gated_group_rms_norm_bwd_kernel[(progs,)](
                dy, x, gate, w, dx, dg, part, *common, BM=bm, BG=bg, num_warps=warps))
            results["bwd"].append((ms, bm, warps, per_sm))
    name = torch.cuda.get_device_name(0)
    aot_tiles = {"fwd": K.FWD_TILES[bg], "bwd": K.BWD_TILES[bg]}
    # The backward's persistent grid: 16 warps per multiprocessor (the CUDA launcher).
    aot_per_sm = {"fwd": 0, "bwd": max(1, 16 // K.BWD_TILES[bg][1])}
    print(f"gated_group_rms_norm x ({b}, {s}, {h}, {g}) bf16, {name}; AOT (BM, warps) for "
          f"BG {bg}: forward {aot_tiles['fwd']}, backward {aot_tiles['bwd']} at "
          f"{aot_per_sm['bwd']} programs / SM")
    for kind, nbytes in sizes.items():
        print(f"{kind}: {nbytes / 1e6:.0f} MB, floor {nbytes / ceiling * 1e6:.1f} us")
        for ms, bm, warps, per_sm in sorted(results[kind])[:args.top]:
            print(f"  {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:7.0f} GB/s  "
                  f"{nbytes / ms * 1e3 / ceiling * 100:5.1f} %  BM {bm:3d} warps {warps}"
                  + (f" programs/SM {per_sm}" if per_sm else ""))
        aot = [r for r in results[kind] if (r[1], r[2]) == aot_tiles[kind]
               and r[3] == aot_per_sm[kind]]
        for ms, bm, warps, per_sm in aot:
            print(f"  AOT: {ms * 1e3:8.1f} us  {nbytes / ms * 1e3 / ceiling * 100:5.1f} %")


if __name__ == "__main__":
    main()
