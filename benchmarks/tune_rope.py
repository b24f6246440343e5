"""Sweep launch configurations of the rope kernel with Triton's JIT (tuning only; the library
uses the AOT variants in triton_src/rope.py). At one shape, for both input layouts, it times
tiles of BS seq positions x BH heads (x HB pairs), warps, head blocks per program (STEPS) and
the grid order, so the best ones can be written into triton_src/rope.py (_TILES) as data.

    python benchmarks/tune_rope.py [--batch 4] [--seq 2048] [--heads 32] [--kv-heads 8]
                                   [--head-dims 128] [--top 8]
"""
import argparse
import itertools
import torch
import triton

import _tune as T
import rope as K  # noqa: E402 (triton_src, on the path _tune sets)


def inputs(layout, b, s, hq, hkv, d, dtype):
    if layout == "bshd":  # transposed views of (B, S, H, D) projections, as models produce
        q = torch.randn(b, s, hq, d, device="cuda", dtype=dtype).transpose(1, 2)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=dtype).transpose(1, 2)
    else:
        q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=dtype)
    return q, k, torch.empty_like(q), torch.empty_like(k)


def launcher(q, k, qo, ko, cos, sin, hb, bs, bh, steps, warps, heads_fastest):
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    half = cos.shape[-1] // 2
    groups = triton.cdiv(triton.cdiv(hq, bh) + triton.cdiv(hkv, bh), steps)
    strides = [x.stride(i) for x in (q, k, qo, ko) for i in range(3)]
    grid = (b * triton.cdiv(s, bs) * groups,)

    def run():
        K.rope_kernel[grid](q, k, qo, ko, cos, sin, *strides, 0, cos.stride(1), s, hq, hkv, half,
                            d, half, 0, heads_fastest, HB=hb, BS=bs, BH=bh, STEPS=steps,
                            num_warps=warps)
    return run


def sweep(time_cfg, hq, hkv, hb, natural, nbytes, top, aot):
    """Time tiles (BS, BH, STEPS, warps, heads_fastest) of a rotary kernel over q and k
    (``time_cfg(cfg)`` -> ms), print the best ``top`` (their share of the copy bandwidth
    _tune.setup measured) and the AOT tile's time (shared by the rotary-embedding sweeps)."""
    results = []
    # Phase 1: tile shape and warps, one head block per program or all of them (cos / sin
    # loaded once per seq block), grid in memory order.
    for bs, bh, warps in itertools.product((1, 2, 4, 8, 16), (2, 4, 8, 16), (2, 4, 8)):
        elems = bs * bh * hb * 2
        if not 1024 <= elems <= 16384 or elems // (32 * warps) < 8:
            continue
        nblk = triton.cdiv(hq, bh) + triton.cdiv(hkv, bh)
        for steps in sorted({1, nblk}):
            cfg = (bs, bh, steps, warps, natural)
            results.append((time_cfg(cfg), cfg))
    results.sort()
    # Phase 2: the best tiles with other head blocks per program, and either grid order.
    for _, (bs, bh, _, warps, _) in results[:3]:
        nblk = triton.cdiv(hq, bh) + triton.cdiv(hkv, bh)
        for steps, hf in itertools.product(sorted({1, 2, 4, nblk}), (0, 1)):
            cfg = (bs, bh, steps, warps, hf)
            if any(c == cfg for _, c in results):
                continue
            results.append((time_cfg(cfg), cfg))
    results.sort()
    print("   us     GB/s  % of copy ceiling   BS  BH  STEPS  warps  heads_fastest")
    for ms, (bs, bh, steps, warps, hf) in results[:top]:
        print(f"{ms * 1e3:7.1f}  {nbytes / ms / 1e6:6.0f}  {nbytes / ms / 1e6 / T.COPY_BW * 100:5.1f} %"
              f"           {bs:3d} {bh:3d}  {steps:5d}  {warps:5d}  {hf:13d}")
    if aot is not None:
        cfg = (*aot[:3], aot[3], natural)
        ms = next((m for m, c in results if c == cfg), None)
        if ms is None:
            ms = time_cfg(cfg)
        print(f"AOT tile {cfg}: {ms * 1e3:.1f} us, {nbytes / ms / 1e6:.0f} GB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    b, s, hq, hkv = args.batch, args.seq, args.heads, args.kv_heads
    dtype = torch.bfloat16
    T.setup("cuda")
    print(f"rope tuning, bf16, batch {b} seq {s} heads {hq}/{hkv}")
    for d in (int(x) for x in args.head_dims.split(",")):
        hb = triton.next_power_of_2(d // 2)
        inv_freq = 1.0 / 500000.0 ** (torch.arange(0, d, 2, device="cuda") / d)
        freqs = torch.arange(s, device="cuda")[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), -1)[None]
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        nbytes = 2 * b * s * (hq + hkv) * d * 2 + 2 * s * d * 2
        print(f"\nhead_dim {d} (HB {hb}): {nbytes / 1e6:.1f} MB moved per pass, floor "
              f"{nbytes / T.COPY_BW / 1e3:.1f} us at the copy bandwidth; AOT tile (BS, BH, STEPS, warps) "
              f"{K._TILES['default'].get(hb)}")
        for layout in ("bshd", "bhsd"):
            q, k, qo, ko = inputs(layout, b, s, hq, hkv, d, dtype)
            src = torch.cat((q.reshape(-1), k.reshape(-1)))
            dst = torch.empty_like(src)
            ms = T.bench(lambda: dst.copy_(src))
            print(f"\n[{layout}] torch copy of q and k: {ms * 1e3:7.1f} us "
                  f"{2 * src.numel() * 2 / ms / 1e6:6.0f} GB/s")
            del src, dst
            natural = 1 if layout == "bshd" else 0
            sweep(lambda cfg: T.bench(launcher(q, k, qo, ko, cos, sin, hb, *cfg)), hq, hkv, hb,
                  natural, nbytes, args.top, K._TILES["default"].get(hb))
            try:
                import fk
                qr, kr = q.detach(), k.detach()
                T.timed("fk.rope (AOT, with allocation)", lambda: fk.rope(qr, kr, cos, sin),
                        nbytes)
            except ImportError:
                pass
            del q, k, qo, ko


if __name__ == "__main__":
    main()
