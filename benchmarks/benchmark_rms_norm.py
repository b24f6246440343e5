"""Benchmark fk.rms_norm against torch, torch.compile and Liger.

    python benchmarks/benchmark_rms_norm.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_rms_norm.py --device cpu --tokens 64 --quick   # smoke test

The model config picks eps, offset and casting mode (Llama style for all but Gemma).
"""
import torch

import _harness as H


def make_reference(eps, offset, casting_mode):
    """Hugging Face RMSNorm: Llama rounds the normalized x before the weight; Gemma does not."""
    def rms_norm_reference(x, weight):
        dtype = x.dtype
        h = x.float()
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + eps)
        if casting_mode == "gemma":
            return (h * (offset + weight.float())).to(dtype)
        return (offset + weight) * h.to(dtype)
    return rms_norm_reference


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    m = ctx.model
    n, eps, offset, mode = m.hidden_size, m.rms_eps, m.rms_offset, m.rms_casting_mode
    reference = make_reference(eps, offset, mode)

    def make_inputs(tokens):
        x = torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype, requires_grad=True)
        # Weights near 1 (near 0 with Gemma's offset): Liger writes dx over dy in its
        # backward, and this keeps the values in range over many repetitions.
        w = (1.0 - offset) + 0.1 * torch.randn(n, device=ctx.device, dtype=ctx.dtype)
        return x, w.requires_grad_()

    def bytes_moved(tokens, which):
        mn = tokens * n * ctx.elem
        fwd = 2 * mn + n * ctx.elem + tokens * 4  # read x, w; write y, rstd (float32)
        # backward: read dy, x (w, rstd are small); write dx; dw is small
        return fwd if which == "forward" else fwd + 3 * mn

    def liger_rms_norm():
        # Positional (X, W, eps, offset, casting_mode); newer Liger adds in_place=True (dx is
        # written into dy) and row_mode after these.
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        return lambda x, w: LigerRMSNormFunction.apply(x, w, eps, offset, mode)

    def fk_rms_norm():
        import fk
        return lambda x, w: fk.rms_norm(x, w, eps, offset, mode)

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_rms_norm,
        "fk": fk_rms_norm,
    }
    H.run(ctx, "rms_norm", make_inputs, providers, bytes_moved,
          shape=f"(tokens, {n}) eps={eps} offset={offset} {mode}")


if __name__ == "__main__":
    main()
