"""Benchmark fk.qkv_split_norm_rope (split of a fused QKV projection, qk-norm, RoPE and the
transpose to the attention layout) against the same math in torch and torch.compile.

    python benchmarks/benchmark_qkv_split_norm_rope.py --model qwen3_30b_a3b --tokens 8192
    python benchmarks/benchmark_qkv_split_norm_rope.py --model qwen3_8b --tokens 8192
    python benchmarks/benchmark_qkv_split_norm_rope.py --device cpu --tokens 64 --quick

The input is Megatron's: qkv (seq, batch, (Hq + 2 Hkv) * D) with heads grouped per kv group
([q heads of the group..., k, v]); q and k get Qwen3's per-head RMSNorm and the rotate-half
RoPE with cos / sin (seq, D) in the input dtype; outputs are (batch, seq, heads, D), what
flash-attention reads (--layout bhsd: (batch, heads, seq, D), for SDPA). tokens = batch * seq,
seq = min(tokens, --seq). The ceiling column counts the bytes that must move: the forward
reads qkv and writes q, k, v; the backward reads the saved qkv and the three output
gradients and writes the qkv gradient (plus cos / sin, and the weights, each pass).
"""
import torch

import _harness as H


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qwen3_rms_norm(x, weight, eps):
    """Hugging Face Qwen3RMSNorm."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def make_torch_fn(hq, hkv, eps, layout):
    def fn(qkv, qw, kw, cos, sin):
        s, b, n = qkv.shape
        d = n // (hq + 2 * hkv)
        r = hq // hkv
        g = qkv.view(s, b, hkv, r + 2, d)
        q = g[:, :, :, :r].reshape(s, b, hq, d)
        k, v = g[:, :, :, r], g[:, :, :, r + 1]
        c, sn = cos[:, None, None, :], sin[:, None, None, :]
        q = qwen3_rms_norm(q, qw, eps)
        k = qwen3_rms_norm(k, kw, eps)
        q, k = q * c + rotate_half(q) * sn, k * c + rotate_half(k) * sn
        dims = (1, 2, 0, 3) if layout == "bhsd" else (1, 0, 2, 3)
        return tuple(t.permute(*dims).contiguous() for t in (q, k, v))
    return fn


def rotary_cos_sin(seq, dim, device, dtype, base=1000000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    freqs = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.set_defaults(model="qwen3_30b_a3b", tokens="8192")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length (batch = tokens / seq)")
    parser.add_argument("--layout", default="bshd", choices=["bshd", "bhsd"])
    args = parser.parse_args()
    ctx = H.setup(args)
    m = ctx.model
    hq, hkv, d, eps = m.num_heads, m.num_kv_heads, m.head_dim, m.rms_eps
    n = (hq + 2 * hkv) * d

    def dims(tokens):
        return H.batch_and_seq(tokens, args.seq)

    def bytes_moved(tokens, mode):
        b, s = dims(tokens)
        tables = 2 * s * d * ctx.elem + 2 * d * ctx.elem  # cos, sin, weights
        fwd = 2 * tokens * n * ctx.elem + tables
        bwd = 3 * tokens * n * ctx.elem + tables
        return fwd if mode == "forward" else fwd + bwd

    def make_inputs(tokens):
        b, s = dims(tokens)
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        qkv = torch.randn(s, b, n, **kw)
        qw = 1 + 0.1 * torch.randn(d, **kw)
        kw_ = 1 + 0.1 * torch.randn(d, **kw)
        cos, sin = rotary_cos_sin(s, d, ctx.device, ctx.dtype)
        return (qkv.requires_grad_(), qw.requires_grad_(), kw_.requires_grad_(), cos, sin)

    def fk_fn():
        import fk

        return H.outputs_of(lambda qkv, qw, kw, cos, sin: fk.qkv_split_norm_rope(
            qkv, qw, kw, cos, sin, hq, hkv, eps, layout=args.layout))

    torch_fn = make_torch_fn(hq, hkv, eps, args.layout)
    providers = {
        "torch": lambda: H.outputs_of(torch_fn),
        "torch.compile": lambda: H.outputs_of(torch.compile(torch_fn)),
        "fk": fk_fn,
    }
    H.run(ctx, "qkv_split_norm_rope", make_inputs, providers, bytes_moved,
          shape=f"qkv (seq <= {args.seq}, tokens / seq, ({hq} + 2 x {hkv}) x {d}) grouped, "
                f"out {args.layout}")


if __name__ == "__main__":
    main()
