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
        ``w_up``. The backward forms ``grad_a = grad_z * silu'(a) * b`` and
        ``grad_b = grad_z * silu(a)`` in one elementwise kernel (float32 products, rounded
        to ``x``'s dtype), writing them over the two saved tensors when nothing can read
        those again (not with ``retain_graph=True`` or ``create_graph=True``: then into
        new memory), and runs the products ``grad_x = grad_a @ w_gate + grad_b @ w_up``,
        ``grad_w_gate = grad_a.T @ x``, ``grad_w_up = grad_b.T @ x`` through
        ``torch.mm`` (cuBLAS on CUDA, float32 accumulation). Only the gradients that are
        needed are computed (frozen weights: no weight products; ``x`` not requiring
        grad: no ``grad_x`` products). Non-contiguous inputs are copied to contiguous
        memory first. On CUDA, the forward's float32 products use three TF32 passes
        (about float32 accuracy).

    Memory and time of ``recompute`` (Llama-3-8B MLP, 8192 tokens, bf16): the default
    holds ``s`` and ``t`` (2 x 224 MiB) from forward to backward; ``recompute=True`` holds
    none of it but runs the fused forward GEMM again in the backward (about 3 ms on an
    H200, a third more work for this op's forward + backward). Within one layer's backward
    the peak is the same; the saving is per layer whose activations wait for the
    backward (activation checkpointing gets the same effect for whole blocks).
    """
    return torch.ops.fk.swiglu_linear(x, w_gate, w_up, recompute)
