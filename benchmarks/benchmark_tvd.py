"""Benchmark fk.tvd against torch, torch.compile and Liger.

    python benchmarks/benchmark_tvd.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_tvd.py --dtype fp32 --tokens 4096 --modes full
    python benchmarks/benchmark_tvd.py --device cpu --tokens 64 --quick   # smoke test

p and q (tokens, vocab) of the model's vocabulary (probabilities), int64 shift_labels with
every tenth row ignored, reduction "batchmean"; p requires grad. Two tables:

- ``tvd``: the backward gets a grad_output of 1, as ``loss.backward()`` gives it (each
  provider's loss goes through an identity whose backward passes 1 on). fk and Liger then
  return the gradient they computed in the forward without touching it again.
- ``tvd_random_grad`` (full mode only): the harness's random grad_output, so fk and Liger
  scale the stored gradient in the backward: one more read and write of it.

Bytes model: forward = read p and q once (the loss alone); forward + backward = that plus
one write of the gradient. fk and Liger compute the gradient in the forward already (p
requires grad), so their forward column moves the full traffic and reads low against it.
"""
import torch

import _harness as H

IGNORE = -100


def reference(p, q, labels):
    # Liger Kernel's definition: 0.5 * |p - q| summed over the rows not ignored, divided by
    # their number ("batchmean"), in float32.
    keep = labels != IGNORE
    el = 0.5 * (p.float() - q.float()).abs() * keep.unsqueeze(1)
    return el.sum() / keep.sum()


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


def liger_tvd():
    from liger_kernel.transformers.tvd import LigerTVDLoss
    loss = LigerTVDLoss(reduction="batchmean", ignore_index=IGNORE)
    return lambda p, q, labels: loss(p, q, labels)


def fk_tvd():
    import fk
    return lambda p, q, labels: fk.tvd(p, q, labels, "batchmean", IGNORE)


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    v = ctx.model.vocab_size

    def make_inputs(tokens):
        p = torch.softmax(torch.randn(tokens, v, device=ctx.device), -1).to(ctx.dtype)
        q = torch.softmax(torch.randn(tokens, v, device=ctx.device), -1).to(ctx.dtype)
        labels = torch.randint(0, v, (tokens,), device=ctx.device)
        labels[::10] = IGNORE
        return p.requires_grad_(), q, labels

    def bytes_moved(tokens, mode):
        nv = tokens * v * ctx.elem
        fwd = 2 * nv + tokens * 8  # read p, q and the labels
        return fwd if mode == "forward" else fwd + nv  # + write the gradient

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_tvd,
        "fk": fk_tvd,
    }
    shape = f"(tokens, {v}) batchmean"

    def wrapped(factory):
        return lambda: as_training_loss(factory())

    H.run(ctx, "tvd", make_inputs, {name: wrapped(f) for name, f in providers.items()},
          bytes_moved, shape=shape + ", grad_output 1")
    if "full" in ctx.modes:
        ctx.modes = ["full"]
        H.run(ctx, "tvd_random_grad", make_inputs, providers, bytes_moved,
              shape=shape + ", random grad_output")


if __name__ == "__main__":
    main()
