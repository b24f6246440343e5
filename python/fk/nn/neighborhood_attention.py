import math
from typing import Optional

import torch
from torch import nn

from ..ops.neighborhood_attention import neighborhood_attention


class NeighborhoodAttention(nn.Module):
    """Multi-head 1-D neighborhood attention with q / k / v / out projections (see
    :func:`fk.neighborhood_attention`): a drop-in for Liger Kernel's
    ``LigerFusedNeighborhoodAttention``, with the same constructor arguments, parameter names
    (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) and forward signature.

    ``hidden_states`` ``(batch, seq_len, hidden_size)`` is projected to ``num_heads`` heads of
    ``hidden_size // num_heads``; each query attends its window of ``kernel_size`` keys
    spaced ``dilation`` apart (cut at the sequence ends); the heads are merged and, in
    training with ``dropout > 0``, dropped out (``nn.Dropout`` on the attention output, as
    Liger does) before ``out_proj``. ``attention_mask`` is not supported (NotImplementedError
    when given).
    """

    def __init__(self, hidden_size: int, num_heads: int, kernel_size: int = 7,
                 dilation: int = 1, bias: bool = True, dropout: float = 0.0,
                 scale: Optional[float] = None) -> None:
        super().__init__()
        if hidden_size % num_heads != 0:
            raise ValueError(f"NeighborhoodAttention: hidden_size ({hidden_size}) must be a "
                             f"multiple of num_heads ({num_heads})")
        if kernel_size <= 0 or kernel_size % 2 == 0:
            raise ValueError("NeighborhoodAttention: kernel_size must be a positive odd "
                             f"number, got {kernel_size}")
        if dilation < 1:
            raise ValueError(f"NeighborhoodAttention: dilation must be positive, got {dilation}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout_p = float(dropout)
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.dropout = nn.Dropout(dropout) if dropout > 0.0 else None

    def _heads(self, x: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
        # (batch, seq_len, hidden) -> a (batch, heads, seq_len, head_dim) view, no copy.
        return x.view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states: torch.Tensor,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if attention_mask is not None:
            raise NotImplementedError(
                "NeighborhoodAttention: attention_mask is not supported")
        batch, seq_len, hidden = hidden_states.shape
        q = self._heads(self.q_proj(hidden_states), batch, seq_len)
        k = self._heads(self.k_proj(hidden_states), batch, seq_len)
        v = self._heads(self.v_proj(hidden_states), batch, seq_len)
        out = neighborhood_attention(q, k, v, self.kernel_size, self.dilation, self.scale)
        out = out.transpose(1, 2).reshape(batch, seq_len, hidden)
        if self.dropout is not None:
            out = self.dropout(out)
        return self.out_proj(out)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, scale={self.scale}, dropout={self.dropout_p}")
