"""Benchmark fk.neighborhood_attention against dense torch, torch.compile and Liger.

    python benchmarks/benchmark_neighborhood_attention.py                  # the default sweep
    python benchmarks/benchmark_neighborhood_attention.py --seq-lens 8192 --kernel-sizes 49
    python benchmarks/benchmark_neighborhood_attention.py --device cpu --quick   # smoke test

q, k, v are (batch, heads, seq_len, head_dim) = (2, 16, L, 64) by default, one table per
(kernel_size, L) pair (--model only names the table; --tokens is unused: the sequence
lengths are --seq-lens). Providers: "torch" is the dense definition (the (L, L) scores
masked to the window, softmax in float32, times v), "torch.compile" compiles it; "liger" is
LigerFusedNeighborhoodAttentionFunction (which also forms (L, L) scores, mask and
probabilities); fk is fk.neighborhood_attention. The dense providers and Liger are left out
of a table where their (L, L) tensors would not fit in free GPU memory (a note says so).

The ceiling column is the copy-bandwidth fraction of the minimum traffic: forward reads q,
k, v once and writes out (+ the fp32 logsumexp); forward + backward also reads q, k, v, out,
dO and writes dq, dk, dv (+ fp32 logsumexp and delta). A second line per row gives the
useful flops rate from the model 4 * B * H * L * kernel_size * D for the forward (3.5x that
for forward + backward).
"""
import math

import torch

import _harness as H


def dense_reference(kernel_size, dilation):
    """softmax(q k^T / sqrt(D) masked to the window, in float32) v: builds (L, L)."""
    def f(q, k, v):
        n, d = q.shape[-2], q.shape[-1]
        i = torch.arange(n, device=q.device)
        rel = i[None, :] - i[:, None]
        mask = (rel.abs() <= (kernel_size // 2) * dilation) & (rel % dilation == 0)
        s = (q @ k.transpose(-1, -2)).float() / math.sqrt(d)
        s = s.masked_fill(~mask, float("-inf"))
        return (torch.softmax(s, -1).to(q.dtype) @ v)
    return f


def liger_provider(kernel_size, dilation):
    def factory():
        from liger_kernel.ops.fused_neighborhood_attention import (
            LigerFusedNeighborhoodAttentionFunction)
        return lambda q, k, v: LigerFusedNeighborhoodAttentionFunction.apply(
            q, k, v, kernel_size, dilation, None)
    return factory


def fk_provider(kernel_size, dilation):
    def factory():
        import fk
        return lambda q, k, v: fk.neighborhood_attention(q, k, v, kernel_size, dilation)
    return factory


def dense_fits(ctx, b, h, n, factor):
    """Whether `factor` (L, L) fp32 tensors per (batch, head) fit in 80 % of free memory."""
    need = factor * b * h * n * n * 4
    if ctx.device.type != "cuda":
        return need < 8e9
    free, _ = torch.cuda.mem_get_info(ctx.device)
    return need < 0.8 * free


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="1024,8192,32768", help="comma-separated L")
    parser.add_argument("--kernel-sizes", default="7,49", help="comma-separated kernel sizes")
    parser.add_argument("--dilation", type=int, default=1)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    ctx = H.setup(args)
    b, h, d, dil = args.batch, args.heads, args.head_dim, args.dilation
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    if args.quick:
        b, h, d = 1, 2, 16
        seq_lens = [max(n // H.QUICK_DIV, 16) for n in seq_lens]
    for ks in (int(s) for s in args.kernel_sizes.split(",")):
        for n in seq_lens:
            ctx.tokens = [n]

            def make_inputs(_tokens, n=n):
                return tuple(torch.randn(b, h, n, d, device=ctx.device, dtype=ctx.dtype,
                                         requires_grad=True) for _ in range(3))

            def bytes_moved(_tokens, mode, n=n):
                t = b * h * n * d * ctx.elem
                rows = b * h * n * 4
                fwd = 4 * t + rows
                return fwd if mode == "forward" else fwd + 8 * t + 3 * rows

            providers = {}
            # Dense: scores, masked scores, probabilities and their gradients (fp32).
            if dense_fits(ctx, b, h, n, 6):
                providers["torch"] = lambda ks=ks: dense_reference(ks, dil)
                providers["torch.compile"] = lambda ks=ks: torch.compile(dense_reference(ks, dil))
            else:
                print(f"note: L {n}: the dense torch providers would need (L, L) tensors that "
                      "do not fit in free memory; left out")
            if ctx.device.type == "cuda" and dense_fits(ctx, b, h, n, 4):
                providers["liger"] = liger_provider(ks, dil)
            elif ctx.device.type == "cuda":
                print(f"note: L {n}: Liger's (L, L) scores / probabilities would not fit in "
                      "free memory; left out")
            providers["fk"] = fk_provider(ks, dil)
            rows = H.run(ctx, f"neighborhood_attention_k{ks}_d{dil}_L{n}", make_inputs,
                         providers, bytes_moved,
                         shape=f"(B {b}, H {h}, L {n}, D {d}), kernel {ks}, dilation {dil}")
            flops = 4 * b * h * n * ks * d
            for r in rows:
                f = flops * (1.0 if r["mode"] == "forward" else 3.5)
                print(f"  {r['mode']:8s} {r['provider']:14s} {r['ms']:9.3f} ms  "
                      f"{f / (r['ms'] * 1e-3) / 1e12:7.2f} useful TFLOP/s  "
                      f"peak {r['peak_mb']:10.1f} MB")


if __name__ == "__main__":
    main()
