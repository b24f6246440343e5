"""Train a tiny randomly initialised Llama twice, with and without fk, and compare.

The model is ``transformers.LlamaForCausalLM`` built from a small ``LlamaConfig`` (byte-level:
vocab 256, a few million parameters, grouped-query attention). It trains on the text shipped
in ``examples/data/tiny.txt`` (as bytes; nothing is downloaded) for a few dozen steps: first
as Hugging Face wrote it, then, from the same initial weights on the same batches, after
``fk.transformers.apply_fk(model)``, which runs its RMSNorms, rotary embeddings and SwiGLU
MLPs on fk's kernels and takes the loss from the hidden states through fk's fused linear
cross entropy (no logits are built). On a GPU that is fk's CUDA kernels in bf16; on CPU its
reference kernels in fp32.

It prints both loss curves side by side, the speed (tokens/s at the median step after
warm-up) and the peak memory of each run, and exits non-zero if fk's loss does not fall or
leaves Hugging Face's by more than the tolerances (see ``FIRST`` and ``REL`` below).

    python examples/train_tiny.py [--steps 30] [--device cuda|cpu]
"""
import argparse
import math
import statistics
import time
from pathlib import Path

import torch

import fk
import fk.transformers

DATA = Path(__file__).resolve().parent / "data" / "tiny.txt"
WARMUP = 5  # steps left out of the speed figure
# The two runs start from the same weights and see the same batches, so they differ only by
# rounding. At step 1 that is the kernels' rounding alone: |loss fk - loss HF| <= FIRST.
# Training amplifies it a little step by step (the optimizer turns tiny gradient differences
# into different updates), so later steps get a relative tolerance: |fk - HF| <= REL * HF.
FIRST = {"cpu": 1e-4, "cuda": 2e-2}  # fp32 on CPU, bf16 on GPU
REL = {"cpu": 0.02, "cuda": 0.05}


def make_model(device, dtype, seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False,
        attn_implementation="sdpa")
    torch.manual_seed(seed)  # the same initial weights for both runs
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).train()


def train(model, batches, lr, device):
    """Train on ``batches``; return per-step losses, per-step seconds and peak memory."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for ids in batches:
        ids = ids.to(device)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss  # labels are shifted inside
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the step to finish
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    return losses, times, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=5, help="print a table row every N steps")
    ap.add_argument("--rel-tol", type=float, default=None,
                    help=f"largest |loss fk - loss HF| / loss HF allowed at any step (default "
                         f"{REL['cpu']} in fp32 on CPU, {REL['cuda']} in bf16 on GPU); the first "
                         f"step must agree within {FIRST['cpu']} (CPU) / {FIRST['cuda']} (GPU)")
    args = ap.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    rel = args.rel_tol if args.rel_tol is not None else REL[device.type]
    first = FIRST[device.type]
    if not cuda:
        # One thread: at these sizes a second one gains little on an idle machine, and on a
        # busy small one torch's thread pool can make every step ten times slower.
        torch.set_num_threads(1)
    data = torch.tensor(list(DATA.read_bytes()), dtype=torch.long)
    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(data) - args.context, (args.steps, args.batch), generator=g)
    batches = [torch.stack([data[s:s + args.context] for s in row]) for row in starts]

    import transformers
    print(f"fk {fk.__version__} ({fk.build_info()}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    runs = {}
    for name in ("HF", "fk"):
        model = make_model(device, dtype, args.seed)
        if name == "fk":
            fk.transformers.apply_fk(model)
            print(f"fk kernels in the model: {fk.transformers.patched(model)}")
        else:
            params = sum(p.numel() for p in model.parameters())
            print(f"LlamaForCausalLM: {params / 1e6:.2f} M parameters, {dtype}, on {device}; "
                  f"{len(data)} bytes of text; {args.steps} steps of {args.batch} x "
                  f"{args.context} tokens; uniform loss ln(256) = {math.log(256):.3f}")
        runs[name] = train(model, batches, args.lr, device)
        del model
        if cuda:
            torch.cuda.empty_cache()

    (hf, hf_t, hf_mem), (ours, fk_t, fk_mem) = runs["HF"], runs["fk"]
    print(f"\n{'step':>5}  {'loss HF':>8}  {'loss fk':>8}  {'diff':>9}")
    for i in range(args.steps):
        if i == 0 or (i + 1) % args.every == 0 or i + 1 == args.steps:
            print(f"{i + 1:5d}  {hf[i]:8.4f}  {ours[i]:8.4f}  {ours[i] - hf[i]:+9.2e}")

    tokens = args.batch * args.context
    print()
    for name, t, mem in (("HF", hf_t, hf_mem), ("fk", fk_t, fk_mem)):
        ms = statistics.median(t[WARMUP:] or t) * 1e3
        peak = (f"peak memory {mem:.1f} MiB (torch.cuda.max_memory_allocated)" if mem is not None
                else "peak memory not measured on CPU")
        print(f"{name:>2}: median step {ms:7.1f} ms, {tokens / ms * 1e3:10,.0f} tokens/s, {peak}")

    d0 = abs(ours[0] - hf[0])
    worst = max(abs(a - b) / b for a, b in zip(ours, hf))
    head, tail = statistics.mean(ours[:3]), statistics.mean(ours[-5:])
    print(f"\nfk loss {head:.3f} -> {tail:.3f} (mean of the first 3 / last 5 steps)")
    print(f"|fk - HF| at step 1: {d0:.2e} (tolerance {first:g}); largest |fk - HF| / HF over "
          f"all steps: {worst:.2e} (tolerance {rel:g})")
    failures = []
    if not tail < head - 0.5:
        failures.append("fk's loss did not fall (by 0.5 or more)")
    if not d0 <= first:  # "not <=" also catches NaN
        failures.append(f"fk's first loss differs from Hugging Face's by {d0:.2e} > {first:g}")
    if not worst <= rel:
        failures.append(f"fk's loss departs from Hugging Face's by {worst:.2e} (relative) > "
                        f"{rel:g}")
    if failures:
        raise SystemExit("FAIL: " + "; ".join(failures))
    print("OK: fk's loss falls and follows Hugging Face's")


if __name__ == "__main__":
    main()
