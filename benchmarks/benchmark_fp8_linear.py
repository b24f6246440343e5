"""Benchmark fk.nn.FP8Linear (blockwise FP8 GEMMs, torch's scaled_mm on sm_90) against a
bf16 nn.Linear, forward + backward, and the share of its time spent quantizing.

    python benchmarks/benchmark_fp8_linear.py --model llama_3_8b --tokens 8192
    python benchmarks/benchmark_fp8_linear.py --device cpu --tokens 256 --quick   # smoke test

Per token count and projection (``up``: hidden -> intermediate, Llama-3-8B 8192 x 4096 x
14336; ``down``: intermediate -> hidden), x (tokens, in) and W (out, in) bf16, both
trainable:

full      forward + backward (6 M K N flops). ``bf16``: F.linear (cuBLAS). ``fp8``:
          fk.fp8_linear with the weight quantized in the call, as in the first (or only)
          micro-batch of a step; ``fp8 cached``: the weight's quantized copy reused, as in
          later micro-batches of gradient accumulation. Speedup = bf16 / fp8.
forward   forward only (x requiring grad: the FP8 forward also writes x's column-wise copy).
parts     what one fp8 forward + backward is made of: quantizing x (both layouts), dy (both
          layouts) and W (128 x 128, with its transposed copy), and the three scaled GEMMs on
          quantized operands; ``quant share`` = the three quantizations / the fp8 time.

On the CPU every FP8 GEMM runs the float32 reference path (dequantize + matmul): the numbers
are a smoke test only. Rows go to benchmarks/results/fp8_linear_<gpu>.csv.
"""
import statistics

import torch
import torch.nn.functional as F

import _harness as H


def main():
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--proj", default="up,down", help="comma-separated: up, down")
    p.set_defaults(tokens="8192")
    args = p.parse_args()
    ctx = H.setup(args)
    import fk
    from fk.ops import fp8_linear as L

    dev, dtype = ctx.device, ctx.dtype
    hidden, inter = ctx.model.hidden_size, ctx.model.intermediate_size
    dims = {"up": (hidden, inter), "down": (inter, hidden)}
    info = H._versions(dev)
    rows, lines = [], []
    for proj in [s.strip() for s in args.proj.split(",") if s.strip()]:
        k, n = dims[proj]
        for m in ctx.tokens:
            torch.manual_seed(m)
            x = torch.randn(m, k, device=dev, dtype=dtype, requires_grad=True)
            w = (torch.randn(n, k, device=dev, dtype=dtype) * k ** -0.5).requires_grad_()
            dy = torch.randn(m, n, device=dev, dtype=dtype)
            grads = [x, w]

            def full(fn):
                return lambda: fn().backward(dy)

            xq = fk.fp8_quantize(x.detach(), layout="both")
            dq = fk.fp8_quantize(dy, layout="both")
            wq = fk.fp8_quantize(w.detach(), block=(128, 128), layout="both")

            def gemms():
                L.scaled_gemm(xq[0], xq[1], wq[0], wq[1], (128, 128), dtype)
                L.scaled_gemm(dq[0], dq[1], wq[2], wq[3], (128, 128), dtype)
                L.scaled_gemm(dq[2], dq[3], xq[2], xq[3], (1, 128), dtype)

            fns = {
                "full bf16": (full(lambda: F.linear(x, w)), grads),
                "full fp8": (full(lambda: fk.fp8_linear(x, w, cache_weight=False)), grads),
                "full fp8 cached": (full(lambda: fk.fp8_linear(x, w)), grads),
                "forward bf16": (lambda: F.linear(x, w), ()),
                "forward fp8": (lambda: fk.fp8_linear(x, w, cache_weight=False), ()),
                "forward fp8 cached": (lambda: fk.fp8_linear(x, w), ()),
                "quant x": (lambda: fk.fp8_quantize(x.detach(), layout="both"), ()),
                "quant dy": (lambda: fk.fp8_quantize(dy, layout="both"), ()),
                "quant W": (lambda: fk.fp8_quantize(w.detach(), block=(128, 128),
                                                    layout="both"), ()),
                "gemms": (gemms, ()),
            }
            for fn, g in fns.values():  # first calls (and the weight cache) before timing
                fn()
                for t in g:
                    t.grad = None
            times = H.time_rounds(fns, dev, args, kernels=args.timer == "kernels"
                                  and dev.type == "cuda")
            ms = {name: statistics.median(v) for name, v in times.items()}
            lines.extend(f"{proj} {m}: {line}" for line in H.rounds_note(times))
            flops = {"full": 6 * m * k * n, "forward": 2 * m * k * n}
            for name, t in ms.items():
                mode = name.split()[0] if name.split()[0] in flops else "parts"
                fl = flops.get(mode, 0)
                rows.append(dict(info, op="fp8_linear", model=f"{ctx.model.name}:{proj}",
                                 dtype=args.dtype, mode=mode, tokens=m, provider=name,
                                 timer=args.timer if dev.type == "cuda" else "wall", ms=t,
                                 peak_mb=float("nan"), bytes=fl, copy_bw=float("nan"),
                                 fraction_of_copy_bw=float("nan"),
                                 tflops=fl / (t * 1e-3) / 1e12 if fl else float("nan")))
            quant = ms["quant x"] + ms["quant dy"] + ms["quant W"]
            print(f"\n{proj}: x ({m}, {k}) @ W ({n}, {k}).T, {args.dtype} | {info['gpu']} | "
                  f"torch {info['torch']} | scaled_mm: {L.uses_scaled_mm(dev)}")
            print(f"{'':22}{'ms':>9}{'TFLOP/s':>9}{'vs bf16':>9}")
            for mode in ("full", "forward"):
                base = ms[f"{mode} bf16"]
                for name in (f"{mode} bf16", f"{mode} fp8", f"{mode} fp8 cached"):
                    tf = flops[mode] / (ms[name] * 1e-3) / 1e12
                    print(f"{name:22}{ms[name]:9.3f}{tf:9.1f}{base / ms[name]:8.2f}x")
            for name in ("quant x", "quant dy", "quant W", "gemms"):
                print(f"{name:22}{ms[name]:9.3f}")
            print(f"quant share of fp8 fwd+bwd: {quant / ms['full fp8']:.1%} (x, dy, W); "
                  f"{(ms['quant x'] + ms['quant dy']) / ms['full fp8 cached']:.1%} with the "
                  f"weight cached; GEMMs {ms['gemms'] / ms['full fp8']:.1%}")
    for line in lines:
        print(f"note: {line}")
    if args.out and rows:
        from pathlib import Path
        print(f"wrote {H.write_csv(rows, Path(args.out), 'fp8_linear', info['gpu'])}")


if __name__ == "__main__":
    main()
