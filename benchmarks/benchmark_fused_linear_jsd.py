"""Benchmark fk.fused_linear_jsd against torch, torch.compile and Liger.

    python benchmarks/benchmark_fused_linear_jsd.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_fused_linear_jsd.py --device cpu --tokens 64 --quick

A student head (tokens, hidden) x (vocab, hidden), both requiring grad, and a frozen teacher
of the same width, int64 labels with every 7th ignored, beta 0.5, temperature 1. torch and
torch.compile form both logits, upcast them to float32 and take the generalized JSD of
their log-softmaxes (the (tokens, vocab) tensors held whole); Liger's LigerFusedLinearJSD
and fk chunk the rows. The op is bound by its matmuls (2 * tokens * hidden * vocab flops
each: the student's and the teacher's logits, grad_input, grad_weight), so the ``%ceil``
column is the fraction of the bf16 GEMM rate (700 TFLOP/s on an H200, benchmarks/NOTES.md),
not of the copy bandwidth: ``bytes_moved`` is the flop count scaled by copy bandwidth / GEMM
rate. Forward-only counts two matmuls (a loss alone needs no more; fk and Liger compute the
gradients in their forward whenever the student requires grad), fwd + bwd four.

``fused_linear_jsd`` runs with a grad_output of 1 (``loss.backward()``),
``fused_linear_jsd_random_grad`` with the harness's random one (fk and Liger then scale the
stored gradients once more).
"""
import math

import torch

import _harness as H
from benchmark_cross_entropy import as_training_loss

H200_GEMM_FLOPS = 700e12  # bf16 dense GEMM rate measured on the H200 (8192^3)
BETA, TEMPERATURE, IGNORE = 0.5, 1.0, -100


def reference(xs, ws, xt, wt, labels):
    lq = torch.log_softmax((xs @ ws.t()).float() / TEMPERATURE, dim=-1)
    lp = torch.log_softmax((xt @ wt.t()).float() / TEMPERATURE, dim=-1)
    lm = torch.logaddexp(lp + math.log(BETA), lq + math.log(1 - BETA))
    rows = (BETA * (lp.exp() * (lp - lm)).sum(-1)
            + (1 - BETA) * (lq.exp() * (lq - lm)).sum(-1))
    keep = labels != IGNORE
    return (rows * keep).sum() / keep.sum()


def liger_fljsd():
    from liger_kernel.transformers.fused_linear_jsd import LigerFusedLinearJSD
    return LigerFusedLinearJSD(jsd_beta=BETA, ignore_index=IGNORE, temperature=TEMPERATURE)


def fk_fljsd():
    import fk
    return lambda xs, ws, xt, wt, labels: fk.fused_linear_jsd(
        xs, ws, xt, wt, labels, beta=BETA, ignore_index=IGNORE, temperature=TEMPERATURE)


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    h, v = ctx.model.hidden_size, ctx.model.vocab_size

    def make_inputs(tokens):
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        xs = torch.randn(tokens, h, **kw).requires_grad_()
        ws = (torch.randn(v, h, **kw) * h ** -0.5).requires_grad_()
        xt = torch.randn(tokens, h, **kw)
        wt = torch.randn(v, h, **kw) * h ** -0.5
        labels = torch.randint(0, v, (tokens,), device=ctx.device)
        labels[::7] = IGNORE
        return xs, ws, xt, wt, labels

    def bytes_moved(tokens, mode):
        flops = 2 * tokens * h * v * (2 if mode == "forward" else 4)
        return flops * ctx.copy_bw / H200_GEMM_FLOPS

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_fljsd,
        "fk": fk_fljsd,
    }
    shape = (f"student/teacher x (tokens, {h}), weight ({v}, {h}), beta {BETA}; %ceil of "
             f"{H200_GEMM_FLOPS / 1e12:.0f} TFLOP/s")

    def wrapped(factory):
        return lambda: as_training_loss(factory())

    H.run(ctx, "fused_linear_jsd", make_inputs,
          {name: wrapped(f) for name, f in providers.items()}, bytes_moved,
          shape=shape + ", grad_output 1")
    if "full" in ctx.modes:
        ctx.modes = ["full"]
        H.run(ctx, "fused_linear_jsd_random_grad", make_inputs, providers, bytes_moved,
              shape=shape + ", random grad_output")


if __name__ == "__main__":
    main()
