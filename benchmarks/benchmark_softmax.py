"""Benchmark fk.softmax (last dim) against torch, torch.compile and Liger.

    python benchmarks/benchmark_softmax.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_softmax.py --width 128256          # a vocabulary-wide softmax
    python benchmarks/benchmark_softmax.py --device cpu --tokens 64 --quick   # smoke test

Inputs are (tokens, width) with width 32768 by default (an attention-score row of a 32K
context); --quick divides it by 16 like the model widths.
"""
import torch

import _harness as H


def softmax_reference(x):
    return torch.softmax(x, dim=-1)


def liger_softmax():
    from liger_kernel.ops.softmax import LigerSoftmaxFunction
    return LigerSoftmaxFunction.apply


def fk_softmax():
    import fk
    return fk.softmax


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=32768, help="softmax row length")
    args = parser.parse_args()
    ctx = H.setup(args)
    n = max(args.width // H.QUICK_DIV, 8) if args.quick else args.width

    def make_inputs(tokens):
        return (torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype, requires_grad=True),)

    def bytes_moved(tokens, mode):
        t = tokens * n * ctx.elem
        fwd = 2 * t  # read x; write y
        return fwd if mode == "forward" else fwd + 3 * t  # + read dy, y; write dx

    providers = {
        "torch": lambda: softmax_reference,
        "torch.compile": lambda: torch.compile(softmax_reference),
        "liger": liger_softmax,
        "fk": fk_softmax,
    }
    H.run(ctx, "softmax", make_inputs, providers, bytes_moved, shape=f"(tokens, {n}), dim -1")


if __name__ == "__main__":
    main()
