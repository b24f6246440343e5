"""Benchmark fk.geglu (gelu(a) * b) against torch, torch.compile and Liger.

    python benchmarks/benchmark_geglu.py --model gemma_2_9b --sweep-mode token_length
    python benchmarks/benchmark_geglu.py --approximate none     # exact gelu (no Liger column)
    python benchmarks/benchmark_geglu.py --device cpu --tokens 64 --quick   # smoke test

Traffic (the %ceil column): forward reads a, b and writes c (3 tensors); forward + backward
adds reading dc, a, b and writing da, db (5 more). At 8192 x 14336 bf16 that is 704.6 MB
(0.168 ms at 4.2 TB/s) and 1879 MB (0.447 ms).
"""
import torch
import torch.nn.functional as F

import _harness as H


def reference(approximate):
    return lambda a, b: F.gelu(a, approximate=approximate) * b


def liger_geglu(approximate):
    def factory():
        # Liger's GeGLU is the tanh form only; its backward writes da and db into the saved
        # a and b (the harness makes fresh inputs for every provider).
        if approximate != "tanh":
            raise ImportError("Liger has no exact-gelu GeGLU")
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        return LigerGELUMulFunction.apply
    return factory


def fk_geglu(approximate, in_place):
    def factory():
        # In place: the same contract as Liger's (fk.nn.GEGLUMLP uses it).
        import fk
        return lambda a, b: fk.geglu(a, b, approximate, backward_in_place=in_place)
    return factory


def main():
    parser = H.make_parser(__doc__.splitlines()[0])
    parser.set_defaults(model="gemma_2_9b")  # GeGLU's model; 14336 wide like llama_3_8b
    parser.add_argument("--approximate", default="tanh", choices=["tanh", "none"],
                        help="gelu form (default tanh, Gemma's gelu_pytorch_tanh)")
    args = parser.parse_args()
    ctx = H.setup(args)
    n = ctx.model.intermediate_size
    if ctx.model.mlp_act != "gelu_tanh":
        print(f"note: {ctx.model.name} uses {ctx.model.mlp_act}, not GELU; "
              "benchmarking GeGLU at its shapes")

    def make_inputs(tokens):
        kw = dict(device=ctx.device, dtype=ctx.dtype, requires_grad=True)
        return torch.randn(tokens, n, **kw), torch.randn(tokens, n, **kw)

    def bytes_moved(tokens, mode):
        t = tokens * n * ctx.elem
        fwd = 3 * t  # read a, b; write c
        return fwd if mode == "forward" else fwd + 5 * t  # + read dc, a, b; write da, db

    approx = args.approximate
    providers = {
        "torch": lambda: reference(approx),
        "torch.compile": lambda: torch.compile(reference(approx)),
        "liger": liger_geglu(approx),
        "fk": fk_geglu(approx, True),
        "fk (new grads)": fk_geglu(approx, False),
    }
    op = "geglu" if approx == "tanh" else "geglu_erf"
    H.run(ctx, op, make_inputs, providers, bytes_moved, shape=f"(tokens, {n}) gelu {approx}")


if __name__ == "__main__":
    main()
