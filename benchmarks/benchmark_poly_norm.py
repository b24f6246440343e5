"""Benchmark fk.poly_norm against torch, torch.compile and Liger.

    python benchmarks/benchmark_poly_norm.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_poly_norm.py --device cpu --tokens 64 --quick   # smoke test

PolyNorm at the model's hidden size: x (tokens, hidden), weight (3,), bias (one element),
of the benchmark dtype; eps 1e-6 (the PolyCom / Liger default).
"""
import torch

import _harness as H

EPS = 1e-6


def poly_norm_reference(x, weight, bias):
    """PolyCom's PolyNorm forward."""
    def norm(u):
        return u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + EPS)
    return weight[0] * norm(x ** 3) + weight[1] * norm(x ** 2) + weight[2] * norm(x) + bias


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    n = ctx.model.hidden_size

    def make_inputs(tokens):
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        x = torch.randn(tokens, n, **kw, requires_grad=True)
        weight = torch.full((3,), 1.0 / 3.0, **kw, requires_grad=True)
        bias = torch.ones((), **kw, requires_grad=True)
        return x, weight, bias

    def bytes_moved(tokens, which):
        mn = tokens * n * ctx.elem
        fwd = 2 * mn + tokens * 12  # read x; write y and three float32 rstd per row
        # backward: read dy, x, rstd; write dx; the parameter gradients are small
        return fwd if which == "forward" else fwd + 3 * mn + tokens * 12

    def liger_poly_norm():
        # in_place=False: dx in its own memory (in_place=True writes it over dy, which the
        # timing loop reuses).
        from liger_kernel.ops.poly_norm import LigerPolyNormFunction
        return lambda x, w, b: LigerPolyNormFunction.apply(x, w, b, EPS, False)

    def fk_poly_norm():
        import fk
        return lambda x, w, b: fk.poly_norm(x, w, b, EPS)

    providers = {
        "torch": lambda: poly_norm_reference,
        "torch.compile": lambda: torch.compile(poly_norm_reference),
        "liger": liger_poly_norm,
        "fk": fk_poly_norm,
    }
    H.run(ctx, "poly_norm", make_inputs, providers, bytes_moved, shape=f"(tokens, {n})")


if __name__ == "__main__":
    main()
