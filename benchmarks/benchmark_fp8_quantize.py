"""Benchmark fk.fp8_quantize against the same math in torch and torch.compile.

    python benchmarks/benchmark_fp8_quantize.py --model llama_3_8b --tokens 8192
    python benchmarks/benchmark_fp8_quantize.py --block 128 --layout rowwise   # weights
    python benchmarks/benchmark_fp8_quantize.py --device cpu --tokens 64 --quick   # smoke test

x is (tokens, hidden) of the benchmark dtype (Llama-3-8B: 8192 x 4096 at 8192 tokens). With
--block 1 (default) it is quantized in 1 x 128 blocks, --layout both (default) writing the
row-wise and the column-wise copy (what an FP8 linear layer's forward and weight-gradient
GEMMs read); --block 128 quantizes it as a weight in 128 x 128 blocks. Forward only (the op
is not differentiable). Bytes moved: read x, write each float8 copy and its float32 scales.
"""
import torch

import _harness as H


def torch_fp8_quantize(x, block_rows, layout, pow2=False):
    """The format of fk.fp8_quantize in plain torch, for dims that are multiples of 128."""
    m, k = x.shape

    def scale(amax):
        amax = torch.where(torch.isnan(amax), torch.inf, amax)
        s = torch.where(amax == 0, 1.0, (amax / 448.0).clamp(min=2.0 ** -126))
        if pow2:
            s = torch.exp2(torch.ceil(torch.log2(s)))
        return torch.where(amax == torch.inf, torch.nan, s)

    def cast(q):
        return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

    xf = x.float()
    out = []
    if block_rows == 1:
        if layout != "columnwise":
            b = xf.view(m, k // 128, 128)
            s = scale(b.abs().amax(dim=2))
            out += [cast(b * s.reciprocal()[:, :, None]).view(m, k), s.t().contiguous()]
        if layout != "rowwise":
            b = xf.view(m // 128, 128, k)
            s = scale(b.abs().amax(dim=1))
            out += [cast(b * s.reciprocal()[:, None, :]).view(m, k).t().contiguous(), s]
        return tuple(out)
    b = xf.view(m // 128, 128, k // 128, 128)
    s = scale(b.abs().amax(dim=(1, 3)))
    q = cast(b * s.reciprocal()[:, None, :, None]).view(m, k)
    if layout != "columnwise":
        out += [q, s]
    if layout != "rowwise":
        out += [q.t().contiguous(), s.t().contiguous()]
    return tuple(out)


def main():
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--block", type=int, default=1, choices=[1, 128],
                   help="block rows: 1 (1 x 128, activations) or 128 (128 x 128, weights)")
    p.add_argument("--layout", default="both", choices=["rowwise", "columnwise", "both"])
    p.set_defaults(modes="forward")
    args = p.parse_args()
    ctx = H.setup(args)
    n = ctx.model.hidden_size
    block, layout = args.block, args.layout
    copies = 2 if layout == "both" else 1

    def make_inputs(tokens):
        return (torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype),)

    def bytes_moved(tokens, which):
        scales = tokens * n // (128 if block == 1 else 128 * 128)
        return tokens * n * ctx.elem + copies * (tokens * n + 4 * scales)

    def fk_quantize():
        import fk
        return lambda x: fk.fp8_quantize(x, block=(block, 128), layout=layout)

    def reference(x):
        return torch_fp8_quantize(x, block, layout)

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "fk": fk_quantize,
    }
    H.run(ctx, "fp8_quantize", make_inputs, providers, bytes_moved,
          shape=f"(tokens, {n}) block ({block}, 128) {layout}")


if __name__ == "__main__":
    main()
