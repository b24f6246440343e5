"""Benchmark fk.moe_permute / fk.moe_unpermute against the same gathers in torch and
torch.compile.

    python benchmarks/benchmark_moe_permute.py --moe linghe --tokens 8192 --op permute
    python benchmarks/benchmark_moe_permute.py --moe qwen3_30b_a3b --tokens 8192 --op unpermute
    python benchmarks/benchmark_moe_permute.py --device cpu --tokens 64 --quick   # smoke test

Shapes (--moe): linghe's (hidden 2048, 256 experts, top 8) and Qwen3-30B-A3B's MoE layer
(hidden 2048, 128 experts, top 8); each token is routed to exactly top-k experts drawn at
random, segments padded to --pad-to rows (16: FP8 GEMMs). Every provider allocates the
output at the static bound of fk.moe_permute(topk=k) (no host synchronisation).

--op permute: tokens (T, H) -> permuted (N, H) (with the probs gathered alongside);
backward: the gradient of the tokens. Bytes: read T x H, write the T * k routed rows.
--op unpermute: permuted (N, H) -> the probs-weighted sum (T, H), fp32 accumulation;
backward: the gradient of permuted (and of the probs, which reads permuted again). Bytes:
read the T * k routed rows, write T x H (backward: read T x H, write and read T * k rows).
The torch reference: torch.nonzero_static over the routing map (expert-major), index_copy
into zeros / index_add in fp32; torch.compile compiles the same function.
"""
from dataclasses import replace

import torch

import _harness as H

MOE = {  # name: (hidden, experts, top-k)
    "linghe": (2048, 256, 8),
    "qwen3_30b_a3b": (2048, 128, 8),
}


def torch_rows(rmap, pad_to, routed):
    """(rows, tokens, experts) of the routed pairs in expert-major order, without a host
    synchronisation: rows are the destination rows of the padded layout."""
    et = torch.nonzero_static(rmap.t(), size=routed)
    e, t = et[:, 0], et[:, 1]
    counts = rmap.sum(0)
    padded = (counts + pad_to - 1) // pad_to * pad_to
    starts = padded.cumsum(0) - padded
    firsts = counts.cumsum(0) - counts
    rows = starts[e] + torch.arange(routed, device=rmap.device) - firsts[e]
    return rows, t, e


def torch_permute(x, rmap, probs, pad_to, n, routed):
    rows, t, e = torch_rows(rmap, pad_to, routed)
    out = x.new_zeros((n, x.shape[1])).index_copy(0, rows, x.index_select(0, t))
    pp = probs.new_zeros((n,)).index_copy(0, rows, probs[t, e])
    return out, pp


def torch_unpermute(y, probs, rows, t, e):
    contrib = y.index_select(0, rows).float() * probs[t, e].float()[:, None]
    out = torch.zeros(probs.shape[0], y.shape[1], device=y.device, dtype=torch.float32)
    return out.index_add(0, t, contrib).to(y.dtype)


def main():
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--moe", default="linghe", choices=sorted(MOE))
    p.add_argument("--op", default="permute", choices=["permute", "unpermute"])
    p.add_argument("--pad-to", type=int, default=16)
    p.set_defaults(tokens="8192")
    args = p.parse_args()
    ctx = H.setup(args)
    hidden, experts, k = MOE[args.moe]
    if args.quick:
        hidden = max(hidden // H.QUICK_DIV, 8)
    ctx.model = replace(ctx.model, name=args.moe, hidden_size=hidden)
    pad_to, dev, dt = args.pad_to, ctx.device, ctx.dtype

    import fk
    from fk.ops.moe_permute import moe_permute_bound

    def routing(tokens):
        idx = torch.randn(tokens, experts, device=dev).topk(k, dim=1).indices
        rmap = torch.zeros(tokens, experts, dtype=torch.bool, device=dev)
        rmap.scatter_(1, idx, True)
        probs = torch.softmax(torch.randn(tokens, experts, device=dev), dim=1)
        return rmap, probs

    def bound(tokens):
        return moe_permute_bound(tokens, experts, k, pad_to)

    if args.op == "permute":
        def make_inputs(tokens):
            rmap, probs = routing(tokens)
            x = torch.randn(tokens, hidden, device=dev, dtype=dt, requires_grad=True)
            return x, rmap, probs

        def reference(x, rmap, probs):
            return torch_permute(x, rmap, probs, pad_to, bound(x.shape[0]), x.shape[0] * k)[0]

        def fk_op():
            return lambda x, rmap, probs: fk.moe_permute(x, rmap, probs, pad_to=pad_to,
                                                         topk=k)[0]

        def bytes_moved(tokens, mode):
            fwd = (tokens + tokens * k) * hidden * ctx.elem
            return fwd if mode == "forward" else 2 * fwd
    else:
        def make_inputs(tokens):
            rmap, probs = routing(tokens)
            x = torch.randn(tokens, hidden, device=dev, dtype=dt)
            permuted, _, row_map, _ = fk.moe_permute(x, rmap, pad_to=pad_to, topk=k)
            rows, t, e = torch_rows(rmap, pad_to, tokens * k)
            return (permuted.requires_grad_(), probs.requires_grad_(), row_map, rows, t, e)

        def reference(y, probs, row_map, rows, t, e):
            return torch_unpermute(y, probs, rows, t, e)

        def fk_op():
            return lambda y, probs, row_map, rows, t, e: fk.moe_unpermute(y, row_map, probs)

        def bytes_moved(tokens, mode):
            fwd = (tokens * k + tokens) * hidden * ctx.elem
            return fwd if mode == "forward" else fwd + (tokens + 2 * tokens * k) * hidden * ctx.elem

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "fk": fk_op,
    }
    H.run(ctx, f"moe_{args.op}", make_inputs, providers, bytes_moved,
          shape=f"(tokens, {hidden}) {experts} experts top {k} pad_to {pad_to}")


if __name__ == "__main__":
    main()
