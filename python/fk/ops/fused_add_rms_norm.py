from typing import Optional, Tuple

import torch


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor,
                       weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                       offset: float = 0.0,
                       casting_mode: str = "llama") -> Tuple[torch.Tensor, torch.Tensor]:
    """Residual add fused with RMSNorm, as in a decoder layer::

        residual_out = x + residual
        y = fk.rms_norm(residual_out, weight, eps, offset, casting_mode)

    One kernel reads ``x``, ``residual`` and ``weight`` once and writes ``y`` and
    ``residual_out``; the backward is one kernel too (plus a small reduction for the weight
    gradient).

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU), e.g. an attention or
            MLP output.
        residual: the residual stream, same shape, dtype and device as ``x``.
        weight, eps, offset, casting_mode: as in :func:`fk.rms_norm` (``weight`` of shape
            ``(N,)`` or None; ``offset=1`` with Gemma's ``weight - 1``; ``"llama"``,
            ``"gemma"`` or ``"none"``).
        Non-contiguous inputs are copied to contiguous memory first.

    Returns:
        ``(y, residual_out)``, both of ``x``'s shape and dtype, contiguous.
        ``residual_out`` is ``x + residual`` added in float32 and rounded once to ``x``'s
        dtype, exactly what ``residual + hidden_states`` gives in torch; ``y`` is
        ``fk.rms_norm`` of it (the same arithmetic). Differentiable in ``x``, ``residual``
        and ``weight``, with gradients flowing from either output or both: the gradient of
        ``residual_out`` adds into that of ``x``, computed in float32 with one rounding.
        One gradient tensor serves ``x`` and ``residual`` (autograd copies it where both
        are leaves). Work for an unused output or a frozen weight is skipped: with ``y``
        unused no kernel runs and the gradient of ``residual_out`` passes through.
    """
    return torch.ops.fk.fused_add_rms_norm(x, residual, weight, eps, offset, casting_mode)
