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

    ``gate_multiplier`` / ``down_multiplier`` (keywords, 1.0 by default): Falcon-H1's
    ``FalconH1MLP``, ``down_proj(up_proj(x) * silu(gate_proj(x) * gate_multiplier)) *
    down_multiplier``; the down multiplier goes into the gate kernel when ``down_proj`` has
    no bias, else it scales ``down_proj``'s output.

    Constructor: ``SwiGLUMLP(hidden_size, intermediate_size, bias=False, device=None,
    dtype=None, backward_in_place=True, *, gate_multiplier=1.0, down_multiplier=1.0)``.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 device=None, dtype=None, backward_in_place: bool = True, *,
                 gate_multiplier: float = 1.0, down_multiplier: float = 1.0):
        super().__init__(hidden_size, intermediate_size, bias, device, dtype, backward_in_place)
        self.gate_multiplier = float(gate_multiplier)
        self.down_multiplier = float(down_multiplier)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inside = self.down_proj.bias is None
        y = self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.backward_in_place,
                                  self.gate_multiplier,
                                  self.down_multiplier if inside else 1.0))
        return y if inside or self.down_multiplier == 1.0 else y * self.down_multiplier
