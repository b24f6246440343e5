"""Sweep launch configurations of the qwen2vl_mrope kernel with Triton's JIT (tuning only;
the library uses the AOT variants in triton_src/qwen2vl_mrope.py). At one shape (Qwen2-VL-7B:
28 q heads, 4 kv heads, head_dim 128, section [16, 24, 24]), for both input layouts, it times
tiles of BS seq positions x BH heads, warps, head blocks per program (STEPS), the grid order,
and SEC8 (cos / sin loaded as 16-byte vectors where the sections allow), with
tune_rope.py's sweep; the library walks head groups fastest in both layouts (the AOT tile's
row is timed that way).

    python benchmarks/tune_qwen2vl_mrope.py [--batch 4] [--seq 2048] [--heads 28]
                                            [--kv-heads 4] [--top 8]
"""
import argparse

import torch
import triton

import _tune as T
import qwen2vl_mrope as K  # noqa: E402 (triton_src, on the path _tune sets)
from benchmark_qwen2vl_mrope import mrope_cos_sin
from tune_rope import inputs, sweep

SECTION = (16, 24, 24)


def launcher(q, k, qo, ko, cos, sin, hb, bs, bh, steps, warps, heads_fastest, sec8):
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    groups = triton.cdiv(triton.cdiv(hq, bh) + triton.cdiv(hkv, bh), steps)
    strides = [x.stride(i) for x in (q, k, qo, ko) for i in range(3)]
    grid = (b * triton.cdiv(s, bs) * groups,)
    mode = K.MODE_HEADS_FASTEST.value if heads_fastest else 0

    def run():
        K.qwen2vl_mrope_kernel[grid](q, k, qo, ko, cos, sin, *strides, cos.stride(0),
                                     cos.stride(1), cos.stride(2), s, hq, hkv, d // 2,
                                     *SECTION, mode, HB=hb, BS=bs, BH=bh, STEPS=steps,
                                     SEC8=sec8, num_warps=warps)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    b, s, hq, hkv, d = args.batch, args.seq, args.heads, args.kv_heads, 128
    dtype, hb = torch.bfloat16, 64
    T.setup("cuda")
    cos, sin = mrope_cos_sin(b, s, d, "cuda", dtype)
    nbytes = 2 * b * s * (hq + hkv) * d * 2 + 2 * b * s * d * 2
    print(f"qwen2vl_mrope tuning, bf16, batch {b} seq {s} heads {hq}/{hkv} head_dim {d}, "
          f"section {list(SECTION)}; {nbytes / 1e6:.1f} MB per pass, floor "
          f"{nbytes / T.COPY_BW / 1e3:.1f} us; "
          f"AOT tiles (BS, BH, STEPS, warps) by SEC8 {[K._TILES['default'][v][hb] for v in (0, 1)]}")
    for layout in ("bshd", "bhsd"):
        q, k, qo, ko = inputs(layout, b, s, hq, hkv, d, dtype)
        for sec8 in (0, 1):
            print(f"\n[{layout}] SEC8 {sec8}")
            sweep(lambda cfg: T.bench(launcher(q, k, qo, ko, cos, sin, hb, *cfg, sec8)), hq,
                  hkv, hb, 1, nbytes, args.top, K._TILES["default"][sec8][hb])
        ref_q, ref_k = torch.empty_like(qo), torch.empty_like(ko)
        launcher(q, k, ref_q, ref_k, cos, sin, hb, *K._TILES["default"][0][hb], 1, 0)()
        launcher(q, k, qo, ko, cos, sin, hb, *K._TILES["default"][1][hb], 1, 1)()
        print(f"SEC8 1 against 0: q equal {torch.equal(qo, ref_q)}, k equal {torch.equal(ko, ref_k)}")
        try:
            import fk
            T.timed("fk.qwen2vl_mrope (AOT, with allocation)",
                    lambda: fk.qwen2vl_mrope(q, k, cos, sin, list(SECTION)), nbytes)
        except ImportError:
            pass
        del q, k, qo, ko


if __name__ == "__main__":
    main()
