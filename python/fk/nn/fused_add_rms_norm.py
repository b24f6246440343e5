from typing import Tuple

import torch
from torch import nn

from ..ops.fused_add_rms_norm import fused_add_rms_norm
from ..ops.rms_norm import CASTING_MODES


class FusedAddRMSNorm(nn.Module):
    """The residual add and the following RMSNorm of a decoder layer, in one op.

    ``forward(x, residual)`` returns ``(y, residual_out)`` with ``residual_out = x +
    residual`` and ``y = RMSNorm(residual_out)``: a Hugging Face layer's

        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)

    becomes ``hidden_states, residual = norm(hidden_states, residual)``. The constructor
    follows ``LlamaRMSNorm`` (``hidden_size``, ``eps``), the parameter is ``weight`` so its
    state dict loads as is, plus ``offset`` (Gemma: 1.0, with the weight initialised to
    zeros) and ``casting_mode`` (see :func:`fk.rms_norm`).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0,
                 casting_mode: str = "llama", device=None, dtype=None):
        super().__init__()
        if casting_mode not in CASTING_MODES:
            raise ValueError(f"casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")
        self.hidden_size = hidden_size
        self.eps = float(eps)
        self.offset = float(offset)
        self.casting_mode = casting_mode
        init = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rms_norm(x, residual, self.weight, self.eps, self.offset,
                                  self.casting_mode)

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, eps={self.eps}, offset={self.offset}, "
                f"casting_mode={self.casting_mode!r}")
