"""Benchmark fk.sparsemax (last dim) against torch, torch.compile and Liger.

    python benchmarks/benchmark_sparsemax.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_sparsemax.py --width 32768                # one width
    python benchmarks/benchmark_sparsemax.py --device cpu --tokens 64 --quick   # smoke test

Inputs are (tokens, width), one table per width: 4096 (the Llama-3-8B hidden size) and
32768 (an attention-score row of a 32K context) by default; --quick divides them by 16 like
the model widths. The torch provider is the sort-based definition in float32 (autograd
through the sort), torch.compile compiles it; Liger is LigerSparsemaxFunction, which sorts
each row with torch.sort before its kernel.
"""
import torch

import _harness as H


def sparsemax_reference(x):
    """Sort-based sparsemax over the last dim, in float32, rounded to x's dtype."""
    z = x.float()
    z = z - z.amax(-1, keepdim=True)
    zs = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    support = 1 + k * zs > torch.cumsum(zs, -1)
    count = support.sum(-1, keepdim=True)
    tau = (torch.where(support, zs, 0.0).sum(-1, keepdim=True) - 1) / count
    return torch.clamp(z - tau, min=0.0).to(x.dtype)


def liger_sparsemax():
    from liger_kernel.ops.sparsemax import LigerSparsemaxFunction
    return lambda x: LigerSparsemaxFunction.apply(x, -1)


def fk_sparsemax():
    import fk
    return fk.sparsemax


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--width", default="4096,32768",
                        help="comma-separated row lengths, one table each")
    args = parser.parse_args()
    ctx = H.setup(args)
    for width in (int(w) for w in args.width.split(",")):
        n = max(width // H.QUICK_DIV, 8) if args.quick else width

        def make_inputs(tokens, n=n):
            return (torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype,
                                requires_grad=True),)

        def bytes_moved(tokens, mode, n=n):
            t = tokens * n * ctx.elem
            fwd = 2 * t  # read x; write y
            return fwd if mode == "forward" else fwd + 3 * t  # + read dy, y; write dx

        providers = {
            "torch": lambda: sparsemax_reference,
            "torch.compile": lambda: torch.compile(sparsemax_reference),
            "liger": liger_sparsemax,
            "fk": fk_sparsemax,
        }
        H.run(ctx, f"sparsemax_{n}", make_inputs, providers, bytes_moved,
              shape=f"(tokens, {n}), dim -1")


if __name__ == "__main__":
    main()
