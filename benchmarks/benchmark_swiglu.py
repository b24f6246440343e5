"""Benchmark fk.swiglu (silu(a) * b) against torch, torch.compile and Liger.

    python benchmarks/benchmark_swiglu.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_swiglu.py --device cpu --tokens 64 --quick   # smoke test
"""
import torch
import torch.nn.functional as F

import _harness as H


def swiglu_reference(a, b):
    return F.silu(a) * b


def liger_swiglu():
    # Liger's backward writes da and db into the saved a and b buffers instead of allocating
    # new ones, so its "full" peak memory is lower than an out-of-place backward's, and the
    # inputs hold gradients afterwards (the harness makes fresh inputs for every provider).
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    return LigerSiLUMulFunction.apply


def fk_swiglu():
    # Under the same contract as Liger's: the backward may write da and db into a and b
    # (fk.swiglu(..., backward_in_place=True), as fk.nn.SwiGLUMLP uses it).
    import fk
    return lambda a, b: fk.swiglu(a, b, backward_in_place=True)


def fk_swiglu_out_of_place():
    import fk
    return fk.swiglu


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    n = ctx.model.intermediate_size
    if ctx.model.mlp_act != "silu":
        print(f"note: {ctx.model.name} uses {ctx.model.mlp_act}, not SiLU; "
              "benchmarking SwiGLU at its shapes")

    def make_inputs(tokens):
        kw = dict(device=ctx.device, dtype=ctx.dtype, requires_grad=True)
        return torch.randn(tokens, n, **kw), torch.randn(tokens, n, **kw)

    def bytes_moved(tokens, mode):
        t = tokens * n * ctx.elem
        fwd = 3 * t  # read a, b; write c
        return fwd if mode == "forward" else fwd + 5 * t  # + read dc, a, b; write da, db

    providers = {
        "torch": lambda: swiglu_reference,
        "torch.compile": lambda: torch.compile(swiglu_reference),
        "liger": liger_swiglu,
        "fk": fk_swiglu,
        "fk (new grads)": fk_swiglu_out_of_place,
    }
    H.run(ctx, "swiglu", make_inputs, providers, bytes_moved, shape=f"(tokens, {n})")


if __name__ == "__main__":
    main()
