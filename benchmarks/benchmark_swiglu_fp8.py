"""Benchmark fk.swiglu_fp8 / fk.moe_swiglu_fp8 (SwiGLU + FP8 quantization) and their
backwards against the same math in torch and torch.compile.

    python benchmarks/benchmark_swiglu_fp8.py --model llama_3_8b --tokens 8192  # 8192 x 2 x 14336
    python benchmarks/benchmark_swiglu_fp8.py --pass bwd --grad-layout both --tokens 8192
    python benchmarks/benchmark_swiglu_fp8.py --form moe --tokens 8192  # linghe's MoE shape
    python benchmarks/benchmark_swiglu_fp8.py --form moe --pass bwd --tokens 8192
    python benchmarks/benchmark_swiglu_fp8.py --device cpu --tokens 256 --quick  # smoke test

Plain form: x (tokens, 2 n) with n the model's intermediate size (Llama-3-8B: 14336). MoE form
(--form moe): x (tokens * top-k, 2 n), n = --moe-n (1408, linghe's table: 8192 tokens, 256
experts, top 8, so 65536 rows), the rows split evenly over the experts (256 rows each at 8192
tokens, so that the per-segment column-wise blocks of the MoE layout are the plain layout's,
which the torch reference computes without a host loop over experts), probs float32 per row.
--counts routed: the rows a top-k routing of random logits gives each expert instead
(seeded), each segment padded to a multiple of 16 rows as moe_permute's pad_to=16 does, so
that segments end anywhere in their last 128-row block; fk only (the torch reference needs
the even split).

--pass fwd: h = silu(gate) * up (* p) quantized, --layout both by default (the row-wise copy
for the down projection's forward GEMM, the column-wise one for its weight-gradient GEMM).
--pass bwd: dx of h given dh (bf16), quantized with --grad-layout (plain form: default both;
MoE form: default none, or rowwise; 'none' writes dx in x's dtype), and dprobs in the MoE
form. The ops are timed as functions
(forward mode of the harness). Bytes moved: every input read once, every output written once
(float8 data 1 byte, float32 scales per 128 elements).
"""
import functools

import torch
import torch.nn.functional as F

import _harness as H
from benchmark_fp8_quantize import torch_fp8_quantize


def torch_h(x, probs=None):
    n = x.shape[1] // 2
    h = F.silu(x[:, :n].float()) * x[:, n:].float()
    if probs is not None:
        h = h * probs[:, None]
    return h.to(x.dtype)


def torch_dx(dh, x, probs=None):
    n = x.shape[1] // 2
    g, u, d = x[:, :n].float(), x[:, n:].float(), dh.float()
    sg = torch.sigmoid(g)
    silu = g * sg
    dp = (d * silu * u).sum(1) if probs is not None else None
    if probs is not None:
        d = d * probs[:, None]
    dx = torch.cat([d * u * (sg + silu * (1 - sg)), d * silu], 1).to(x.dtype)
    return dx if dp is None else (dx, dp)


