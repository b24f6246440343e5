"""Benchmark fk.moe_permute_fp8 (MoE permute + FP8 quantization) against the unfused pair
fk.moe_permute -> fk.fp8_quantize and the same math in torch and torch.compile.

    python benchmarks/benchmark_moe_permute_fp8.py --moe linghe --tokens 8192 --layout both
    python benchmarks/benchmark_moe_permute_fp8.py --moe linghe --tokens 8192 --layout rowwise
    python benchmarks/benchmark_moe_permute_fp8.py --device cpu --tokens 64 --quick  # smoke test

Shapes (--moe): benchmark_moe_permute.py's (linghe's: hidden 2048, 256 experts, top 8;
Qwen3-30B-A3B's: 128 experts), each token routed to exactly top-k experts drawn at random,
segments padded to --pad-to rows, the output at moe_permute's static bound (topk=k; no host
synchronisation). --layout rowwise: the quantized permuted rows (the experts' first grouped
GEMM); columnwise / both: also the copy of P.T quantized per expert segment (their
weight-gradient GEMMs).

Providers: fk (the fused op: the permuted rows are never written in the tokens' dtype);
fk.unfused (fk.moe_permute, then fk.fp8_quantize of its output); torch (the gather of
benchmark_moe_permute.py, then benchmark_fp8_quantize.py's quantization) and torch.compile of
it. The unfused providers' column-wise copy is quantized in 128-row blocks of P rather than
per segment (the same bytes; the same blocks when --pad-to is a multiple of 128). Forward
only (the op is not differentiable). Bytes moved: read the T x H tokens, write each float8
copy of the T * k routed rows (1 byte an element) with its float32 scales (4 bytes per 128
elements).
"""
from dataclasses import replace

import torch

import _harness as H
from benchmark_fp8_quantize import torch_fp8_quantize
from benchmark_moe_permute import MOE, torch_permute


def main():
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--moe", default="linghe", choices=sorted(MOE))
    p.add_argument("--layout", default="both", choices=["rowwise", "columnwise", "both"])
    p.add_argument("--pad-to", type=int, default=16)
    p.set_defaults(modes="forward", tokens="8192")
    args = p.parse_args()
    ctx = H.setup(args)
    hidden, experts, k = MOE[args.moe]
    if args.quick:
        hidden = max(hidden // H.QUICK_DIV, 128)
    ctx.model = replace(ctx.model, name=args.moe, hidden_size=hidden)
    pad_to, dev, dt, layout = args.pad_to, ctx.device, ctx.dtype, args.layout

    import fk
    from fk.ops.moe_permute import moe_permute_bound

    def bound(tokens):
        return moe_permute_bound(tokens, experts, k, pad_to)

    def make_inputs(tokens):
        idx = torch.randn(tokens, experts, device=dev).topk(k, dim=1).indices
        rmap = torch.zeros(tokens, experts, dtype=torch.bool, device=dev)
        rmap.scatter_(1, idx, True)
        probs = torch.softmax(torch.randn(tokens, experts, device=dev), dim=1)
        return torch.randn(tokens, hidden, device=dev, dtype=dt), rmap, probs

    def reference(x, rmap, probs):
        n = bound(x.shape[0])
        permuted, pp = torch_permute(x, rmap, probs, pad_to, n, x.shape[0] * k)
        return torch_fp8_quantize(permuted, 1, layout), pp

    def unfused(x, rmap, probs):
        permuted, pp, row_map, tpe = fk.moe_permute(x, rmap, probs, pad_to=pad_to, topk=k)
        return fk.fp8_quantize(permuted, layout=layout), pp, row_map, tpe

    def fused(x, rmap, probs):
        return fk.moe_permute_fp8(x, rmap, probs, pad_to=pad_to, topk=k, layout=layout)

    def bytes_moved(tokens, _mode):
        rows = tokens * k
        one = rows * hidden + 4 * rows * (-(-hidden // 128))
        return tokens * hidden * ctx.elem + one * (2 if layout == "both" else 1)

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "fk.unfused": lambda: unfused,
        "fk": lambda: fused,
    }
    H.run(ctx, f"moe_permute_fp8_{layout}", make_inputs, providers, bytes_moved,
          shape=f"(tokens, {hidden}) {experts} experts top {k} pad_to {pad_to}")


if __name__ == "__main__":
    main()
