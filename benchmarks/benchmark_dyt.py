"""Benchmark fk.dyt against torch, torch.compile and Liger.

    python benchmarks/benchmark_dyt.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_dyt.py --device cpu --tokens 64 --quick   # smoke test

DyT replaces the model's norm at its hidden size: x (tokens, hidden), alpha (1,), gamma and
beta (hidden,), all of the benchmark dtype (a model cast to that dtype, as Liger's own
benchmark does).
"""
import torch

import _harness as H


def dyt_reference(x, alpha, gamma, beta):
    """The DyT module's forward ("Transformers without Normalization")."""
    return gamma * torch.tanh(alpha * x) + beta


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    n = ctx.model.hidden_size

    def make_inputs(tokens):
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        x = torch.randn(tokens, n, **kw, requires_grad=True)
        alpha = torch.full((1,), 0.5, **kw, requires_grad=True)
        gamma = (1.0 + 0.1 * torch.randn(n, **kw)).requires_grad_()
        beta = (0.1 * torch.randn(n, **kw)).requires_grad_()
        return x, alpha, gamma, beta

    def bytes_moved(tokens, which):
        mn = tokens * n * ctx.elem
        fwd = 2 * mn + 2 * n * ctx.elem  # read x, gamma, beta; write y
        # backward: read dy, x; write dx; the parameter gradients are small
        return fwd if which == "forward" else fwd + 3 * mn + 2 * n * ctx.elem

    def liger_dyt():
        from liger_kernel.ops.dyt import LigerDyTFunction
        return lambda x, a, g, b: LigerDyTFunction.apply(x, a, g, b)

    def fk_dyt():
        import fk
        return fk.dyt

    providers = {
        "torch": lambda: dyt_reference,
        "torch.compile": lambda: torch.compile(dyt_reference),
        "liger": liger_dyt,
        "fk": fk_dyt,
    }
    H.run(ctx, "dyt", make_inputs, providers, bytes_moved, shape=f"(tokens, {n}) beta")


if __name__ == "__main__":
    main()
