"""Benchmark fk.rope (rotary embedding of q and k) against torch, torch.compile and Liger.

    python benchmarks/benchmark_rope.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_rope.py --device cpu --tokens 64 --quick   # smoke test

tokens = batch * seq, seq = min(tokens, --seq): at 8192 tokens and Llama-3-8B, q is
4 x 32 x 2048 x 128 and k 4 x 8 x 2048 x 128. Two input layouts (--layouts): "bshd", q and
k are transposed views of (batch, seq, heads, head_dim) projections, as models produce them
(op "rope"), and "bhsd", contiguous (batch, heads, seq, head_dim) (op "rope_contiguous").
cos / sin are (1, seq, head_dim) in the input dtype, as Hugging Face rotary embeddings
return them.
"""
import torch

import _harness as H

LAYOUT_OPS = {"bshd": "rope", "bhsd": "rope_contiguous"}


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rope(q, k, cos, sin):
    """Hugging Face apply_rotary_pos_emb (unsqueeze_dim=1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Pair:
    """(q_out, k_out) as the harness's single output: ``torch.randn_like(pair)`` gives a
    pair of output gradients (each like its output) and ``pair.backward(grads)`` runs one
    backward through both outputs."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        pair, rest = args[0], args[1:]
        return Pair(func(pair.a, *rest, **(kwargs or {})), func(pair.b, *rest, **(kwargs or {})))

    def backward(self, grads):
        torch.autograd.backward((self.a, self.b), (grads.a, grads.b))


def as_pair(fn):
    return lambda q, k, cos, sin: Pair(*fn(q, k, cos, sin))


def rotary_cos_sin(seq, dim, device, dtype, base=500000.0):
    """(1, seq, dim) cos / sin as Hugging Face's Llama rotary embedding builds them: fp32
    frequencies, both halves duplicated, cast to the activations' dtype."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    freqs = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def liger_rope():
    # In place: Liger writes the rotated q / k into the inputs' memory (and the gradients
    # into the output gradients'); for contiguous (B, H, S, D) inputs it first copies them
    # to (B, S, H, D).
    from liger_kernel.ops.rope import LigerRopeFunction
    return as_pair(LigerRopeFunction.apply)


def fk_rope():
    import fk
    return as_pair(fk.rope)


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048, help="sequence length (batch = tokens / seq)")
    parser.add_argument("--layouts", default="bshd,bhsd", help="bshd (models' views), bhsd or both")
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
        once = 2 * qk + 2 * s * d * ctx.elem  # read q, k; write q_out, k_out; read cos, sin
        return once if mode == "forward" else 2 * once  # backward: the same on the gradients

    providers = {
        "torch": lambda: as_pair(hf_rope),
        "torch.compile": lambda: as_pair(torch.compile(hf_rope)),
        "liger": liger_rope,
        "fk": fk_rope,
    }
    for layout in [x for x in args.layouts.split(",") if x]:
        def make_inputs(tokens, layout=layout):
            b, s = dims(tokens)
            kw = dict(device=ctx.device, dtype=ctx.dtype)
            if layout == "bshd":
                q = torch.randn(b, s, hq, d, **kw).transpose(1, 2)
                k = torch.randn(b, s, hkv, d, **kw).transpose(1, 2)
            else:
                q, k = torch.randn(b, hq, s, d, **kw), torch.randn(b, hkv, s, d, **kw)
            cos, sin = rotary_cos_sin(s, d, ctx.device, ctx.dtype)
            return q.requires_grad_(), k.requires_grad_(), cos, sin

        H.run(ctx, LAYOUT_OPS[layout], make_inputs, providers, bytes_moved,
              shape=f"q (tokens / seq, {hq}, seq <= {args.seq}, {d}), k {hkv} heads, {layout}")


if __name__ == "__main__":
    main()
