"""Benchmark fk.llama4_rope (Llama 4's complex rotary embedding) against torch, torch.compile
and Liger.

    python benchmarks/benchmark_llama4_rope.py --sweep-mode token_length
    python benchmarks/benchmark_llama4_rope.py --device cpu --tokens 64 --seq 32 --quick

tokens = batch * seq, seq = min(tokens, --seq): at 8192 tokens and Llama 4 Scout (the
default model), q is (4, 2048, 40, 128) and k (4, 2048, 8, 128), contiguous (B, S, H, D) as
Llama 4's attention has them before the transpose. freqs_cis is complex64 (batch, seq,
head_dim / 2), as Llama 4's rotary embedding returns it.
"""
import torch

import _harness as H
from benchmark_rope import Pair


def hf_apply_rotary_emb(xq, xk, freqs_cis):
    """Hugging Face Llama 4's apply_rotary_emb."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis[:, :, None, :]).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis[:, :, None, :]).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def as_pair(fn):
    return lambda q, k, freqs: Pair(*fn(q, k, freqs))


def freqs_cis(batch, seq, dim, device, base=500000.0):
    """complex64 (batch, seq, dim / 2) as Llama 4's rotary embedding builds it."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    freqs = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv_freq
    freqs = freqs[None].expand(batch, seq, dim // 2)
    return torch.polar(torch.ones_like(freqs), freqs)


def liger_llama4_rope():
    # In place: Liger writes the rotated q / k into the inputs' memory.
    from liger_kernel.ops.llama4_rope import LigerLlama4RopeFunction
    return as_pair(LigerLlama4RopeFunction.apply)


def fk_llama4_rope():
    import fk
    return as_pair(fk.llama4_rope)


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.set_defaults(model="llama_4_scout")
    parser.add_argument("--seq", type=int, default=2048,
                        help="sequence length (batch = tokens / seq)")
    args = parser.parse_args()
    ctx = H.setup(args)
    m = ctx.model
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim

    def dims(tokens):
        seq = min(tokens, args.seq)
        if tokens % seq:
            raise SystemExit(f"--tokens {tokens} is not a multiple of the sequence length {seq}")
        return tokens // seq, seq

    def bytes_moved(tokens, mode):
        b, s = dims(tokens)
        qk = b * s * (hq + hkv) * d * ctx.elem
        once = 2 * qk + b * s * d * 4  # read q, k; write q_out, k_out; read freqs (fp32 pairs)
        return once if mode == "forward" else 2 * once  # backward: the same on the gradients

    providers = {
        "torch": lambda: as_pair(hf_apply_rotary_emb),
        "torch.compile": lambda: as_pair(torch.compile(hf_apply_rotary_emb)),
        "liger": liger_llama4_rope,
        "fk": fk_llama4_rope,
    }

    def make_inputs(tokens):
        b, s = dims(tokens)
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        q, k = torch.randn(b, s, hq, d, **kw), torch.randn(b, s, hkv, d, **kw)
        return q.requires_grad_(), k.requires_grad_(), freqs_cis(b, s, d, ctx.device)

    H.run(ctx, "llama4_rope", make_inputs, providers, bytes_moved,
          shape=f"q (tokens / seq, seq <= {args.seq}, {hq}, {d}), k {hkv} heads, freqs complex64")


if __name__ == "__main__":
    main()
