import torch
import torch.nn.functional as F
from torch import nn

from ..ops.swiglu import swiglu
from ..ops.swiglu_linear import swiglu_linear


class FusedSwiGLU(nn.Module):
    """``silu(gate_proj(x)) * up_proj(x)`` through :func:`fk.swiglu_linear` (one kernel).

    ``gate_proj`` and ``up_proj`` are ``nn.Linear(in_features, hidden_features)``, named as
    in Hugging Face's ``LlamaMLP``. ``recompute=True`` keeps no activations for the backward
    (see :func:`fk.swiglu_linear`). With ``bias=True`` the fused kernel does not apply: the
    projections run as ``nn.Linear`` and the gate through :func:`fk.swiglu`.
    ``gate_multiplier`` / ``down_multiplier`` (keywords, 1.0 by default): ``silu(gate_proj(x)
    * gate_multiplier) * up_proj(x) * down_multiplier`` (Falcon-H1's MLP multipliers).
    """

    def __init__(self, in_features: int, hidden_features: int, bias: bool = False, device=None,
                 dtype=None, recompute: bool = False, *, gate_multiplier: float = 1.0,
                 down_multiplier: float = 1.0):
        super().__init__()
        self.gate_multiplier = float(gate_multiplier)
        self.down_multiplier = float(down_multiplier)
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.recompute = recompute
        self.gate_proj = nn.Linear(in_features, hidden_features, **kw)
        self.up_proj = nn.Linear(in_features, hidden_features, **kw)

    def gate(self, x: torch.Tensor, down_multiplier: float) -> torch.Tensor:
        if self.gate_proj.bias is None:
            return swiglu_linear(x, self.gate_proj.weight, self.up_proj.weight, self.recompute,
                                 self.gate_multiplier, down_multiplier)
        return swiglu(F.linear(x, self.gate_proj.weight, self.gate_proj.bias),
                      F.linear(x, self.up_proj.weight, self.up_proj.bias), True,
                      self.gate_multiplier, down_multiplier)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(x, self.down_multiplier)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, hidden_features={self.hidden_features}, "
                f"recompute={self.recompute}")


class FusedSwiGLUMLP(FusedSwiGLU):
    """A Llama-style gated MLP, ``down_proj(silu(gate_proj(x)) * up_proj(x))``, with the gate
    and up projections and the SiLU-mul in one kernel (:func:`fk.swiglu_linear`) and
    ``down_proj`` through cuBLAS.

    Parameter names match Hugging Face's ``LlamaMLP`` (``gate_proj``, ``up_proj``,
    ``down_proj``), so its state dict loads as is. ``recompute=True`` keeps no gate
    activations for the backward (see :func:`fk.swiglu_linear`). With ``bias=True`` (HF's
    ``mlp_bias``) the fused kernel does not apply: the projections run as ``nn.Linear`` and
    the gate through :func:`fk.swiglu`. ``gate_multiplier`` / ``down_multiplier``
    (keywords): Falcon-H1's ``FalconH1MLP``, ``down_proj(up_proj(x) * silu(gate_proj(x) *
    gate_multiplier)) * down_multiplier`` (the down multiplier goes into the gate kernel
    without a bias, else it scales ``down_proj``'s output).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 device=None, dtype=None, recompute: bool = False, *,
                 gate_multiplier: float = 1.0, down_multiplier: float = 1.0):
        super().__init__(hidden_size, intermediate_size, bias, device, dtype, recompute,
                         gate_multiplier=gate_multiplier, down_multiplier=down_multiplier)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, device=device,
                                   dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.down_proj.bias is None:
            return self.down_proj(self.gate(x, self.down_multiplier))
        y = self.down_proj(self.gate(x, 1.0))
        return y if self.down_multiplier == 1.0 else y * self.down_multiplier
