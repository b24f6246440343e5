"""TorchScript: modules calling fk's operators script, save, load (in this process and in a
fresh one) and give the eager results, forward and backward."""
import math
import os
import subprocess
import sys
import textwrap
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fk

pytestmark = [pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning"),
              # torch 2.14 on: a FutureWarning
              pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")]


def _randn(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


class OpsBlock(nn.Module):
    """A pre-norm Llama MLP block through ``torch.ops.fk.*``."""

    def __init__(self, hidden: int = 48, intermediate: int = 80, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.norm_weight = nn.Parameter(1.0 + _randn(hidden, seed=1, scale=0.1))
        self.gate = nn.Parameter(_randn(intermediate, hidden, seed=2, scale=hidden ** -0.5))
        self.up = nn.Parameter(_randn(intermediate, hidden, seed=3, scale=hidden ** -0.5))
        self.down = nn.Parameter(_randn(hidden, intermediate, seed=4, scale=intermediate ** -0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.fk.rms_norm(x, self.norm_weight, self.eps, 0.0, "llama")
        y = torch.ops.fk.swiglu(F.linear(h, self.gate), F.linear(h, self.up))
        return x + F.linear(y, self.down)


class WrapperBlock(nn.Module):
    """The same kind of block through the Python API: fk.rms_norm / fk.swiglu and fk.nn."""

    def __init__(self, hidden: int = 48, intermediate: int = 80):
        super().__init__()
        self.norm = fk.nn.RMSNorm(hidden, eps=1e-5)
        self.mlp = fk.nn.SwiGLUMLP(hidden, intermediate)
        self.gemma_weight = nn.Parameter(_randn(hidden, seed=5, scale=0.1))

    def forward(self, x: torch.Tensor, w: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.norm(x)
        h = h + fk.rms_norm(h, self.gemma_weight, 1e-6, 1.0, "gemma")
        if w is not None:
            h = h + fk.rms_norm(h, w)
        h = h + fk.rms_norm(h, None, 1e-6)
        return x + self.mlp(h) + fk.swiglu(h, x)


def _roundtrip(scripted: torch.jit.ScriptModule, tmp_path) -> torch.jit.ScriptModule:
    path = tmp_path / "module.pt"
    scripted.save(str(path))
    return torch.jit.load(str(path))


def _fwd_bwd(module, *inputs):
    """Output and the gradients of (output * fixed weights).sum() in the inputs and params."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in inputs]
    out = module(*leaves)
    gy = _randn(*out.shape, seed=99)
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    (out * gy).sum().backward()
    grads = [t.grad for t in leaves if t is not None] + [p.grad.clone() for p in params]
    return out.detach(), grads


def _assert_same(eager, loaded, what):
    """Float32 results equal up to summation order (BLAS results depend on memory alignment;
    a weight gradient sums rows of products up to about 10, so its absolute error scales
    with those, not with the sum)."""
    (out_e, grads_e), (out_l, grads_l) = eager, loaded
    torch.testing.assert_close(out_l, out_e, rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"{what}: output\n{m}")
    assert len(grads_e) == len(grads_l)
    for i, (ge, gl) in enumerate(zip(grads_e, grads_l)):
        assert gl is not None, f"{what}: gradient {i} is missing"
        torch.testing.assert_close(gl, ge, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{what}: gradient {i}\n{m}")


def test_ops_block_script_save_load(tmp_path):
    block = OpsBlock()
    loaded = _roundtrip(torch.jit.script(block), tmp_path)
    graph = str(loaded.graph)
    assert "fk::rms_norm" in graph and "fk::swiglu" in graph, graph
    x = _randn(2, 7, 48, seed=0)
    _assert_same(_fwd_bwd(block, x), _fwd_bwd(loaded, x), "torch.ops.fk block")

    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * block.norm_weight
    ref = x + F.linear(F.silu(F.linear(h, block.gate)) * F.linear(h, block.up), block.down)
    torch.testing.assert_close(loaded(x), ref, rtol=1e-5, atol=1e-5)


def test_python_api_is_scriptable(tmp_path):
    """fk.rms_norm, fk.swiglu, fk.nn.RMSNorm (with a float eps) and fk.nn.SwiGLUMLP script."""
    block = WrapperBlock()
    loaded = _roundtrip(torch.jit.script(block), tmp_path)
    x = _randn(3, 5, 48, seed=6)
    w = 1.0 + _randn(48, seed=7, scale=0.1)
    _assert_same(_fwd_bwd(block, x, w), _fwd_bwd(loaded, x, w), "fk.* wrappers (with w)")
    _assert_same(_fwd_bwd(block, x, None), _fwd_bwd(loaded, x, None), "fk.* wrappers (w=None)")


def test_scripted_function_calls_ops():
    @torch.jit.script
    def f(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return fk.swiglu(fk.rms_norm(a, w, 1e-6), b)

    a, b, w = _randn(4, 40, seed=8), _randn(4, 40, seed=9), _randn(40, seed=10)
    torch.testing.assert_close(f(a, b, w), fk.swiglu(fk.rms_norm(a, w, 1e-6), b),
                               rtol=1e-6, atol=1e-7)


def test_rms_norm_module_default_eps_is_scriptable():
    norm = fk.nn.RMSNorm(48)
    scripted = torch.jit.script(norm)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = _randn(2, 48, seed=11).to(dtype)
        n = norm.to(dtype)
        torch.testing.assert_close(scripted.to(dtype)(x), n(x))
        ref = torch.nn.RMSNorm(48, eps=torch.finfo(dtype).eps).to(dtype)
        torch.testing.assert_close(n(x).float(), ref(x).float(), rtol=1e-2, atol=1e-2)


def test_loaded_in_fresh_process(tmp_path):
    """A saved module runs in a process that only imports fk (which registers the ops)."""
    block = OpsBlock()
    path = tmp_path / "block.pt"
    torch.jit.script(block).save(str(path))
    x = _randn(2, 3, 48, seed=12)
    torch.save({"x": x, "y": block(x).detach()}, tmp_path / "io.pt")
    code = textwrap.dedent("""
        import sys
        import torch
        import fk  # noqa: F401
        io = torch.load(sys.argv[2])
        m = torch.jit.load(sys.argv[1])
        x = io["x"].clone().requires_grad_(True)
        y = m(x)
        torch.testing.assert_close(y, io["y"], rtol=1e-5, atol=1e-6)
        y.sum().backward()
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())
        print("OK fresh process")
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "io.pt")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "OK fresh process" in proc.stdout


def test_gradcheck_through_loaded_module(tmp_path):
    """Float64 gradients through the loaded module match finite differences."""
    block = OpsBlock(hidden=8, intermediate=12).double()
    loaded = _roundtrip(torch.jit.script(block), tmp_path)
    x = _randn(2, 8, seed=13).double().requires_grad_(True)
    assert torch.autograd.gradcheck(loaded, (x,), eps=1e-6, atol=1e-5)
    assert math.isfinite(loaded(x).sum().item())
