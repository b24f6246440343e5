"""Benchmark fk.fused_add_rms_norm against torch, torch.compile and Liger.

    python benchmarks/benchmark_fused_add_rms_norm.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_fused_add_rms_norm.py --device cpu --tokens 64 --quick   # smoke test

The op is a decoder layer's ``hidden = residual + x; y = norm(hidden)`` returning
``(y, hidden)``. In ``full`` mode both outputs receive a gradient, as in a model (y feeds
the next sub-layer, hidden the next residual add): the harness backpropagates a random
gradient into y, and a fixed random gradient for hidden joins it through ``_BothOutputs``
(a view, no GPU work). ``x`` and the weight require grad; the residual is a leaf that does
not: with two leaves sharing one gradient, autograd would copy it for the second leaf's
``.grad`` (the same extra copy for every provider, and absent in a model, where both are
intermediate). The model config picks eps, offset and casting mode.
"""
import torch

import _harness as H
from benchmark_rms_norm import make_reference


class _BothOutputs(torch.autograd.Function):
    """Returns y (as a view) and, in backward, gives residual_out the gradient passed in."""

    @staticmethod
    def forward(ctx, y, residual_out, grad_residual_out):
        ctx.grad_residual_out = grad_residual_out
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad_y):
        return grad_y, ctx.grad_residual_out, None


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    m = ctx.model
    n, eps, offset, mode = m.hidden_size, m.rms_eps, m.rms_offset, m.rms_casting_mode
    rms_norm_reference = make_reference(eps, offset, mode)

    def reference(x, residual, weight):
        hidden = residual + x  # Hugging Face: hidden_states = residual + hidden_states
        return rms_norm_reference(hidden, weight), hidden

    def make_inputs(tokens):
        x = torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype, requires_grad=True)
        residual = torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype)
        # Weights near 1 (near 0 with Gemma's offset), as a trained model's.
        w = (1.0 - offset) + 0.1 * torch.randn(n, device=ctx.device, dtype=ctx.dtype)
        grad_residual_out = torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype)
        return x, residual, w.requires_grad_(), grad_residual_out

    def bytes_moved(tokens, which):
        mn = tokens * n * ctx.elem
        # forward: read x, residual, w; write y, residual_out, rstd (float32)
        fwd = 4 * mn + n * ctx.elem + tokens * 4
        # backward: read grad_y, grad_residual_out, residual_out; write grad_x (which is also
        # grad_residual); w, rstd and dw are small
        return fwd if which == "forward" else fwd + 4 * mn

    def provider(op):
        return lambda x, r, w, ds: _BothOutputs.apply(*op(x, r, w), ds)

    def liger():
        # Positional (X, R, W, eps, offset, casting_mode); in_place (dx written into dy)
        # follows, off by default.
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        return provider(lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, eps, offset,
                                                                           mode))

    def fk_op():
        import fk
        return provider(lambda x, r, w: fk.fused_add_rms_norm(x, r, w, eps, offset, mode))

    providers = {
        "torch": lambda: provider(reference),
        "torch.compile": lambda: provider(torch.compile(reference)),
        "liger": liger,
        "fk": fk_op,
    }
    H.run(ctx, "fused_add_rms_norm", make_inputs, providers, bytes_moved,
          shape=f"(tokens, {n}) eps={eps} offset={offset} {mode}")


if __name__ == "__main__":
    main()
