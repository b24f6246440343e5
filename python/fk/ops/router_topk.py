"""fk.router_topk: top-k routing of mixture-of-experts router logits. Autograd registered on
fk::router_topk (probs differentiable, the routing map not); its backward calls
fk::_router_topk_backward."""
import math
from typing import Optional, Tuple

import torch

from . import _autograd, _checks as c


def router_topk(logits: torch.Tensor, k: int, score: str = "softmax", pre_softmax: bool = False,
                scaling_factor: float = 1.0, expert_bias: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: which ``k`` experts each token goes to, and with what weight, in one
    kernel over each row of router logits (e.g. from :func:`fk.router_logits`).

    Args:
        logits: ``(..., E)`` router logits, float32 (typical), bfloat16 or float16
            (float64 on CPU). On CUDA ``E`` up to 1024.
        k: experts per token, ``1 <= k <= E``.
        score: ``"softmax"`` or ``"sigmoid"``, in Megatron's ``topk_softmax_with_capacity``
            orders:

            - ``"softmax"``, ``pre_softmax=False``: the ``k`` largest logits are chosen and
              ``probs`` is the softmax over those ``k`` (Mixtral, Qwen-MoE with
              normalized top-k).
            - ``"softmax"``, ``pre_softmax=True``: softmax over all ``E`` first; the ``k``
              largest probabilities are chosen and kept as they are.
            - ``"sigmoid"`` (DeepSeek-V3): ``s = sigmoid(logits)``; the ``k`` largest of
              ``s + expert_bias`` are chosen (the bias steers the choice only);
              ``probs = s / (sum of the chosen s + 1e-20)`` when ``k > 1``, else ``s``.
        pre_softmax: see ``score`` (softmax only).
        scaling_factor: multiplies ``probs`` (DeepSeek-V3's ``routed_scaling_factor``).
        expert_bias: ``(E,)`` float32 per-expert bias of the selection (DeepSeek-V3's
            ``e_score_correction_bias``, auxiliary-loss-free balancing); sigmoid only; no
            gradient.

    Returns:
        ``(probs, routing_map)``, both of ``logits``' shape: ``probs`` float32 (float64 for
        float64 logits), zero off the chosen experts; ``routing_map`` bool, True on the
        chosen experts. ``probs`` is differentiable in ``logits`` (the choice held fixed;
        ``grad_logits`` in ``logits``' dtype). Among equal scores the lower expert index is
        chosen on CUDA (torch.topk's order of ties on the CPU backend); NaN counts as the
        largest score, as torch.topk orders it. All arithmetic in float32.
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.router_topk(logits, k, score, pre_softmax, scaling_factor,
                                        expert_bias)
    return _eager_router_topk(logits, k, score, pre_softmax, scaling_factor, expert_bias)


@torch.jit.unused
def _eager_router_topk(logits, k: int, score: str, pre_softmax: bool, scaling_factor: float,
                       expert_bias: Optional[torch.Tensor]):
    return _router_topk_eager(logits, k, score, pre_softmax, scaling_factor, expert_bias)


# --- checks and fake kernels (csrc/ops/router_topk/router_topk.cpp raises the same messages)

_OP = "fk::router_topk"


def check_router_topk(logits, k, score, pre_softmax, scaling_factor, expert_bias):
    c.check(logits.dim() >= 1, _OP, ": logits must have at least one dimension, got a scalar")
    c.check_float(_OP, "logits", logits)
    e = logits.shape[-1]
    c.check(1 <= k <= e, _OP, ": k must be between 1 and the number of experts (", e,
            "), got ", k)
    c.check(score in ("softmax", "sigmoid"), _OP, ": score must be 'softmax' or 'sigmoid', "
            "got '", score, "'")
    c.check(not pre_softmax or score == "softmax", _OP,
            ": pre_softmax applies to score='softmax' only")
    c.check(math.isfinite(scaling_factor), _OP, ": scaling_factor must be finite, got ",
            "%g" % scaling_factor)
    if expert_bias is not None:
        b = expert_bias
        c.check(score == "sigmoid", _OP, ": expert_bias applies to score='sigmoid' only")
        c.check_same_device(_OP, "logits", logits, "expert_bias", b)
        c.check(b.dtype == torch.float32, _OP, ": expert_bias must have dtype Float, got ",
                c.dtype_name(b.dtype))
        c.check(b.dim() == 1 and b.shape[0] == e, _OP, ": expert_bias must have shape (", e,
                "), got ", c.shape_text(b))


def check_router_topk_backward(grad_probs, logits, routing_map, k, score, pre_softmax,
                               scaling_factor):
    op = "fk::_router_topk_backward"
    check_router_topk(logits, k, score, pre_softmax, scaling_factor, None)
    c.check_same_device(op, "grad_probs", grad_probs, "logits", logits)
    c.check_same_device(op, "routing_map", routing_map, "logits", logits)
    acc = c.acc_dtype(logits)
    c.check(grad_probs.dtype == acc, op, ": grad_probs must have dtype ", c.dtype_name(acc),
            ", got ", c.dtype_name(grad_probs.dtype))
    c.check(routing_map.dtype == torch.bool, op, ": routing_map must have dtype Bool, got ",
            c.dtype_name(routing_map.dtype))
    c.check_same_shape(op, "grad_probs", grad_probs, "logits", logits)
    c.check_same_shape(op, "routing_map", routing_map, "logits", logits)


@torch.library.register_fake("fk::router_topk")
def _router_topk_fake(logits, k, score="softmax", pre_softmax=False, scaling_factor=1.0,
                      expert_bias=None):
    check_router_topk(logits, k, score, pre_softmax, scaling_factor, expert_bias)
    return (logits.new_empty(logits.shape, dtype=c.acc_dtype(logits)),
            logits.new_empty(logits.shape, dtype=torch.bool))


@torch.library.register_fake("fk::_router_topk_backward")
def _router_topk_backward_fake(grad_probs, logits, routing_map, k, score, pre_softmax,
                               scaling_factor):
    check_router_topk_backward(grad_probs, logits, routing_map, k, score, pre_softmax,
                               scaling_factor)
    return logits.new_empty(logits.shape)


# --- autograd: the forward keeps the logits and the routing map ----------------------------

def _setup_context(ctx, inputs, output):
    logits, k, score, pre_softmax, scaling_factor, _bias = inputs
    _probs, routing_map = output
    ctx.save_for_backward(logits, routing_map)
    ctx.options = (k, score, pre_softmax, scaling_factor)
    ctx.mark_non_differentiable(routing_map)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_probs, _grad_map):
    logits, routing_map = ctx.saved_tensors
    if grad_probs is None or not ctx.needs_input_grad[0]:
        return None, None, None, None, None, None
    dl = torch.ops.fk._router_topk_backward(grad_probs, logits, routing_map, *ctx.options)
    return dl, None, None, None, None, None


_router_topk_eager = _autograd.register("fk::router_topk", _backward, _setup_context)
