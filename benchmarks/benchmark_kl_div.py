"""Benchmark fk.kl_div against torch, torch.compile and Liger.

    python benchmarks/benchmark_kl_div.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_kl_div.py --model llama_3_8b --dtype fp32 --tokens 4096
    python benchmarks/benchmark_kl_div.py --device cpu --tokens 64 --quick   # smoke test

Distillation's KL divergence over the model's vocabulary: student log-probabilities (tokens,
vocab) that require grad, teacher probabilities of the same shape and dtype (no grad),
reduction "batchmean". Two tables:

- ``kl_div``: the backward gets a grad_output of 1, as ``loss.backward()`` gives a scalar
  loss in training (every provider's loss goes through an identity whose backward passes 1
  on). fk's forward writes the gradient (-target / tokens) and its backward has nothing left
  to do (one launch that returns at once).
- ``kl_div_random_grad`` (full mode only): the harness's random grad_output, so fk scales
  the stored gradient in the backward: one more read and write of it.

Bytes model (the floor): forward reads the input and the target (2 x tokens x vocab
elements); forward + backward also writes the input's gradient once (3 x).
"""
import torch
import torch.nn.functional as F

import _harness as H

REDUCTION = "batchmean"


def reference(x, t):
    return F.kl_div(x, t, reduction=REDUCTION)


class _UnitGrad(torch.autograd.Function):
    """Identity on a scalar loss whose backward passes on a gradient of 1."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.ones_like(grad)


def as_training_loss(fn):
    return lambda *args: _UnitGrad.apply(fn(*args))


def liger_kl_div():
    # (y_pred, y_true, reduction, log_target, eps): the forward sums per row, the backward
    # writes -target and divides it by the rows (a host-side grad_output == 1 test first).
    from liger_kernel.ops.kl_div import LigerKLDivLossFunction
    return lambda x, t: LigerKLDivLossFunction.apply(x, t, REDUCTION, False, 1e-10)


def fk_kl_div():
    import fk
    return lambda x, t: fk.kl_div(x, t, REDUCTION)


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    v = ctx.model.vocab_size

    def make_inputs(tokens):
        with torch.no_grad():
            x = torch.randn(tokens, v, device=ctx.device, dtype=ctx.dtype)
            x = torch.log_softmax(x, -1)
            t = torch.softmax(torch.randn(tokens, v, device=ctx.device, dtype=ctx.dtype), -1)
        return x.requires_grad_(), t

    def bytes_moved(tokens, mode):
        nv = tokens * v * ctx.elem
        return 2 * nv if mode == "forward" else 3 * nv

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_kl_div,
        "fk": fk_kl_div,
    }
    shape = f"(tokens, {v}) {REDUCTION}"

    def wrapped(factory):
        return lambda: as_training_loss(factory())

    H.run(ctx, "kl_div", make_inputs, {name: wrapped(f) for name, f in providers.items()},
          bytes_moved, shape=shape + ", grad_output 1")
    if "full" in ctx.modes:
        ctx.modes = ["full"]
        H.run(ctx, "kl_div_random_grad", make_inputs, providers, bytes_moved,
              shape=shape + ", random grad_output")


if __name__ == "__main__":
    main()
