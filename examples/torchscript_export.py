"""Export a TorchScript module that uses fk's operators, for LibTorch programs to load.

    python examples/torchscript_export.py block.pt
    ./build/fk_example block.pt

The module is a pre-norm Llama MLP block with fixed, seeded weights:

    y = x + down(swiglu(gate(h), up(h))),   h = rms_norm(x, norm_weight, eps)

calling ``torch.ops.fk.rms_norm`` and ``torch.ops.fk.swiglu``. Besides the parameters it
stores two buffers: ``example_input`` (a seeded input) and ``expected_output`` (the eager
result for it, computed here before scripting), so a loader can check itself without any
side file. The attribute ``eps`` is kept too, so a loader can recompute the block from the
parameters on its own.
"""
import argparse
import math
from pathlib import Path
from typing import Union

import torch
import torch.nn.functional as F
from torch import nn

import fk  # noqa: F401  (loads libfk: registers torch.ops.fk.*)


class FkMLPBlock(nn.Module):
    """``x + down(swiglu(gate(h), up(h)))`` with ``h = rms_norm(x)``, through torch.ops.fk."""

    eps: float

    def __init__(self, hidden: int = 64, intermediate: int = 160, eps: float = 1e-6,
                 seed: int = 0, batch: int = 2, seq: int = 5):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return torch.randn(*shape, generator=g) * scale

        self.eps = float(eps)
        self.norm_weight = nn.Parameter(1.0 + randn(hidden, scale=0.1))
        self.gate_weight = nn.Parameter(randn(intermediate, hidden, scale=1 / math.sqrt(hidden)))
        self.up_weight = nn.Parameter(randn(intermediate, hidden, scale=1 / math.sqrt(hidden)))
        self.down_weight = nn.Parameter(
            randn(hidden, intermediate, scale=1 / math.sqrt(intermediate)))
        self.register_buffer("example_input", randn(batch, seq, hidden))
        self.register_buffer("expected_output", torch.zeros(batch, seq, hidden))
        with torch.no_grad():
            self.expected_output.copy_(self.forward(self.example_input))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.fk.rms_norm(x, self.norm_weight, self.eps, 0.0, "llama")
        a = F.linear(h, self.gate_weight)
        b = F.linear(h, self.up_weight)
        return x + F.linear(torch.ops.fk.swiglu(a, b), self.down_weight)


def export(path: Union[str, Path], **kwargs) -> torch.Tensor:
    """Script the block, save it to ``path``; returns the expected output (CPU, float32)."""
    block = FkMLPBlock(**kwargs).eval()
    scripted = torch.jit.script(block)
    scripted.save(str(path))
    return block.expected_output.clone()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="where to write the TorchScript file (.pt)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=160)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    expected = export(args.path, hidden=args.hidden, intermediate=args.intermediate,
                      eps=args.eps, seed=args.seed)
    print(f"saved {args.path}")
    print(f"expected_output shape={tuple(expected.shape)} sum={expected.sum().item():.6f} "
          f"abs_sum={expected.abs().sum().item():.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
