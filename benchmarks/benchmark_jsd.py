"""Benchmark fk.jsd against torch, torch.compile and Liger.

    python benchmarks/benchmark_jsd.py --model llama_3_8b --sweep-mode token_length --dtype fp32
    python benchmarks/benchmark_jsd.py --model llama_3_8b --sweep-mode token_length --dtype bf16
    python benchmarks/benchmark_jsd.py --device cpu --tokens 64 --quick   # smoke test

Student and teacher log-probabilities (tokens, vocab) of the model's vocabulary, beta 0.5,
int64 shift labels with every 16th row ignored. Two tables, as benchmark_cross_entropy.py:

- ``jsd``: the backward gets a grad_output of 1 (``loss.backward()`` of a scalar loss), so fk
  and Liger return the gradient they computed in the forward without touching it again.
- ``jsd_random_grad`` (full mode only): the harness's random grad_output, so fk and Liger
  scale the stored gradient in the backward: one more read and write of it.

The floor: read both inputs once and write the gradient once (2 reads + 1 write of
tokens x vocab elements; the forward alone, 2 reads).
"""
import torch

import _harness as H
from benchmark_cross_entropy import as_training_loss

BETA = 0.5


def reference(log_q, log_p, labels):
    # The generalized JSD as one writes it in torch: float32 math, the mean over counted rows,
    # the loss in the input's dtype (as Liger returns it).
    x, y = log_q.float(), log_p.float()
    q, p = x.exp(), y.exp()
    log_m = (BETA * p + (1 - BETA) * q).log()
    per = BETA * p * (y - log_m) + (1 - BETA) * q * (x - log_m)
    keep = labels != -100
    loss = (per.sum(-1) * keep).sum() / keep.sum().clamp(min=1)
    return loss.to(log_q.dtype)


def liger_jsd():
    # Counts the non-ignored rows with a host synchronisation (.item()); allocates a float32
    # (tokens, vocab) loss buffer besides the gradient.
    from liger_kernel.transformers.jsd import LigerJSD
    m = LigerJSD(beta=BETA, ignore_index=-100)
    return lambda x, y, lab: m(x, y, lab)


def fk_jsd():
    import fk
    return lambda x, y, lab: fk.jsd(x, y, lab, BETA)


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    v = ctx.model.vocab_size

    def make_inputs(tokens):
        def log_probs():
            return torch.log_softmax(torch.randn(tokens, v, device=ctx.device), -1).to(ctx.dtype)

        log_q = log_probs().requires_grad_()
        log_p = log_probs()
        labels = torch.randint(0, v, (tokens,), device=ctx.device)
        labels[::16] = -100
        return log_q, log_p, labels

    def bytes_moved(tokens, mode):
        nv = tokens * v * ctx.elem
        fwd = 2 * nv + tokens * 8  # read both inputs and the labels
        return fwd if mode == "forward" else fwd + nv  # + write the gradient

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_jsd,
        "fk": fk_jsd,
    }
    shape = f"(tokens, {v}) beta {BETA}"

    def wrapped(factory):
        return lambda: as_training_loss(factory())

    H.run(ctx, "jsd", make_inputs, {name: wrapped(f) for name, f in providers.items()},
          bytes_moved, shape=shape + ", grad_output 1")
    if "full" in ctx.modes:
        ctx.modes = ["full"]
        H.run(ctx, "jsd_random_grad", make_inputs, providers, bytes_moved,
              shape=shape + ", random grad_output")


if __name__ == "__main__":
    main()
