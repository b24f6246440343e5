"""Benchmark fk.layer_norm against torch, torch.compile and Liger.

    python benchmarks/benchmark_layer_norm.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_layer_norm.py --device cpu --tokens 64 --quick   # smoke test

Shapes: (tokens, hidden_size) of the model, weight and bias, eps 1e-5 (torch's default).
"torch" is torch.nn.functional.layer_norm in eager mode (ATen's fused CUDA kernels).

Minimum traffic (bytes_moved), M tokens, N hidden, e bytes per element:
  forward  read x, w, b; write y, mean, rstd (fp32):       2*M*N*e + 2*N*e + 8*M
  backward read dy, x, w, mean, rstd; write dx, dw, db:  + 3*M*N*e + 3*N*e + 8*M
At 8192 x 4096 bf16: forward 134,299,648 B (32.0 us at 4.2 TB/s), forward + backward
335,716,352 B (79.9 us).
"""
import torch

import _harness as H

EPS = 1e-5


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    n = ctx.model.hidden_size

    def reference(x, weight, bias):
        return torch.nn.functional.layer_norm(x, (n,), weight, bias, EPS)

    def make_inputs(tokens):
        x = torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype, requires_grad=True)
        w = 1.0 + 0.1 * torch.randn(n, device=ctx.device, dtype=ctx.dtype)
        b = 0.1 * torch.randn(n, device=ctx.device, dtype=ctx.dtype)
        return x, w.requires_grad_(), b.requires_grad_()

    def bytes_moved(tokens, which):
        mn, vec, stats = tokens * n * ctx.elem, n * ctx.elem, tokens * 4
        fwd = 2 * mn + 2 * vec + 2 * stats  # read x, w, b; write y, mean and rstd (float32)
        # backward: read dy, x, w, mean, rstd; write dx, dw, db
        return fwd if which == "forward" else fwd + 3 * mn + 3 * vec + 2 * stats

    def liger_layer_norm():
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction  # (X, W, B, eps)
        return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)

    def fk_layer_norm():
        import fk
        return lambda x, w, b: fk.layer_norm(x, w, b, EPS)

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_layer_norm,
        "fk": fk_layer_norm,
    }
    rows = H.run(ctx, "layer_norm", make_inputs, providers, bytes_moved,
                 shape=f"(tokens, {n}) eps={EPS} weight+bias")
    print_vs_fastest(rows)


def print_vs_fastest(rows):
    """fk's time over the fastest other provider, torch eager included: unlike RMSNorm, torch
    has fused LayerNorm kernels of its own, so eager can be the one to beat."""
    ms = {(r["mode"], r["tokens"], r["provider"]): r["ms"] for r in rows}
    print("\nfk / fastest of torch, torch.compile, liger:")
    for mode, tokens in dict.fromkeys((r["mode"], r["tokens"]) for r in rows):
        others = {p: t for (m, k, p), t in ms.items() if (m, k) == (mode, tokens) and p != "fk"}
        fk_ms = ms.get((mode, tokens, "fk"))
        if others and fk_ms:
            best = min(others, key=others.get)
            print(f"  {mode:8s} {tokens:6d}: {fk_ms / others[best]:.2f} (fastest: {best})")


if __name__ == "__main__":
    main()
