"""Benchmark fk.fused_linear_cross_entropy against torch, torch.compile and Liger.

    python benchmarks/benchmark_fused_linear_cross_entropy.py --model llama_3_8b
    python benchmarks/benchmark_fused_linear_cross_entropy.py --device cpu --tokens 64 --quick

x (tokens, hidden) and the head weight (vocab, hidden) of the model, both requiring grad,
int64 targets, mean reduction; torch and torch.compile form the logits and upcast them to
float32 as Hugging Face's causal-LM loss does. The op is bound by its three matmuls
(2 * tokens * hidden * vocab flops each: the logits, grad_x, grad_weight), so the
``%ceil`` column is the fraction of the bf16 GEMM rate (700 TFLOP/s on an H200,
benchmarks/NOTES.md), not of the copy bandwidth: ``bytes_moved`` is the flop count
scaled by copy bandwidth / GEMM rate. Forward-only counts one matmul (a loss alone needs
no more), fwd + bwd three.

Tables as in benchmark_cross_entropy.py: ``fused_linear_cross_entropy`` with a grad_output
of 1 (``loss.backward()``), ``fused_linear_cross_entropy_random_grad`` with the harness's
random one (fk and Liger then scale the stored gradients once more). ``fk (chunk = x)``
takes chunks whose logits are the size of x, Liger's rule: its memory, more time.
"""
import torch
import torch.nn.functional as F

import _harness as H
from benchmark_cross_entropy import as_training_loss

H200_GEMM_FLOPS = 700e12  # bf16 dense GEMM rate measured on the H200 (8192^3)


def reference(x, weight, target):
    return F.cross_entropy((x @ weight.t()).float(), target, ignore_index=-100)


def liger_flce():
    # Positional (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
    # label_smoothing, reduction, softcap, return_z_loss, accum_dtype); returns (loss, ...).
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    return lambda x, w, t: LigerFusedLinearCrossEntropyFunction.apply(
        x, w, t, None, None, -100, 0.0, 0.0, "mean", None, False, None)[0]


def fk_flce():
    import fk
    return fk.fused_linear_cross_entropy


def fk_flce_x_sized_chunks():
    import fk
    return lambda x, w, t: fk.fused_linear_cross_entropy(
        x, w, t, chunk_size=max(1, x.shape[0] * x.shape[1] // w.shape[0]))


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    h, v = ctx.model.hidden_size, ctx.model.vocab_size

    def make_inputs(tokens):
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        x = torch.randn(tokens, h, **kw).requires_grad_()
        w = (torch.randn(v, h, **kw) * h ** -0.5).requires_grad_()
        return x, w, torch.randint(0, v, (tokens,), device=ctx.device)

    def bytes_moved(tokens, mode):
        flops = 2 * tokens * h * v * (1 if mode == "forward" else 3)
        return flops * ctx.copy_bw / H200_GEMM_FLOPS

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_flce,
        "fk": fk_flce,
        "fk (chunk = x)": fk_flce_x_sized_chunks,
    }
    shape = f"x (tokens, {h}), weight ({v}, {h}) mean; %ceil of {H200_GEMM_FLOPS / 1e12:.0f} TFLOP/s"

    def wrapped(factory):
        return lambda: as_training_loss(factory())

    H.run(ctx, "fused_linear_cross_entropy", make_inputs,
          {name: wrapped(f) for name, f in providers.items()}, bytes_moved,
          shape=shape + ", grad_output 1")
    if "full" in ctx.modes:
        ctx.modes = ["full"]
        H.run(ctx, "fused_linear_cross_entropy_random_grad", make_inputs, providers,
              bytes_moved, shape=shape + ", random grad_output")


if __name__ == "__main__":
    main()
