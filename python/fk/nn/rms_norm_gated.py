from typing import Optional

import torch
from torch import nn

from ..ops.gated_group_rms_norm import ACTIVATIONS, gated_group_rms_norm


class RMSNormGated(nn.Module):
    """Gated RMSNorm, drop-in for Hugging Face's ``Qwen3NextRMSNormGated`` (same constructor
    and parameter, ``forward(hidden_states, gate)``): RMSNorm over the last dimension (or over
    groups of ``group_size`` of it, as FLA's / Mamba 2's gated norm), times the weight, times
    ``act(gate)``; see :func:`fk.gated_group_rms_norm`."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, group_size: Optional[int] = None,
                 activation: str = "silu", device=None, dtype=None, **kwargs):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.group_size = hidden_size if group_size is None else group_size
        self.activation = activation

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_group_rms_norm(hidden_states, gate, self.weight, self.group_size,
                                    self.variance_epsilon, self.activation)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, eps={self.variance_epsilon}, "
                f"group_size={self.group_size}, activation={self.activation!r}")
