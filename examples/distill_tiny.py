"""Distil a tiny frozen teacher into a smaller student with fk.fused_linear_jsd.

Both models are byte-level (vocab 256) stacks of an embedding, a few residual MLP blocks and
an lm head; the teacher is wider, initialised differently, first trained a little on the
text shipped in ``examples/data/tiny.txt`` (plain next-byte cross entropy through
fk.fused_linear_cross_entropy), then frozen. The student then learns from the teacher's
distributions only: its loss is the generalized Jensen-Shannon divergence between the two
heads' softmaxes at a temperature, taken straight from the hidden states by
fk.fused_linear_jsd (no logits are built). Padding positions (label -100) do not count.

On a GPU the models run in bf16 on fk's CUDA kernels; on CPU in fp32 on its reference
kernels. It prints the distillation loss per step and exits non-zero if the loss does not
fall to below 70 % of its first value.

    python examples/distill_tiny.py [--steps 60] [--device cuda|cpu] [--tiny]
"""
import argparse
from pathlib import Path

import torch
from torch import nn

import fk

DATA = Path(__file__).resolve().parent / "data" / "tiny.txt"
VOCAB = 256


class TinyLM(nn.Module):
    """Embedding, residual MLP blocks, a final norm; the head's weight is ``lm_head.weight``
    (the loss takes the hidden states and the weight, never the logits)."""

    def __init__(self, hidden, layers):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 4 * hidden), nn.GELU(),
                          nn.Linear(4 * hidden, hidden)) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)

    def hidden(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.norm(h)


def batches(data, steps, batch, seq, seed):
    """(ids, labels) pairs of random windows of the text; the last few labels of each
    window are padding (-100)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        ids = torch.stack([data[s:s + seq] for s in starts.tolist()])
        labels = torch.stack([data[s + 1:s + seq + 1] for s in starts.tolist()]).clone()
        labels[:, -2:] = -100
        yield ids, labels


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="smaller models and batches")
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--temperature", type=float, default=2.0)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    s_hidden, t_hidden, layers, batch, seq = ((32, 48, 1, 4, 32) if args.tiny
                                              else (128, 256, 2, 16, 128))
    data = torch.tensor(list(DATA.read_bytes()), dtype=torch.long)

    # The teacher: a little next-byte training, then frozen.
    torch.manual_seed(1)
    teacher = TinyLM(t_hidden, layers + 1).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(teacher.parameters(), lr=3e-3)
    for ids, labels in batches(data, max(args.steps // 2, 10), batch, seq, seed=1):
        ids, labels = ids.to(device), labels.to(device)
        h = teacher.hidden(ids)
        loss = fk.fused_linear_cross_entropy(h.reshape(-1, t_hidden), teacher.lm_head.weight,
                                             labels.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    teacher.requires_grad_(False).eval()

    # The student learns the teacher's distributions.
    torch.manual_seed(2)
    student = TinyLM(s_hidden, layers).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    distill = fk.nn.FusedLinearJSD(jsd_beta=args.beta, temperature=args.temperature)
    losses = []
    for step, (ids, labels) in enumerate(batches(data, args.steps, batch, seq, seed=2), 1):
        ids, labels = ids.to(device), labels.to(device)
        with torch.no_grad():
            ht = teacher.hidden(ids)
        hs = student.hidden(ids)
        loss = distill(hs, student.lm_head.weight, ht, teacher.lm_head.weight, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:3d} loss {losses[-1]:.6f}", flush=True)
    first = sum(losses[:3]) / 3
    last = sum(losses[-3:]) / 3
    ok = last < 0.7 * first
    print(f"distillation loss {first:.5f} -> {last:.5f} on {device.type} "
          f"({'fell' if ok else 'did NOT fall enough'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
