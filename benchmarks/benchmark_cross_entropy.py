"""Benchmark fk.cross_entropy against torch, torch.compile and Liger.

    python benchmarks/benchmark_cross_entropy.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_cross_entropy.py --device cpu --tokens 64 --quick   # smoke test
    python benchmarks/benchmark_cross_entropy.py --grad-output scaled   # (loss / 7).backward()

Logits (tokens, vocab) of the model's vocabulary, int64 targets, mean reduction. The
gradient the loss gets (--grad-output):

- ``one`` (default), table ``cross_entropy``: the backward gets a grad_output of 1, as
  ``loss.backward()`` gives a scalar loss in training (every provider's loss goes through
  an identity whose backward passes 1 on, whatever grad_output the harness feeds). fk and
  Liger then return the gradient they computed in the forward without touching it again.
  In full mode also the table of ``random``.
- ``scaled``, table ``cross_entropy_scaled_grad``: ``(loss / 7).backward()``, a loss divided
  for gradient accumulation (or weighted, or scaled by a GradScaler): fk (by default) and
  Liger scale the stored gradient in the backward, one more read and write of it; fk with
  ``defer_grad`` computes the gradient in the backward instead (three passes over the
  logits in all, not four).
- ``random``, table ``cross_entropy_random_grad`` (full mode only): the harness's random
  grad_output, scaling as for ``scaled``.

The floor is the same for all: read the logits once and write their gradient once.
"""
import torch
import torch.nn.functional as F

import _harness as H


def reference(logits, target):
    # Hugging Face's causal-LM loss: logits upcast to float32, then torch's cross entropy.
    return F.cross_entropy(logits.float(), target, ignore_index=-100)


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


def liger_cross_entropy():
    # Positional (input, target, weight, ignore_index, lse_square_scale, label_smoothing,
    # reduction, softcap, return_z_loss, ...); returns (loss, z_loss, ...). Its forward
    # writes the gradient into the logits, and its backward skips the scaling when
    # grad_output equals 1 (a host-side comparison).
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    return lambda x, t: LigerCrossEntropyFunction.apply(x, t, None, -100, 0.0, 0.0, "mean",
                                                        None, False)[0]


def liger_cross_entropy_accuracy():
    # The same with return_token_accuracy (its kernel then tracks each row's argmax).
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    return lambda x, t: LigerCrossEntropyFunction.apply(x, t, None, -100, 0.0, 0.0, "mean",
                                                        None, False, True)[0]


def fk_cross_entropy():
    import fk
    return fk.cross_entropy


def fk_cross_entropy_accuracy():
    # The kernel variant that tracks each row's argmax (token accuracy from it).
    import fk
    return lambda x, t: fk.cross_entropy(x, t, return_token_accuracy=True).loss


def fk_cross_entropy_separate_grad():
    import fk
    return lambda x, t: fk.cross_entropy(x, t, grad_in_logits=False)


def fk_cross_entropy_defer_grad():
    # The gradient computed in the backward, times grad_output, in one pass.
    import fk
    return lambda x, t: fk.cross_entropy(x, t, defer_grad=True)


class _Scaled(torch.autograd.Function):
    """Identity on a scalar loss whose backward passes on a gradient of 1 / 7, as
    ``(loss / 7).backward()`` gives the loss."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, 1 / 7)


def as_scaled_loss(fn):
    return lambda *args: _Scaled.apply(fn(*args))


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--grad-output", default="one", choices=["one", "scaled", "random"],
                        help="the loss's grad_output: 1 (loss.backward()), 1 / 7 "
                             "((loss / 7).backward()) or the harness's random values")
    args = parser.parse_args()
    ctx = H.setup(args)
    v = ctx.model.vocab_size

    def make_inputs(tokens):
        logits = torch.randn(tokens, v, device=ctx.device, dtype=ctx.dtype, requires_grad=True)
        target = torch.randint(0, v, (tokens,), device=ctx.device)
        return logits, target

    def bytes_moved(tokens, mode):
        nv = tokens * v * ctx.elem
        fwd = nv + tokens * 8  # read the logits and the targets
        return fwd if mode == "forward" else fwd + nv  # + write the gradient

    providers = {
        "torch": lambda: reference,
        "torch.compile": lambda: torch.compile(reference),
        "liger": liger_cross_entropy,
        "fk": fk_cross_entropy,
        "fk (separate grad)": fk_cross_entropy_separate_grad,
        "fk (defer_grad)": fk_cross_entropy_defer_grad,
        "liger (+ token accuracy)": liger_cross_entropy_accuracy,
        "fk (+ token accuracy)": fk_cross_entropy_accuracy,
    }
    shape = f"(tokens, {v}) mean"

    if args.grad_output == "scaled":
        H.run(ctx, "cross_entropy_scaled_grad", make_inputs,
              {name: (lambda f=f: as_scaled_loss(f())) for name, f in providers.items()},
              bytes_moved, shape=shape + ", grad_output 1 / 7")
        return
    if args.grad_output == "one":
        H.run(ctx, "cross_entropy", make_inputs,
              {name: (lambda f=f: as_training_loss(f())) for name, f in providers.items()},
              bytes_moved, shape=shape + ", grad_output 1")
    if "full" in ctx.modes:
        ctx.modes = ["full"]
        H.run(ctx, "cross_entropy_random_grad", make_inputs, providers, bytes_moved,
              shape=shape + ", random grad_output")


if __name__ == "__main__":
    main()
