"""fk.router_logits: the mixture-of-experts router's logits in float32. Autograd registered
on fk::router_logits; its backward calls fk::_router_logits_backward."""
from typing import Optional

import torch

from . import _autocast, _autograd, _checks as c


def router_logits(x: torch.Tensor, weight: torch.Tensor,
                  weight_grad_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Router logits ``x @ weight.T`` in float32, with float32 accumulation, from 16-bit
    inputs (Megatron's ``moe_router_dtype="fp32"``; many experts make the softmax / top-k
    of bfloat16 logits unstable).

    Unlike ``F.linear(x.float(), weight.float())`` no float32 copy of ``x`` or ``weight``
    is made: on CUDA one GEMM kernel reads the 16-bit operands and writes float32.

    Args:
        x: ``(..., H)`` hidden states, float32, bfloat16 or float16 (float64 on CPU).
        weight: ``(E, H)`` router weight (``nn.Linear``'s layout, no bias), of ``x``'s
            dtype and device. Any ``E`` (8 .. 512 experts and beyond, not only powers of
            two) and any ``H``; on CUDA the fast (16-byte load) kernels need ``H`` and
            ``E`` multiples of 16 and 16-byte aligned tensors, other shapes run masked
            kernels of the same tiles.
        weight_grad_dtype: dtype of the weight's gradient: ``None`` (the weight's dtype,
            the float32 product rounded once, as torch's autograd casts every gradient to
            its input's dtype) or ``torch.float32``: then the backward op
            (``torch.ops.fk._router_logits_backward``) returns it unrounded, for callers
            that accumulate into a float32 main gradient (Megatron's ``main_grad``) and
            under torch.compile, where a float32 weight cast to 16 bits inside the graph
            (autocast) receives it as is; on a 16-bit leaf weight, autograd's cast still
            rounds ``weight.grad`` to the weight's dtype.

    Returns:
        ``(..., E)`` float32 logits (float64 for float64 inputs), contiguous.
        Differentiable in ``x`` and ``weight``: ``grad_x = grad_logits @ weight`` in ``x``'s
        dtype and ``grad_weight = grad_logits.T @ x`` (see ``weight_grad_dtype``), each from
        the float32 ``grad_logits`` with float32 accumulation (on CUDA: bfloat16 operands
        through a two-term bfloat16 split of ``grad_logits``, relative error about
        ``1e-5``; float16 and float32 through three TF32 products). The weight gradient is
        reduced over the tokens in a fixed order (deterministic). Non-contiguous inputs are
        copied to contiguous memory first.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.router_logits(x, weight, weight_grad_dtype)
    return _eager_router_logits(x, weight, weight_grad_dtype)


@torch.jit.unused
def _eager_router_logits(x, weight, weight_grad_dtype: Optional[torch.dtype]):
    if torch._C._is_any_autocast_enabled():  # the operator carries the autocast rule
        return torch.ops.fk.router_logits(x, weight, weight_grad_dtype)
    return _router_logits_eager(x, weight, weight_grad_dtype)


# --- checks and fake kernels (csrc/ops/router_logits/router_logits.cpp raises the same
# messages) ---------------------------------------------------------------------------------

_OP = "fk::router_logits"


def check_router_logits(x, weight, weight_grad_dtype):
    c.check(x.dim() >= 1, _OP, ": x must have at least one dimension, got a scalar")
    c.check_pair(_OP, "x", x, "weight", weight)
    c.check(weight.dim() == 2 and weight.shape[1] == x.shape[-1], _OP,
            ": weight must have shape (E, ", x.shape[-1], ") to match the last dim of x, got ",
            c.shape_text(weight))
    if weight_grad_dtype is not None:
        c.check(weight_grad_dtype in (torch.float32, weight.dtype), _OP,
                ": weight_grad_dtype must be float32 or the weight's dtype (",
                c.dtype_name(weight.dtype), "), got ", c.dtype_name(weight_grad_dtype))


def check_router_logits_backward(grad_logits, x, weight, weight_grad_dtype):
    op = "fk::_router_logits_backward"
    check_router_logits(x, weight, weight_grad_dtype)
    c.check_same_device(op, "grad_logits", grad_logits, "x", x)
    acc = c.acc_dtype(x)
    c.check(grad_logits.dtype == acc, op, ": grad_logits must have dtype ", c.dtype_name(acc),
            ", got ", c.dtype_name(grad_logits.dtype))
    want = (*x.shape[:-1], weight.shape[0])
    c.check(tuple(grad_logits.shape) == want, op, ": grad_logits must have shape [",
            ", ".join(str(s) for s in want), "], got ", c.shape_text(grad_logits))


def _weight_grad_dtype(weight, weight_grad_dtype):
    return weight_grad_dtype if weight_grad_dtype is not None else weight.dtype


@torch.library.register_fake("fk::router_logits")
def _router_logits_fake(x, weight, weight_grad_dtype=None):
    check_router_logits(x, weight, weight_grad_dtype)
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=c.acc_dtype(x))


@torch.library.register_fake("fk::_router_logits_backward")
def _router_logits_backward_fake(grad_logits, x, weight, output_mask, weight_grad_dtype=None):
    check_router_logits_backward(grad_logits, x, weight, weight_grad_dtype)
    dx = x.new_empty(x.shape) if output_mask[0] else None
    dw = (weight.new_empty(weight.shape, dtype=_weight_grad_dtype(weight, weight_grad_dtype))
          if output_mask[1] else None)
    return dx, dw


# --- autograd: the forward keeps x and the weight -----------------------------------------

def _setup_context(ctx, inputs, output):
    x, weight, weight_grad_dtype = inputs
    ctx.save_for_backward(x, weight)
    ctx.weight_grad_dtype = weight_grad_dtype


def _backward(ctx, grad_logits):
    x, weight = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[:2]
    if not (need_x or need_w):
        return None, None, None
    dx, dw = torch.ops.fk._router_logits_backward(grad_logits, x, weight, [need_x, need_w],
                                                  ctx.weight_grad_dtype)
    return dx, dw, None


_router_logits_eager = _autograd.register("fk::router_logits", _backward, _setup_context)

# Under autocast: x and the weight in the autocast dtype (as the F.linear it replaces); the
# logits are float32 either way.
_autocast.lower_precision("router_logits", ("x", "weight"))
