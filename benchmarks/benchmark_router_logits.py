"""Benchmark fk.router_logits (float32 router logits from bf16 x and weight) against torch.

    python benchmarks/benchmark_router_logits.py                 # linghe's shape on the GPU
    python benchmarks/benchmark_router_logits.py --device cpu --tokens 256 --hidden 128 \\
        --experts 24 --rep 20                                    # smoke test

Shape: x (tokens, hidden), weight (experts, hidden); default linghe's MoE router: 8192
tokens, hidden 2048, 256 experts (8.6 GFLOP per product). Providers:

  fk                 fk.router_logits: one GEMM kernel, bf16 operands, float32 out
  torch fp32 copies  x.float() @ w.float().t() (Megatron's moe_router_dtype="fp32" in eager:
                     two casts, then a float32 GEMM)
  torch out_dtype    torch.mm(x, w.t(), out_dtype=torch.float32) (cuBLAS bf16 GEMM with
                     float32 output, where this torch has it)
  cublas bf16        x @ w.t() in bf16 out: the bf16 GEMM rate this shape allows (the
                     ceiling of the "of bf16 GEMM" column)

Then the routing after it, fk.router_topk (k = --topk, softmax after top-k and sigmoid with
an expert bias) against the same in torch eager (topk, softmax / sigmoid, scatter into the
dense (tokens, experts) probs and map, as Megatron's topk_softmax_with_capacity), forward +
backward from the float32 logits.

Modes: forward; forward + backward (dx in bf16, dweight in float32, from a float32
grad_logits). The backward of "torch fp32 copies" is autograd's (two fp32 GEMMs and the cast
back of dx); "torch out_dtype" has no backward with mixed dtypes and is timed forward only.
Columns: ms, TFLOP/s (2 T H E flops per product: one forward, three in forward + backward),
the fraction of cublas bf16's rate, and linghe's H800 figure (61.6 us forward, 61.6 + 78.1 us
forward + backward) scaled by the copy bandwidths (H800 3.35 TB/s; this GPU's measured).
"""
import argparse

import torch

import _harness as H

LINGHE_US = {"forward": 61.6, "full": 61.6 + 78.1}
H800_COPY_BW = 3.35e12


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--dtype", default="bf16", choices=sorted(H.DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=float, default=25.0)
    p.add_argument("--rep", type=float, default=200.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--copy-bw", type=float, default=None, help="B/s (default: measured)")
    args = p.parse_args()
    import fk

    device, dtype = torch.device(args.device), H.DTYPES[args.dtype]
    t, h, e = args.tokens, args.hidden, args.experts
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(t, h, device=device, dtype=dtype, generator=g).requires_grad_()
    w = (torch.randn(e, h, device=device, dtype=dtype, generator=g) * h ** -0.5).requires_grad_()
    grad = torch.randn(t, e, device=device, generator=g) * 1e-3
    xd, wd = x.detach(), w.detach()

    def has_out_dtype():
        try:
            torch.mm(xd[:8], wd.t(), out_dtype=torch.float32)
            return True
        except (TypeError, RuntimeError):
            return False

    fwd = {"fk": lambda: fk.router_logits(xd, wd),
           "torch fp32 copies": lambda: xd.float() @ wd.float().t(),
           "cublas bf16": lambda: xd @ wd.t()}
    if has_out_dtype():
        fwd["torch out_dtype"] = lambda: torch.mm(xd, wd.t(), out_dtype=torch.float32)
    full = {"fk": lambda: fk.router_logits(x, w).backward(grad),
            "torch fp32 copies": lambda: (x.float() @ w.float().t()).backward(grad)}

    copy_bw = args.copy_bw or H.measure_copy_bw(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{gpu}; torch {torch.__version__}; x ({t}, {h}) {args.dtype}, weight ({e}, {h}); "
          f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; {args.rounds} rounds (median)")
    flops = 2.0 * t * h * e
    ref = None
    for mode, fns, products in (("forward", fwd, 1), ("full", full, 3)):
        times = H.time_rounds({n: (f, (x, w) if mode == "full" else ()) for n, f in fns.items()},
                              device, args)
        ms = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
        if mode == "forward":
            ref = flops / (ms["cublas bf16"] * 1e-3)
        target = LINGHE_US[mode] * H800_COPY_BW / copy_bw / 1e3
        print(f"\n{mode}: linghe's H800 time scaled to this GPU {target * 1e3:.1f} us")
        print(f"{'provider':<20}{'us':>10}{'TFLOP/s':>10}{'of bf16 GEMM':>14}{'vs fk':>8}")
        for n, v in ms.items():
            rate = products * flops / (v * 1e-3)
            print(f"{n:<20}{v * 1e3:>10.1f}{rate / 1e12:>10.1f}{rate / ref:>14.2f}"
                  f"{v / ms['fk']:>8.2f}")
        for line in H.rounds_note(times):
            print("  " + line)

    routing(args, device, copy_bw)


def torch_topk(logits, k, score, bias=None):
    """Megatron's topk_softmax_with_capacity without capacity, in torch eager."""
    if score == "sigmoid":
        s = torch.sigmoid(logits)
        _, idx = torch.topk(s + bias, k, dim=-1)
        top = torch.gather(s, 1, idx)
        top = top / (top.sum(-1, keepdim=True) + 1e-20)
    else:
        vals, idx = torch.topk(logits, k, dim=-1)
        top = torch.softmax(vals, dim=-1, dtype=torch.float32)
    probs = torch.zeros_like(logits).scatter(1, idx, top)
    rmap = torch.zeros_like(logits, dtype=torch.bool).scatter(1, idx, True)
    return probs, rmap


def routing(args, device, copy_bw):
    import fk
    t, e, k = args.tokens, args.experts, args.topk
    g = torch.Generator(device=device).manual_seed(1)
    logits = torch.randn(t, e, device=device, generator=g).requires_grad_()
    bias = torch.randn(e, device=device, generator=g) * 0.1
    grad = torch.randn(t, e, device=device, generator=g)
    # bytes: logits read, probs and map written (forward); grad, logits, map read, grad of
    # the logits written (backward)
    nbytes = {"forward": t * e * (4 + 4 + 1), "full": t * e * (4 + 4 + 1 + 4 + 4 + 1 + 4)}
    for score in ("softmax", "sigmoid"):
        b = bias if score == "sigmoid" else None
        pf, mf = fk.router_topk(logits.detach(), k, score, expert_bias=b)
        pt, mt = torch_topk(logits.detach(), k, score, b)
        assert torch.equal(mf, mt) and torch.allclose(pf, pt, atol=1e-6)
        fns = {"forward": {
            "fk": lambda: fk.router_topk(logits.detach(), k, score, expert_bias=b),
            "torch": lambda: torch_topk(logits.detach(), k, score, b)},
            "full": {
            "fk": lambda: fk.router_topk(logits, k, score, expert_bias=b)[0].backward(grad),
            "torch": lambda: torch_topk(logits, k, score, b)[0].backward(grad)}}
        for mode, group in fns.items():
            grads = (logits,) if mode == "full" else ()
            times = H.time_rounds({n: (f, grads) for n, f in group.items()}, device, args)
            ms = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
            print(f"\nrouter_topk {score} k={k} {mode} ({e} experts)")
            print(f"{'provider':<20}{'us':>10}{'of copy bw':>12}{'vs fk':>8}")
            for n, v in ms.items():
                print(f"{n:<20}{v * 1e3:>10.1f}{nbytes[mode] / (v * 1e-3) / copy_bw:>12.2f}"
                      f"{v / ms['fk']:>8.2f}")


if __name__ == "__main__":
    main()
