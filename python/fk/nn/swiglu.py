import torch
from torch import nn

from ..ops.swiglu import swiglu


class SwiGLUMLP(nn.Module):
    """A Llama-style gated MLP: ``down_proj(silu(gate_proj(x)) * up_proj(x))``.

    Parameter names match Hugging Face's ``LlamaMLP`` (``gate_proj``, ``up_proj``,
    ``down_proj``), so its state dict loads as is. With ``backward_in_place=True`` (the
    default) the backward writes the gate's gradients into the gate and up projections'
    memory, which only this module sees (see :func:`fk.swiglu`); set it to False if a hook
    keeps those projections.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 device=None, dtype=None, backward_in_place: bool = True):
        super().__init__()
        self.backward_in_place = backward_in_place
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.backward_in_place))
