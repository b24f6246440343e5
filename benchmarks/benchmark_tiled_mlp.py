"""Benchmark fk.nn.TiledSwiGLUMLP (the Llama MLP over the tokens in shards, activations
recomputed in the backward) against the untiled MLPs and Liger's tiled MLP.

    python benchmarks/benchmark_tiled_mlp.py --model llama_3_8b          # 8192..65536 tokens
    python benchmarks/benchmark_tiled_mlp.py --device cpu --tokens 64,100 --quick  # smoke test

Providers (x: (1, tokens, hidden); the weights are the benchmark's inputs, so every provider's
weight gradients start from None on each call):
- torch: Hugging Face LlamaMLP in eager torch, down(silu(gate(x)) * up(x)).
- fk untiled: fk.nn.SwiGLUMLP (cuBLAS projections + fk.swiglu, in-place gate backward).
- liger: Liger's LigerTiledSwiGLUMLP (column skipped when liger_kernel is not importable).
- fk: fk.nn.TiledSwiGLUMLP with the default shards, ceil(tokens / hidden).
The table's "MB" columns are the peak memory above the inputs during one call (forward +
backward in mode "full": output, input gradient and weight gradients included).

Expected at Llama-3-8B (H = 4096, N = 14336), 65536 tokens, bf16 (MiB = 2^20 B): the untiled
MLP keeps a, b, silu(a) * b (3 x 1792 MiB) for the backward and forms more there; the
tiled one keeps nothing, and its backward holds the weight gradients (3 x 112), the input
gradient and output (2 x 512) and three (4096 x 14336) shard tensors (3 x 112): ~1.7 GiB.
Work: one more forward's GEMMs than the untiled MLP (12 GEMMs instead of 9).
"""
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import _harness as H


def torch_mlp(x, wg, wu, wd):
    """Hugging Face LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def module_provider(mod):
    """Runs ``mod`` with the benchmark's weight tensors in place of its own parameters (kept
    there until the next call, so a backward that reads the module finds the same ones)."""
    def run(x, wg, wu, wd):
        for lin, w in ((mod.gate_proj, wg), (mod.up_proj, wu), (mod.down_proj, wd)):
            lin._parameters["weight"] = w
        return mod(x)
    return run


def main():
    p = H.make_parser(__doc__.splitlines()[0])
    p.set_defaults(tokens="8192,16384,32768,65536", modes="full,forward")
    p.add_argument("--num-shards", type=int, default=None,
                   help="shards for fk and Liger (default: ceil(tokens / hidden))")
    args = p.parse_args()
    ctx = H.setup(args)
    h, n = ctx.model.hidden_size, ctx.model.intermediate_size
    kw = dict(device=ctx.device, dtype=ctx.dtype)

    def make_inputs(tokens):
        x = torch.randn(1, tokens, h, **kw).requires_grad_()
        ws = [(torch.randn(*s, **kw) * s[1] ** -0.5).requires_grad_()
              for s in ((n, h), (n, h), (h, n))]
        return [x, *ws]

    def fk_untiled():
        import fk
        return module_provider(fk.nn.SwiGLUMLP(h, n, **kw))

    def fk_tiled():
        import fk
        return module_provider(fk.nn.TiledSwiGLUMLP(h, n, num_shards=args.num_shards, **kw))

    def liger():
        from liger_kernel.transformers.tiled_mlp import LigerTiledSwiGLUMLP
        cfg = SimpleNamespace(hidden_size=h, intermediate_size=n, hidden_act="silu")
        return module_provider(LigerTiledSwiGLUMLP(cfg, num_shards=args.num_shards).to(**kw))

    providers = {"torch": lambda: torch_mlp, "fk untiled": fk_untiled, "liger": liger,
                 "fk": fk_tiled}

    def bytes_moved(tokens, mode):
        # Compute-bound (GEMMs); the column counts the unavoidable traffic only: x, the
        # weights and the output once (forward); with the backward also grad_out, dx and the
        # weight gradients, and x and the weights read again by the recompute.
        fwd = (2 * tokens * h + 3 * h * n) * ctx.elem
        return fwd if mode == "forward" else 2 * fwd + (2 * tokens * h + 3 * h * n) * ctx.elem

    H.run(ctx, "tiled_mlp", make_inputs, providers, bytes_moved,
          shape=f"(1, T, {h}) x {n}")


if __name__ == "__main__":
    main()
