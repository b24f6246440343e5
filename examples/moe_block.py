"""A mixture-of-experts block trained with fk's MoE kernels against a plain PyTorch
reference of the same block.

The block is Qwen3-30B-A3B's (hidden 2048, 128 experts, top 8, expert intermediate 768) over
8192 tokens by default: router logits in float32 (``fk.router_logits``), top-8 routing with
the softmax over the chosen logits (``fk.router_topk``), tokens gathered into expert-major
segments padded to 16 rows (``fk.moe_permute``), each expert's gate / up projection as one
grouped GEMM (``torch._grouped_mm`` over the segments), SwiGLU (``fk.swiglu``), the down
projection as another grouped GEMM, and the weighted sum back per token
(``fk.moe_unpermute``). The reference computes the same block with torch operations only:
float32 router logits from float32 copies, ``torch.topk`` + softmax, and a loop over the
experts with ``index_select`` / ``index_add_``.

Both start from the same weights and train on the same batches (AdamW, a mean-squared loss
to a fixed random target); the script prints both losses per step and the median step time
of each, and fails unless the losses agree (relative gap below ``--tol``) and fk's falls.

    python examples/moe_block.py                          # GPU, Qwen3-30B-A3B's block
    python examples/moe_block.py --device cpu --tiny      # CPU, a few seconds
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fk


def init_weights(hidden, experts, inter, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype).requires_grad_()

    return {"router": w(experts, hidden, scale=hidden ** -0.5),
            "gate_up": w(experts, hidden, 2 * inter, scale=hidden ** -0.5),
            "down": w(experts, inter, hidden, scale=inter ** -0.5)}


def fk_block(x, p, topk):
    logits = fk.router_logits(x, p["router"])                      # (T, E) float32
    probs, routing_map = fk.router_topk(logits, topk)              # softmax over the top k
    permuted, _, row_map, per_expert = fk.moe_permute(x, routing_map, pad_to=16, topk=topk)
    offs = torch.cumsum(per_expert, 0, dtype=torch.int32)          # segment ends, on device
    h = torch._grouped_mm(permuted, p["gate_up"], offs=offs)       # (N, 2 * inter)
    inter = h.shape[1] // 2
    a = fk.swiglu(h[:, :inter], h[:, inter:])
    y = torch._grouped_mm(a, p["down"], offs=offs)                 # (N, hidden)
    return fk.moe_unpermute(y, row_map, probs)                     # weighted, fp32 sums


def reference_block(x, p, topk):
    logits = x.float() @ p["router"].float().t()
    top, idx = logits.topk(topk, dim=-1)
    weights = torch.softmax(top, dim=-1)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    inter = p["down"].shape[1]
    for e in range(p["router"].shape[0]):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        h = x.index_select(0, tok) @ p["gate_up"][e]
        a = F.silu(h[:, :inter]) * h[:, inter:]
        y = (a @ p["down"][e]).float() * weights[tok, slot, None]
        out.index_add_(0, tok, y)
    return out.to(x.dtype)


def train(block, params, batches, target, topk, steps, lr, device):
    opt = torch.optim.AdamW(params.values(), lr=lr)
    losses, times = [], []
    for i in range(steps):
        x = batches[i % len(batches)]
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = F.mse_loss(block(x, params, topk).float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="hidden 64, 8 experts, top 2, 96 tokens")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tol", type=float, default=None,
                    help="largest relative loss gap (default 1e-4 on CPU in float32, 2e-2 in "
                         "bf16 on the GPU)")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    hidden, experts, topk, inter = (64, 8, 2, 32) if args.tiny else (2048, 128, 8, 768)
    tokens = 96 if args.tiny else args.tokens
    tol = args.tol if args.tol is not None else (2e-2 if cuda else 1e-4)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(tokens, hidden, generator=g).to(device, dtype) for _ in range(2)]
    target = torch.randn(tokens, hidden, generator=g).to(device) * 0.1
    results = {}
    for name, block in (("reference", reference_block), ("fk", fk_block)):
        params = init_weights(hidden, experts, inter, device, dtype)
        results[name] = train(block, params, batches, target, topk, args.steps, args.lr, device)
    print(f"MoE block: {tokens} tokens, hidden {hidden}, {experts} experts, top {topk}, "
          f"expert intermediate {inter}, {dtype}, {device}")
    print("step  reference        fk")
    worst = 0.0
    for i, (a, b) in enumerate(zip(results["reference"][0], results["fk"][0])):
        worst = max(worst, abs(a - b) / abs(a))
        print(f"{i + 1:4d}  {a:9.6f}  {b:9.6f}")
    warm = max(1, args.steps // 3)
    ms = {k: statistics.median(v[1][warm:]) * 1e3 for k, v in results.items()}
    print(f"median step: reference {ms['reference']:.2f} ms, fk {ms['fk']:.2f} ms "
          f"({ms['reference'] / ms['fk']:.2f}x)")
    fk_losses = results["fk"][0]
    ok = worst <= tol and fk_losses[-1] < fk_losses[0]
    print(f"{'PASS' if ok else 'FAIL'}: largest relative loss gap {worst:.2e} (tolerance "
          f"{tol:g}); fk's loss {fk_losses[0]:.6f} -> {fk_losses[-1]:.6f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
