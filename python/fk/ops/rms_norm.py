from typing import Optional

import torch

CASTING_MODES = ("llama", "gemma", "none")


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
             offset: float = 0.0, casting_mode: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dimension: ``x * rsqrt(mean(x**2, -1) + eps) * (offset + weight)``.

    Args:
        x: ``(..., N)``, float32, bfloat16 or float16 (float64 on CPU). Any leading dims;
            non-contiguous inputs are copied to contiguous memory first.
        weight: ``(N,)`` of ``x``'s dtype and device, or None (then the normalized ``x`` is
            returned and ``offset`` is unused).
        eps: added to the mean of squares.
        offset: added to ``weight`` (Gemma stores ``weight - 1`` and uses ``offset=1``).
        casting_mode: where values are rounded to ``x``'s dtype, following the model:
            ``"llama"``: rstd in float32, the normalized ``x`` rounded to ``x``'s dtype, then
            multiplied by ``offset + weight`` (Hugging Face Llama, Mistral, Qwen ...);
            ``"gemma"``: everything in float32, one rounding at the end (Hugging Face Gemma);
            ``"none"``: rstd, normalized ``x`` and ``offset + weight`` each rounded to
            ``x``'s dtype.
            The mean of squares is accumulated in float32 in every mode.

    Returns:
        ``y`` of ``x``'s shape and dtype, contiguous. Differentiable in ``x`` and
        ``weight``; the weight gradient is summed in float32.
    """
    return torch.ops.fk.rms_norm(x, weight, eps, offset, casting_mode)
