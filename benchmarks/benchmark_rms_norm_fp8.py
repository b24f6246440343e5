"""Benchmark fk.rms_norm_fp8 against RMSNorm then FP8 quantization in torch and torch.compile.

    python benchmarks/benchmark_rms_norm_fp8.py --model llama_3_8b --tokens 8192     # 8192 x 4096
    python benchmarks/benchmark_rms_norm_fp8.py --model llama_3_2_1b --tokens 8192   # 8192 x 2048
    python benchmarks/benchmark_rms_norm_fp8.py --layout rowwise --return-norm
    python benchmarks/benchmark_rms_norm_fp8.py --device cpu --tokens 64 --quick     # smoke test

x is (tokens, hidden) of the benchmark dtype (hidden 2048 is linghe's shape, 4096
Llama-3-8B's). The norm (Llama casting) is followed by 1 x 128 quantization of its output,
--layout both (default) writing the row-wise and the column-wise copy. Forward only (the
backward is fk.rms_norm's). Bytes moved, the least the op must move: read x and the weight,
write each float8 copy and its float32 scales, rstd, and y with --return-norm. fk's
column-wise copy reads x a second time (a 128-row block needs whole rows normalized first):
with --layout both or columnwise it moves about 2 * hidden * dtype bytes per token more
than that count.
"""
import torch

import _harness as H
from benchmark_fp8_quantize import torch_fp8_quantize


def torch_rms_norm_fp8(x, w, eps, layout, return_norm):
    """fk.rms_norm_fp8's math in torch: Hugging Face Llama's RMSNorm, then the FP8 format."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    y = (xf * rstd[:, None]).to(x.dtype) * w
    out = (*torch_fp8_quantize(y, 1, layout), rstd)
    return (*out, y) if return_norm else out


def main():
    p = H.make_parser(__doc__.splitlines()[0])
    p.add_argument("--layout", default="both", choices=["rowwise", "columnwise", "both"])
    p.add_argument("--return-norm", action="store_true", help="also write y (x's dtype)")
    p.set_defaults(modes="forward")
    args = p.parse_args()
    ctx = H.setup(args)
    n, eps = ctx.model.hidden_size, ctx.model.rms_eps
    layout, return_norm = args.layout, args.return_norm
    copies = 2 if layout == "both" else 1

    def make_inputs(tokens):
        return (torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype),
                torch.randn(n, device=ctx.device, dtype=ctx.dtype))

    def bytes_moved(tokens, which):
        scales = tokens * (n // 128)
        out = copies * (tokens * n + 4 * scales) + 4 * tokens
        if return_norm:
            out += tokens * n * ctx.elem
        return (tokens * n + n) * ctx.elem + out

    def fk_op():
        import fk
        return lambda x, w: fk.rms_norm_fp8(x, w, eps, layout=layout, return_norm=return_norm)

    def reference(x, w):
        return torch_rms_norm_fp8(x, w, eps, layout, return_norm)

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "fk": fk_op,
    }
    H.run(ctx, "rms_norm_fp8", make_inputs, providers, bytes_moved,
          shape=f"(tokens, {n}) {layout}" + (" + y" if return_norm else ""))


if __name__ == "__main__":
    main()
