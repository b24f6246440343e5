import torch

from ..ops.swiglu import swiglu
from ._gated_mlp import GatedMLP


class SwiGLUMLP(GatedMLP):
    """A Llama-style gated MLP: ``down_proj(silu(gate_proj(x)) * up_proj(x))``.

    Parameter names match Hugging Face's ``LlamaMLP`` (``gate_proj``, ``up_proj``,
    ``down_proj``), so its state dict loads as is. With ``backward_in_place=True`` (the
    default) the backward writes the gate's gradients into the gate and up projections'
    memory, which only this module sees (see :func:`fk.swiglu`); set it to False if a hook
    keeps those projections.

    Constructor: ``SwiGLUMLP(hidden_size, intermediate_size, bias=False, device=None,
    dtype=None, backward_in_place=True)``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.backward_in_place))