def main():
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--form", default="plain", choices=["plain", "moe"])
    p.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"])
    p.add_argument("--layout", default="both", choices=["rowwise", "columnwise", "both"])
    p.add_argument("--grad-layout", default=None,
                   choices=["none", "rowwise", "columnwise", "both"],
                   help="backward: quantize dx (default: both for the plain form, none for "
                        "the MoE form, which has none and rowwise)")
    p.add_argument("--moe-n", type=int, default=1408, help="MoE form: intermediate per expert")
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--counts", default="even", choices=["even", "routed"],
                   help="MoE form: rows per expert split evenly, or as a random routing gives")
    p.set_defaults(modes="forward", tokens="8192")
    args = p.parse_args()
    ctx = H.setup(args)
    moe = args.form == "moe"
    n = (max(args.moe_n // (H.QUICK_DIV if args.quick else 1), 128) if moe
         else ctx.model.intermediate_size)
    grad_layout = args.grad_layout or ("none" if moe else "both")
    if moe and grad_layout not in ("none", "rowwise"):
        raise SystemExit("the MoE form's backward quantizes dx row-wise only")
    if args.which == "bwd" and grad_layout != "none" and n % 128:
        raise SystemExit(f"a quantized gradient needs n % 128 == 0, got n = {n}")
    layout = args.layout
    e = ctx.elem

    @functools.lru_cache
    def expert_counts(tokens):  # a list of each expert's rows (the routed draw made once)
        if args.counts == "even":
            per, rest = divmod(tokens * args.topk, args.experts)
            return [per + (i < rest) for i in range(args.experts)]
        g = torch.Generator().manual_seed(0)
        top = torch.randn(tokens, args.experts, generator=g).topk(args.topk, dim=1).indices
        counts = torch.bincount(top.flatten(), minlength=args.experts)
        return ((counts + 15) // 16 * 16).tolist()

    def rows_of(tokens):
        return sum(expert_counts(tokens)) if moe else tokens

    def make_inputs(tokens):
        m = rows_of(tokens)
        x = torch.randn(m, 2 * n, device=ctx.device, dtype=ctx.dtype)
        extra = ()
        if moe:
            extra = (torch.rand(m, device=ctx.device),
                     torch.tensor(expert_counts(tokens), device=ctx.device, dtype=torch.int64))
        if args.which == "bwd":
            return (torch.randn(m, n, device=ctx.device, dtype=ctx.dtype), x, *extra[:1])
        return (x, *extra)

    def copies_bytes(m, k, which_layout):
        one = m * k + 4 * m * (-(-k // 128))
        return {"none": 0, "rowwise": one, "columnwise": one, "both": 2 * one}[which_layout]

    def bytes_moved(tokens, _mode):
        m = rows_of(tokens)
        probs = 4 * m if moe else 0
        if args.which == "fwd":
            return m * 2 * n * e + probs + copies_bytes(m, n, layout)
        read = m * n * e + m * 2 * n * e + probs
        out = m * 2 * n * e if grad_layout == "none" else copies_bytes(m, 2 * n, grad_layout)
        return read + out + (4 * m if moe else 0)

    def reference(*inputs):
        if args.which == "fwd":
            x = inputs[0]
            return torch_fp8_quantize(torch_h(x, inputs[1] if moe else None), 1, layout)
        dh, x = inputs[:2]
        dx, dp = torch_dx(dh, x, inputs[2]) if moe else (torch_dx(dh, x), None)
        if grad_layout != "none":
            dx = torch_fp8_quantize(dx, 1, grad_layout)
        return dx if dp is None else (dx, dp)

    def fk_op():
        import fk
        if args.which == "fwd":
            if moe:
                return lambda x, pr, tpe: fk.moe_swiglu_fp8(x, pr, tpe, layout=layout)
            return lambda x: fk.swiglu_fp8(x, layout=layout)
        gl = None if grad_layout == "none" else grad_layout
        if moe:
            return lambda dh, x, pr: fk.moe_swiglu_fp8_backward(dh, x, pr, grad_layout=gl)
        return lambda dh, x: fk.swiglu_fp8_backward(dh, x, grad_layout=gl)

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "fk": fk_op,
    }
    if moe and args.counts == "routed" and args.which == "fwd" and layout != "rowwise":
        providers = {"fk": fk_op}  # per-segment column-wise blocks: no torch reference
    what = (f"{args.which} layout {layout}" if args.which == "fwd" else
            f"{args.which} grad_layout {grad_layout}")
    shape = (f"(tokens x {args.topk}, 2 x {n}), {args.experts} experts" if moe
             else f"(tokens, 2 x {n})")
    H.run(ctx, f"{'moe_' if moe else ''}swiglu_fp8_{args.which}", make_inputs, providers,
          bytes_moved, shape=f"{shape} {what}")


if __name__ == "__main__":
    main()
