"""Benchmark fk.group_norm against torch, torch.compile and Liger.

    python benchmarks/benchmark_group_norm.py                       # x (B, 512, 4096), B 8..64
    python benchmarks/benchmark_group_norm.py --tokens 32 --channels 512 --hw 4096 --groups 32
    python benchmarks/benchmark_group_norm.py --device cpu --tokens 2 --quick   # smoke test

GroupNorm of x (B, C, HW) with weight and bias (C,) in the benchmark dtype, eps 1e-6. The
sweep runs over the batch B (the "tokens" column of the tables); --channels, --hw and
--groups set the rest of the shape (default: the target shape (32, 512, 4096), 32 groups).
--model / --sweep-mode are accepted for the common command line and unused.
"""
import torch

import _harness as H

EPS = 1e-6


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=512)
    parser.add_argument("--hw", type=int, default=4096, help="trailing positions per channel")
    parser.add_argument("--groups", type=int, default=32)
    parser.set_defaults(tokens="8,16,32,64")
    args = parser.parse_args()
    ctx = H.setup(args)
    c, hw, groups = args.channels, args.hw, args.groups
    if args.quick:
        c, hw, groups = max(groups, c // H.QUICK_DIV), max(1, hw // H.QUICK_DIV), groups

    def make_inputs(batch):
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        x = torch.randn(batch, c, hw, **kw, requires_grad=True)
        weight = (1.0 + 0.1 * torch.randn(c, **kw)).requires_grad_()
        bias = (0.1 * torch.randn(c, **kw)).requires_grad_()
        return x, weight, bias

    def bytes_moved(batch, which):
        n = batch * c * hw * ctx.elem
        stats = batch * groups * 8  # float32 mean and rstd per (sample, group)
        params = 2 * c * ctx.elem
        fwd = 2 * n + stats + params  # read x; write y
        # backward: read dy and x (once each from DRAM), write dx; read the statistics;
        # write dweight and dbias (and their (B, C) float32 partial sums, twice)
        return fwd if which == "forward" else fwd + 3 * n + stats + params + 2 * batch * c * 8

    def torch_group_norm(x, w, b):
        return torch.nn.functional.group_norm(x, groups, w, b, EPS)

    def liger_group_norm():
        from liger_kernel.ops.group_norm import LigerGroupNormFunction
        return lambda x, w, b: LigerGroupNormFunction.apply(x, w, b, c, groups, EPS)

    def fk_group_norm():
        import fk
        return lambda x, w, b: fk.group_norm(x, w, b, groups, EPS)

    providers = {
        "torch": lambda: torch_group_norm,
        "torch.compile": lambda: torch.compile(torch_group_norm),
        "liger": liger_group_norm,
        "fk": fk_group_norm,
    }
    H.run(ctx, "group_norm", make_inputs, providers, bytes_moved,
          shape=f"(B, {c}, {hw}), {groups} groups")


if __name__ == "__main__":
    main()
