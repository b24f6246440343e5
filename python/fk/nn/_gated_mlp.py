from torch import nn


class GatedMLP(nn.Module):
    """The projections of a gated MLP, ``down_proj(act(gate_proj(x)) * up_proj(x))``, named
    as in Hugging Face's Llama / Gemma MLPs. Subclasses define ``forward`` with their gate."""

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
