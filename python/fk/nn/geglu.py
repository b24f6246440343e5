import torch

from ..ops.geglu import geglu
from ._gated_mlp import GatedMLP

_APPROXIMATE = ("tanh", "none")


class GEGLUMLP(GatedMLP):
    """A Gemma-style gated MLP: ``down_proj(gelu(gate_proj(x), approximate) * up_proj(x))``.

    Parameter names match Hugging Face's ``GemmaMLP`` (``gate_proj``, ``up_proj``,
    ``down_proj``, no biases by default), so its state dict loads as is. ``approximate``:
    ``"tanh"`` (Gemma's ``gelu_pytorch_tanh``) or ``"none"`` (exact gelu). With
    ``backward_in_place=True`` (the default) the backward writes the gate's gradients into
    the gate and up projections' memory, which only this module sees (see
    :func:`fk.geglu`); set it to False if a hook keeps those projections.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, approximate: str = "tanh",
                 bias: bool = False, device=None, dtype=None, backward_in_place: bool = True):
        if approximate not in _APPROXIMATE:
            raise ValueError(f"approximate must be one of {_APPROXIMATE}, got {approximate!r}")
        super().__init__(hidden_size, intermediate_size, bias, device, dtype, backward_in_place)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(geglu(self.gate_proj(x), self.up_proj(x), self.approximate,
                                    self.backward_in_place))

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"
