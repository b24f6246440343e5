"""Sweep the tile configs of router_logits' three GEMM products (forward, grad x, grad
weight with its split over the tokens) with Triton's JIT (tuning only; the library uses the
AOT variants in triton_src/router_logits.py). At one shape (default linghe's router: 8192
tokens, hidden 2048, 256 experts, bf16) it times each config, checks it against torch in
float64, and prints TFLOP/s next to cuBLAS's bf16 GEMM of the same shape (torch.mm in bf16),
then the best config per product. The library's configs are _SM90 / _SM80 there.

    python benchmarks/tune_router_logits.py [--tokens 8192] [--hidden 2048] [--experts 256]
    python benchmarks/tune_router_logits.py --interpret --tokens 64 --hidden 32 --experts 16

`--interpret` runs the sweep under Triton's interpreter on the CPU at a tiny shape (a smoke
test of this script; its times mean nothing). A config that fails to compile or run is
reported and skipped.
"""
import argparse
import os
import sys
import time

if "--interpret" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import router_logits as K  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
CANDIDATES = [(128, 128, 64, 8, 8, 3), (128, 128, 32, 8, 8, 4), (128, 128, 32, 8, 8, 5),
              (64, 128, 64, 8, 4, 4), (128, 64, 64, 8, 4, 4), (64, 256, 64, 8, 8, 3),
              (128, 256, 64, 8, 8, 3), (64, 64, 64, 8, 4, 5)]
# grad weight: programs per SM the split aims at (the C++ side uses 2)
SPLIT_TARGETS = (1, 2, 4)


def bench(fn):
    if not INTERPRET:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def run(product, a, b, c, m, n, k, lda, ldb, ldc, cfg, splits=1, k_per_split=None):
    bm, bn, bk, group, warps, stages = cfg
    a_t, b_t = K._PRODUCTS[product][3:]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), splits)
    kw = {} if INTERPRET else {"num_warps": warps, "num_stages": stages}
    return lambda: K.router_gemm_kernel[grid](a, b, c, m, n, k, lda, ldb, ldc,
                                              k_per_split or k, A_T=a_t, B_T=b_t, BLOCK_M=bm,
                                              BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, **kw)


def rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--interpret", action="store_true")
    args = p.parse_args()
    device = "cpu" if INTERPRET else "cuda"
    dtype = DTYPES[args.dtype]
    t, h, e = args.tokens, args.hidden, args.experts
    sms = 1 if INTERPRET else torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(t, h, device=device).to(dtype)
    w = (torch.randn(e, h, device=device) * h ** -0.5).to(dtype)
    g = torch.randn(t, e, device=device) * 1e-3
    flops = 2.0 * t * h * e
    cublas = bench(lambda: x @ w.t()) if not INTERPRET else float("nan")
    print(f"x ({t}, {h}) {args.dtype}, weight ({e}, {h}): cuBLAS {args.dtype} GEMM "
          f"{flops / cublas / 1e9:.1f} TFLOP/s ({cublas * 1e3:.1f} us)")
    refs = {"fwd": x.double() @ w.double().t(), "dx": g.double() @ w.double(),
            "dw": g.double().t() @ x.double()}
    best = {}
    for product in ("fwd", "dx", "dw"):
        print(f"\n{product}")
        for cfg in CANDIDATES:
            bk = min(cfg[2], K._FP32_BLOCK_K) if dtype == torch.float32 else cfg[2]
            cfg = (*cfg[:2], bk, *cfg[3:])
            targets = SPLIT_TARGETS if product == "dw" else (None,)
            for target in targets:
                try:
                    if product == "fwd":
                        c = torch.empty(t, e, device=device)
                        fn = run(product, x, w, c, t, e, h, h, h, e, cfg)
                        out = lambda: c  # noqa: E731
                    elif product == "dx":
                        c = torch.empty(t, h, device=device, dtype=dtype)
                        fn = run(product, g, w, c, t, h, e, e, h, h, cfg)
                        out = lambda: c  # noqa: E731
                    else:
                        tiles = triton.cdiv(e, cfg[0]) * triton.cdiv(h, cfg[1])
                        splits = max(1, min(triton.cdiv(target * sms, tiles),
                                            triton.cdiv(t, 4 * cfg[2])))
                        kps = triton.cdiv(triton.cdiv(t, splits), cfg[2]) * cfg[2]
                        splits = triton.cdiv(t, kps)
                        c = torch.empty(splits, e, h, device=device)
                        fn = run(product, g, x, c, e, h, t, e, h, h, cfg, splits, kps)
                        out = lambda: c.sum(0)  # noqa: E731
                    fn()
                    err = rel(out(), refs[product])
                    ms = bench(fn) if product != "dw" else bench(lambda: (fn(), c.sum(0)))
                except Exception as exc:  # noqa: BLE001 (a config that does not fit)
                    print(f"  {cfg} {target or ''}: failed ({type(exc).__name__}: "
                          f"{str(exc)[:80]})")
                    continue
                rate = flops / ms / 1e9
                note = f" split target {target}" if target else ""
                print(f"  {cfg}{note}: {ms * 1e3:8.1f} us {rate:7.1f} TFLOP/s "
                      f"({cublas / ms:.2f} of cuBLAS) rel err {err:.1e}")
                if product not in best or ms < best[product][0]:
                    best[product] = (ms, cfg, target)
    print("\nbest:")
    for product, (ms, cfg, target) in best.items():
        print(f"  {product}: {cfg}{' split target ' + str(target) if target else ''} "
              f"{ms * 1e3:.1f} us")


if __name__ == "__main__":
    main()
