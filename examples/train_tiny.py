"""Train a tiny byte-level language model built from fk modules.

The model is Llama-shaped: token embeddings, pre-norm blocks of causal self-attention and a
gated MLP, a final norm and an output projection. Its norms are fk.nn.RMSNorm and its MLPs
fk.nn.SwiGLUMLP, so every step runs fk's kernels forward and backward: the CUDA kernels on a
GPU, the CPU reference kernels otherwise. Data: examples/data/tiny.txt, as bytes.

    python examples/train_tiny.py [--steps 60] [--device cuda|cpu]
"""
import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import fk

DATA = Path(__file__).resolve().parent / "data" / "tiny.txt"


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.heads = heads
        self.attn_norm = fk.nn.RMSNorm(dim, eps=1e-5)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = fk.nn.RMSNorm(dim, eps=1e-5)
        self.mlp = fk.nn.SwiGLUMLP(dim, hidden)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    def __init__(self, dim=128, layers=2, heads=4, hidden=344, context=64):
        super().__init__()
        self.tok = nn.Embedding(256, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = fk.nn.RMSNorm(dim, eps=1e-5)
        self.head = nn.Linear(dim, 256, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    data = torch.tensor(list(DATA.read_bytes()), dtype=torch.long)
    model = TinyLM(context=args.context).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    params = sum(p.numel() for p in model.parameters())
    print(f"fk {fk.__version__} ({fk.build_info()})")
    print(f"TinyLM: {params / 1e6:.2f} M parameters, {dtype}, on {device}; "
          f"{len(data)} bytes of text; uniform loss {math.log(256):.3f}")

    tokens_per_step = args.batch * args.context
    first_loss = last_loss = None
    times = []
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(data) - args.context - 1, (args.batch,))
        batch = torch.stack([data[s:s + args.context + 1] for s in starts]).to(device)
        t0 = time.perf_counter()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        last_loss = loss.item()
        first_loss = last_loss if first_loss is None else first_loss
        if step == 1 or step % 10 == 0 or step == args.steps:
            print(f"step {step:4d}  loss {last_loss:.4f}  step time {1e3 * times[-1]:7.1f} ms")
    steady = sorted(times[len(times) // 2:])[len(times[len(times) // 2:]) // 2]
    print(f"loss {first_loss:.3f} -> {last_loss:.3f}; median step {1e3 * steady:.1f} ms, "
          f"{tokens_per_step / steady:,.0f} tokens/s")
    if device.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    if not last_loss < first_loss:
        raise SystemExit("training did not reduce the loss")


if __name__ == "__main__":
    main()
