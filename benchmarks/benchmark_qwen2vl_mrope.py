"""Benchmark fk.qwen2vl_mrope (Qwen2-VL's multimodal rotary embedding) against torch,
torch.compile and Liger.

    python benchmarks/benchmark_qwen2vl_mrope.py --sweep-mode token_length
    python benchmarks/benchmark_qwen2vl_mrope.py --device cpu --tokens 64 --seq 32 --quick

tokens = batch * seq, seq = min(tokens, --seq): at 8192 tokens and Qwen2-VL-7B (the default
model), q is (4, 28, 2048, 128) and k (4, 4, 2048, 128), mrope_section [16, 24, 24]
(scaled to the head dim). Two input layouts (--layouts): "bshd", transposed views of
(batch, seq, heads, head_dim) projections, as the model produces them (op "qwen2vl_mrope"),
and "bhsd", contiguous (batch, heads, seq, head_dim) (op "qwen2vl_mrope_contiguous").
cos / sin are (3, batch, seq, head_dim) in the input dtype, as Qwen2-VL's rotary embedding
(transformers 4.x) returns them.
"""
import torch

import _harness as H
from benchmark_rope import Pair, rotate_half

LAYOUT_OPS = {"bshd": "qwen2vl_mrope", "bhsd": "qwen2vl_mrope_contiguous"}


def make_hf_mrope(mrope_section):
    def hf_apply_multimodal_rotary_pos_emb(q, k, cos, sin):
        """Hugging Face's apply_multimodal_rotary_pos_emb (transformers 4.x, unsqueeze_dim=1)."""
        sec = mrope_section * 2
        cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sec, dim=-1))], dim=-1)
        sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sec, dim=-1))], dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    return hf_apply_multimodal_rotary_pos_emb


def as_pair(fn):
    return lambda q, k, cos, sin: Pair(*fn(q, k, cos, sin))


def mrope_cos_sin(batch, seq, dim, device, dtype, base=1000000.0):
    """(3, batch, seq, dim) cos / sin from distinct temporal / height / width positions."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    pos = torch.stack([torch.arange(seq, device=device, dtype=torch.float32) // (j + 1)
                       for j in range(3)])[:, None, :].expand(3, batch, seq)
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.set_defaults(model="qwen2_vl_7b")
    parser.add_argument("--seq", type=int, default=2048,
                        help="sequence length (batch = tokens / seq)")
    parser.add_argument("--layouts", default="bshd,bhsd", help="bshd (models' views), bhsd or both")
    parser.add_argument("--mrope-section", default="16,24,24",
                        help="t,h,w for head_dim 128 (scaled to the model's head dim)")
    args = parser.parse_args()
    ctx = H.setup(args)
    m = ctx.model
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    section = [int(v) for v in args.mrope_section.split(",")]
    section = [v * d // 128 for v in section]
    section[0] += d // 2 - sum(section)

    def dims(tokens):
        seq = min(tokens, args.seq)
        if tokens % seq:
            raise SystemExit(f"--tokens {tokens} is not a multiple of the sequence length {seq}")
        return tokens // seq, seq

    def bytes_moved(tokens, mode):
        b, s = dims(tokens)
        qk = b * s * (hq + hkv) * d * ctx.elem
        # read q, k; write q_out, k_out; read one stream's cos and sin per pair
        once = 2 * qk + 2 * b * s * d * ctx.elem
        return once if mode == "forward" else 2 * once  # backward: the same on the gradients

    def liger_mrope():
        # In place: Liger writes the rotated q / k into the inputs' memory (it copies
        # non-contiguous inputs first).
        from liger_kernel.ops.qwen2vl_mrope import LigerQwen2VLMRopeFunction
        return as_pair(lambda q, k, c, s: LigerQwen2VLMRopeFunction.apply(q, k, c, s, section))

    def fk_mrope():
        import fk
        return as_pair(lambda q, k, c, s: fk.qwen2vl_mrope(q, k, c, s, section))

    hf = make_hf_mrope(section)
    providers = {
        "torch": lambda: as_pair(hf),
        "torch.compile": lambda: as_pair(torch.compile(hf)),
        "liger": liger_mrope,
        "fk": fk_mrope,
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
            cos, sin = mrope_cos_sin(b, s, d, ctx.device, ctx.dtype)
            return q.requires_grad_(), k.requires_grad_(), cos, sin

        H.run(ctx, LAYOUT_OPS[layout], make_inputs, providers, bytes_moved,
              shape=f"q (tokens / seq, {hq}, seq <= {args.seq}, {d}), k {hkv} heads, "
                    f"section {section}, {layout}")


if __name__ == "__main__":
    main()
