import torch


def swiglu_linear(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                  recompute: bool = False) -> torch.Tensor:
    """Fused SwiGLU projection: ``silu(x @ w_gate.T) * (x @ w_up.T)`` in one GEMM kernel.

    The gated half of a Llama MLP (``down_proj`` is applied after it). Both products share
    one pass over ``x``; each output tile keeps two float32 accumulators and applies SiLU
    and the product in float32 before one rounding to ``x``'s dtype.

    Args:
        x: ``(..., K)``, float32, bfloat16 or float16 (float64 on CPU). Any leading dims.
        w_gate: ``(N, K)``, the gate projection's weight as ``nn.Linear`` stores it
            (``gate_proj.weight``), of ``x``'s dtype and device.
        w_up: ``(N, K)``, the up projection's weight (``up_proj.weight``).
        recompute: what the forward keeps for the backward. False (default): two tensors
            of the output's size, ``silu(a)`` and ``b * silu'(a)`` (``a = x @ w_gate.T``,
            ``b = x @ w_up.T``), written by the forward kernel next to the output.
            True: nothing but ``x`` and the weights; the backward first runs the forward
            GEMM again to form them (half again the op's backward work; two output-sized
            tensors less memory held from the forward to the backward).

    Returns:
        ``(..., N)`` of ``x``'s dtype, contiguous. Differentiable in ``x``, ``w_gate`` and
        ``w_up``: the backward is two GEMM kernels, one for ``grad_x`` and one for both
        weight gradients, which form ``grad_a`` and ``grad_b`` as they load their operands
        and round them to ``x``'s dtype before the tensor-core products (float32
        accumulation). Only the gradients that are needed are computed (frozen weights:
        no weight-gradient kernel; ``x`` not requiring grad: no ``grad_x`` kernel).
        Non-contiguous inputs are copied to contiguous memory first. On CUDA, float32
        products use three TF32 passes (about float32 accuracy).
    """
    return torch.ops.fk.swiglu_linear(x, w_gate, w_up, recompute)
