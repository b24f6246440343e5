"""Benchmark fk.gated_group_rms_norm (the output gate of linear-attention layers) against the
same math in torch and torch.compile.

    python benchmarks/benchmark_gated_group_rms_norm.py --tokens 8192
    python benchmarks/benchmark_gated_group_rms_norm.py --device cpu --tokens 64 --quick

Qwen3-Next's gated delta-net output: x and gate (batch, seq, 32 value heads, 128), RMSNorm per
head with a (128,) weight, times silu(gate) (Qwen3NextRMSNormGated); --transpose-out writes
(seq, batch, heads * 128) (Megatron's sequence-first layout) in the same pass (torch: a
transpose and a copy). The ceiling column counts the bytes that must move: the forward reads
x and gate and writes y; the backward reads x, gate and dy and writes dx and dgate.
"""
import torch

import _harness as H


def make_torch_fn(group_size, eps, activation, transpose_out):
    def fn(x, gate, weight):
        dtype = x.dtype
        xs = x.float().unflatten(-1, (-1, group_size))
        xs = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
        y = weight * xs.to(dtype).flatten(-2)
        act = torch.nn.functional.silu if activation == "silu" else torch.sigmoid
        y = (y * act(gate.float())).to(dtype)
        if transpose_out:
            b, s, h, d = y.shape
            y = y.transpose(0, 1).reshape(s, b, h * d)
        return y
    return fn


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.set_defaults(tokens="8192")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length (batch = tokens / seq)")
    parser.add_argument("--heads", type=int, default=32, help="value heads")
    parser.add_argument("--head-dim", type=int, default=128, help="value head dim = group size")
    parser.add_argument("--activation", default="silu", choices=["silu", "sigmoid"])
    parser.add_argument("--transpose-out", action="store_true")
    args = parser.parse_args()
    ctx = H.setup(args)
    h, d = args.heads, args.head_dim // (16 if args.quick else 1)
    eps = 1e-6

    def dims(tokens):
        return H.batch_and_seq(tokens, args.seq)

    def bytes_moved(tokens, mode):
        elems = tokens * h * d * ctx.elem
        fwd = 3 * elems + d * ctx.elem
        return fwd if mode == "forward" else fwd + 5 * elems + 2 * d * ctx.elem

    def make_inputs(tokens):
        b, s = dims(tokens)
        kw = dict(device=ctx.device, dtype=ctx.dtype)
        x, gate = torch.randn(b, s, h, d, **kw), torch.randn(b, s, h, d, **kw)
        w = 1 + 0.1 * torch.randn(d, **kw)
        return x.requires_grad_(), gate.requires_grad_(), w.requires_grad_()

    def fk_fn():
        import fk
        return lambda x, gate, w: fk.gated_group_rms_norm(x, gate, w, d, eps, args.activation,
                                                          args.transpose_out)

    torch_fn = make_torch_fn(d, eps, args.activation, args.transpose_out)
    providers = {
        "torch": lambda: torch_fn,
        "torch.compile": lambda: torch.compile(torch_fn),
        "fk": fk_fn,
    }
    layout = "(seq, batch, heads * dim)" if args.transpose_out else "x's shape"
    H.run(ctx, "gated_group_rms_norm", make_inputs, providers, bytes_moved,
          shape=f"x, gate (tokens / seq, seq <= {args.seq}, {h}, {d}), {args.activation}, "
                f"out {layout}")


if __name__ == "__main__":
    main()
