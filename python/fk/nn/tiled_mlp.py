"""Gated MLPs run over the tokens in shards, keeping no activations between forward and
backward (the backward recomputes each shard's forward)."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ._gated_mlp import GatedMLP

ACTIVATIONS = ("swiglu", "geglu_tanh", "geglu_none")


def default_num_shards(x: torch.Tensor, hidden_size: int) -> int:
    """``ceil(x.shape[-2] / hidden_size)`` (at least 1): the sequence dimension of a
    ``(batch, seq, hidden)`` or ``(seq, hidden)`` input over the hidden size; 1 for a 1-D
    input."""
    seq = x.shape[-2] if x.dim() >= 2 else 1
    return max(1, math.ceil(seq / hidden_size))


def _shards(n: int, num_shards: int):
    """Row ranges ``(start, stop)`` splitting ``n`` rows as ``torch.chunk`` does: pieces of
    ``ceil(n / num_shards)`` rows, the last one shorter (so possibly fewer pieces)."""
    step = max(1, math.ceil(n / num_shards))
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def _gate(activation, a, b):
    if activation == "swiglu":
        return torch.ops.fk.swiglu(a, b, False)
    return torch.ops.fk.geglu(a, b, activation[len("geglu_"):], False)


def _gate_grads_in_place(activation, grad, a, b):
    """Writes d/da and d/db of ``act(a) * b`` (incoming gradient ``grad``) over a and b."""
    if activation == "swiglu":
        torch.ops.fk._swiglu_backward_(grad, a, b)
    else:
        torch.ops.fk._geglu_backward_(grad, a, b, activation[len("geglu_"):])


def _accumulate(acc: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, first: bool) -> None:
    """``acc = m1 @ m2`` (first) or ``acc += m1 @ m2``. The product is added in the GEMM's
    float32 epilogue; a float32 ``acc`` with half-precision factors stays float32 throughout
    on CUDA (cuBLAS with a float32 C matrix), while the CPU forms the product in the factors'
    dtype first."""
    if acc.dtype == m1.dtype:
        if first:
            torch.mm(m1, m2, out=acc)
        else:
            acc.addmm_(m1, m2)
    elif acc.is_cuda:
        if first:
            torch.ops.aten.mm.dtype_out(m1, m2, acc.dtype, out=acc)
        else:
            torch.ops.aten.addmm.dtype_out(acc, m1, m2, acc.dtype, out=acc)
    elif first:
        acc.copy_(torch.mm(m1, m2))
    else:
        acc.add_(torch.mm(m1, m2))


def _accumulate_sum(acc: torch.Tensor, rows: torch.Tensor, first: bool) -> None:
    s = rows.sum(0, dtype=acc.dtype)
    if first:
        acc.copy_(s)
    else:
        acc.add_(s)


class TiledGatedMLPFunction(torch.autograd.Function):
    """``down(act(gate(x)) * up(x))`` over the rows of ``x`` in shards; saves only ``x`` and
    the parameters. Inputs: x, w_gate, w_up, w_down, b_gate, b_up, b_down (biases may be
    None), activation (one of ``ACTIVATIONS``), num_shards, compute dtype (the dtype the
    products run in), accumulation dtype for half-precision weight gradients (None: the
    weights' dtype)."""

    @staticmethod
    def forward(ctx, x, wg, wu, wd, bg, bu, bd, activation, num_shards, cdt, acc_dtype):
        ctx.activation, ctx.num_shards, ctx.cdt, ctx.acc_dtype = (activation, num_shards, cdt,
                                                                  acc_dtype)
        ctx.has_bias = (bg is not None, bu is not None, bd is not None)
        ctx.save_for_backward(x, wg, wu, wd, bg, bu, bd)
        hidden = x.shape[-1]
        x2 = x.reshape(-1, hidden).to(cdt).contiguous()
        wg_c, wu_c, wd_c = (w.to(cdt) for w in (wg, wu, wd))
        bg_c, bu_c, bd_c = (None if b is None else b.to(cdt) for b in (bg, bu, bd))
        out = x2.new_empty(x2.shape[0], wd.shape[0])
        fused = activation == "swiglu" and bg is None and bu is None
        wd_t = wd_c.t()
        for start, stop in _shards(x2.shape[0], num_shards):
            xs = x2[start:stop]
            if fused:  # one GEMM kernel for both projections and the gate; only z is written
                z = torch.ops.fk._swiglu_linear_forward(xs, wg_c, wu_c, [True, False])[0]
            else:
                z = _gate(activation, F.linear(xs, wg_c, bg_c), F.linear(xs, wu_c, bu_c))
            if bd_c is None:
                torch.mm(z, wd_t, out=out[start:stop])
            else:
                torch.addmm(bd_c, z, wd_t, out=out[start:stop])
            del z
        return out.view(*x.shape[:-1], wd.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        with torch.autocast(grad_out.device.type, enabled=False):
            return TiledGatedMLPFunction._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        x, wg, wu, wd, bg, bu, bd = ctx.saved_tensors
        need = ctx.needs_input_grad
        need_x, need_wg, need_wu, need_wd, need_bg, need_bu, need_bd = need[:7]
        nones = (None,) * 4
        if not any(need[:7]):
            return (None,) * 7 + nones[:4]
        activation, cdt = ctx.activation, ctx.cdt
        hidden = x.shape[-1]
        x2 = x.reshape(-1, hidden).to(cdt).contiguous()
        go = grad_out.reshape(-1, wd.shape[0]).to(cdt).contiguous()
        n = x2.shape[0]
        wg_c, wu_c, wd_c = (w.to(cdt) for w in (wg, wu, wd))
        bg_c, bu_c = (None if b is None else b.to(cdt) for b in (bg, bu))

        def acc_like(w):
            dt = w.dtype
            if ctx.acc_dtype is not None and dt in (torch.bfloat16, torch.float16):
                dt = ctx.acc_dtype
            return torch.empty(w.shape, dtype=dt, device=w.device)

        dwg = acc_like(wg) if need_wg else None
        dwu = acc_like(wu) if need_wu else None
        dwd = acc_like(wd) if need_wd else None
        dbg = acc_like(bg) if need_bg else None
        dbu = acc_like(bu) if need_bu else None
        dx = x2.new_empty(x2.shape) if need_x else None
        need_gate_grads = need_x or need_wg or need_wu or need_bg or need_bu
        fused = activation == "swiglu" and bg is None and bu is None
        shards = _shards(n, ctx.num_shards)
        for i, (start, stop) in enumerate(shards):
            first = i == 0
            xs, gs = x2[start:stop], go[start:stop]
            if fused:
                # z = silu(a) * b, and the factors s = silu(a), t = b * silu'(a)
                z, s, t = torch.ops.fk._swiglu_linear_forward(xs, wg_c, wu_c,
                                                              [True, need_gate_grads])
            else:
                a, b = F.linear(xs, wg_c, bg_c), F.linear(xs, wu_c, bu_c)
                z = _gate(activation, a, b)
            if need_wd:
                _accumulate(dwd, gs.t(), z, first)
            del z
            if not need_gate_grads:
                continue
            dz = torch.mm(gs, wd_c)
            if fused:
                torch.ops.fk._swiglu_linear_gate_grads_(dz, t, s)
                da, db = t, s
            else:
                _gate_grads_in_place(activation, dz, a, b)
                da, db = a, b
            del dz
            if need_x:
                dxs = dx[start:stop]
                torch.mm(da, wg_c, out=dxs)
                dxs.addmm_(db, wu_c)
            if need_wg:
                _accumulate(dwg, da.t(), xs, first)
            if need_wu:
                _accumulate(dwu, db.t(), xs, first)
            if need_bg:
                _accumulate_sum(dbg, da, first)
            if need_bu:
                _accumulate_sum(dbu, db, first)
            del da, db
            if fused:
                del s, t
            else:
                del a, b
        if n == 0:  # no shard ran: the sums are empty
            for g in (dwg, dwu, dwd, dbg, dbu):
                if g is not None:
                    g.zero_()
        dbd = None
        if need_bd:  # over all tokens at once, no shards needed
            half = bd.dtype in (torch.bfloat16, torch.float16)
            dbd = go.sum(0, dtype=torch.float32 if half else bd.dtype).to(bd.dtype)

        def final(g, w):
            return None if g is None else g.to(w.dtype)

        grads = (None if dx is None else dx.view(x.shape).to(x.dtype),
                 final(dwg, wg), final(dwu, wu), final(dwd, wd),
                 final(dbg, bg), final(dbu, bu), dbd)
        return grads + nones


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor, name: str) -> torch.dtype:
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    if x.dtype != weight.dtype:
        raise TypeError(f"{name}: x has dtype {x.dtype} but the weights have {weight.dtype} "
                        "(outside autocast they must match)")
    return x.dtype


def _tiled_gated_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                    w_down: torch.Tensor, b_gate: Optional[torch.Tensor] = None,
                    b_up: Optional[torch.Tensor] = None, b_down: Optional[torch.Tensor] = None,
                    activation: str = "swiglu", num_shards: Optional[int] = None,
                    fp32_grad_accumulation: bool = False) -> torch.Tensor:
    """``down(act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)) @ w_down.T + b_down`` over
    the rows of ``x`` (all leading dims flattened) in ``num_shards`` shards.

    The forward keeps nothing but ``x`` and the parameters; the backward runs each shard's
    forward again and backpropagates it, adding the shard's weight gradients into one
    accumulator per parameter. ``activation``: ``"swiglu"`` (SiLU), ``"geglu_tanh"`` or
    ``"geglu_none"`` (GELU, tanh-approximated or exact). ``num_shards=None``:
    :func:`default_num_shards`. Under autocast the products run in the autocast dtype
    and the result has that dtype; the gradients come back in the parameters' dtypes.
    Runs outside torch.compile's graphs (a graph break): compiled code would re-plan which
    activations to keep.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"fk.nn tiled MLP: activation must be one of {ACTIVATIONS}, "
                         f"got {activation!r}")
    name = "fk.nn tiled MLP"
    if w_gate.dim() != 2 or w_up.shape != w_gate.shape or w_down.dim() != 2 or \
            w_down.shape != (w_gate.shape[1], w_gate.shape[0]):
        raise ValueError(f"{name}: w_gate and w_up must be (intermediate, hidden) and w_down "
                         f"(hidden, intermediate), got {tuple(w_gate.shape)}, "
                         f"{tuple(w_up.shape)}, {tuple(w_down.shape)}")
    if x.dim() < 1 or x.shape[-1] != w_gate.shape[1]:
        raise ValueError(f"{name}: the last dim of x must be the hidden size "
                         f"{w_gate.shape[1]}, got shape {tuple(x.shape)}")
    if num_shards is None:
        num_shards = default_num_shards(x, w_gate.shape[1])
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"{name}: num_shards must be a positive int, got {num_shards!r}")
    cdt = _compute_dtype(x, w_gate, name)
    acc_dtype = torch.float32 if fp32_grad_accumulation else None
    with torch.autocast(x.device.type, enabled=False):
        return TiledGatedMLPFunction.apply(x, w_gate, w_up, w_down, b_gate, b_up, b_down,
                                           activation, num_shards, cdt, acc_dtype)


_DISABLED = None


def _compiler_disabled():
    """``tiled_gated_mlp``: the function above under ``torch.compiler.disable``, made on first
    use (the decorator imports torch._dynamo, a second of ``import fk`` otherwise)."""
    global _DISABLED
    if _DISABLED is None:
        _DISABLED = torch.compiler.disable(_tiled_gated_mlp)
    return _DISABLED


def __getattr__(name: str):
    if name == "tiled_gated_mlp":
        return _compiler_disabled()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _TiledMLP(GatedMLP):
    _activation = "swiglu"

    def __init__(self, hidden_size: int, intermediate_size: int,
                 num_shards: Optional[int] = None, bias: bool = False, device=None,
                 dtype=None, fp32_grad_accumulation: bool = False):
        super().__init__(hidden_size, intermediate_size, bias, device, dtype)
        if num_shards is not None and (not isinstance(num_shards, int) or num_shards < 1):
            raise ValueError(f"num_shards must be None or a positive int, got {num_shards!r}")
        self.num_shards = num_shards
        self.fp32_grad_accumulation = fp32_grad_accumulation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _compiler_disabled()(x, self.gate_proj.weight, self.up_proj.weight,
                               self.down_proj.weight, self.gate_proj.bias, self.up_proj.bias,
                               self.down_proj.bias, self._activation, self.num_shards,
                               self.fp32_grad_accumulation)

    def extra_repr(self) -> str:
        return f"num_shards={self.num_shards}"


class TiledSwiGLUMLP(_TiledMLP):
    """A Llama-style MLP, ``down_proj(silu(gate_proj(x)) * up_proj(x))``, run over the tokens
    in shards so that no intermediate activation outlives its shard.

    Parameter names match Hugging Face's ``LlamaMLP`` (``gate_proj``, ``up_proj``,
    ``down_proj``; ``bias=True`` is its ``mlp_bias``), so its state dict loads as is.

    Memory: the forward keeps only the input (and the parameters); the backward recomputes
    each shard's forward and backpropagates it before the next, so at any time at most
    three ``(shard tokens, intermediate_size)`` tensors exist, against about six of
    ``(tokens, intermediate_size)`` for the untiled MLP. Cost: one more forward's GEMMs
    (about a third more work than forward + backward).

    ``num_shards``: the number of pieces the flattened tokens are split into (as
    ``torch.chunk``: pieces of ``ceil(tokens / num_shards)``); None (default):
    ``ceil(x.shape[-2] / hidden_size)``, Liger / DeepSpeed's rule.

    Kernels: without biases each shard's projections and gate run as one
    :func:`fk.swiglu_linear` GEMM (the forward writes only the gated product; the backward
    also writes the gate's factors and turns them into the gate gradients in place); with
    biases, cuBLAS products and :func:`fk.swiglu`. ``down_proj`` and all backward products
    are cuBLAS GEMMs writing straight into the output / input-gradient rows.

    Weight gradients: each shard's product is added into one accumulator per parameter in
    the GEMM's float32 epilogue. The accumulator has the parameter's dtype: float32
    parameters (also float32 master weights under autocast) accumulate in float32 exactly
    as the untiled backward does; bfloat16 / float16 parameters are rounded once per shard
    (untiled: once), which costs no memory beyond the gradient itself. With
    ``fp32_grad_accumulation=True`` half-precision gradients accumulate in float32 and are
    rounded once at the end (two more bytes per parameter during the backward).

    Under ``torch.compile`` the MLP runs as an eager region (a graph break). Double
    backward is not supported.
    """

    _activation = "swiglu"


class TiledGEGLUMLP(_TiledMLP):
    """A Gemma-style MLP, ``down_proj(gelu(gate_proj(x), approximate) * up_proj(x))``, run
    over the tokens in shards; the GeGLU counterpart of :class:`TiledSwiGLUMLP` (see it for
    memory, ``num_shards``, gradient accumulation and torch.compile). ``approximate``:
    ``"tanh"`` (Gemma's ``gelu_pytorch_tanh``) or ``"none"`` (exact). The gate runs through
    :func:`fk.geglu` between cuBLAS projections."""

    def __init__(self, hidden_size: int, intermediate_size: int,
                 num_shards: Optional[int] = None, approximate: str = "tanh",
                 bias: bool = False, device=None, dtype=None,
                 fp32_grad_accumulation: bool = False):
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be one of ('tanh', 'none'), got {approximate!r}")
        super().__init__(hidden_size, intermediate_size, num_shards, bias, device, dtype,
                         fp32_grad_accumulation)
        self.approximate = approximate
        self._activation = f"geglu_{approximate}"

    def extra_repr(self) -> str:
        return f"num_shards={self.num_shards}, approximate={self.approximate!r}"
