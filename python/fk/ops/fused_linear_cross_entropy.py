"""fk.fused_linear_cross_entropy.

Autograd: a Python Autograd kernel on the public op fk::fused_linear_cross_entropy (a
torch.autograd.Function around the internal op, registered with
``torch.library.Library("fk", "IMPL").impl(..., "Autograd", with_keyset=True)``, as
torch.library.register_autograd does internally). register_autograd cannot express it: the
forward computes the gradients, only those of the inputs that require grad, and the
backward scales them in place only when the graph is not retained. The internal op
fk::_fused_linear_cross_entropy_forward has a fake kernel and no autograd formula.
"""
from typing import Optional, Tuple, Union

import torch

from . import _autocast, _checks as c
from .cross_entropy import (CrossEntropyOutput, ce_output, check_ce_target_and_options,
                            extras_like, losses_like, output_dtype, raise_when_differentiated,
                            scale_stored_grad)

_OP = "fk::fused_linear_cross_entropy"


def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: Optional[torch.Tensor] = None,
                               ce_weight: Optional[torch.Tensor] = None,
                               ignore_index: int = -100, label_smoothing: float = 0.0,
                               reduction: str = "mean", lse_square_scale: float = 0.0,
                               softcap: Optional[float] = None, return_z_loss: bool = False,
                               chunk_size: Optional[int] = None,
                               accum_dtype: Optional[torch.dtype] = None,
                               loss_dtype: Optional[torch.dtype] = None,
                               use_token_scaling: bool = False,
                               return_token_accuracy: bool = False,
                               return_predicted_tokens: bool = False
                               ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor],
                                          CrossEntropyOutput]:
    """The language-model head and its loss in one: ``fk.cross_entropy(x @ weight.T + bias,
    target, ce_weight, ...)`` without ever holding the ``(N, V)`` logits.

    Rows are processed ``chunk_size`` at a time: the chunk's logits (a matmul), their cross
    entropy with the gradient written into the same buffer (fk's cross entropy kernels),
    then ``grad_x`` and ``grad_weight`` / ``grad_bias`` from that gradient (two matmuls, the
    weight's summed over chunks). So the forward computes the gradients (those that are
    needed: only ``x``'s for a frozen head, only the head's for an ``x`` without grad) and
    the backward scales them by ``grad_output`` on the device (nothing for ``loss.backward()``).
    With ``reduction="none"`` each row's ``grad_output`` must weigh its logits' gradient
    before the products sum over rows: the forward then computes the losses only and the
    backward runs the chunks again (one more matmul per chunk).

    Args:
        x: ``(N, H)`` hidden states, float32, bfloat16 or float16 (float64 on CPU).
        weight: ``(V, H)`` head weight (``nn.Linear(H, V).weight``), x's dtype and device.
        target: ``(N,)`` int64 class indices in ``[0, V)`` or ``ignore_index``; any other
            value raises as in :func:`fk.cross_entropy` (a device-side assert on CUDA).
        bias: ``(V,)`` or None.
        ce_weight: ``(V,)`` class weights (torch's ``weight`` of cross entropy), or None.
        ignore_index, label_smoothing, reduction, lse_square_scale, softcap, return_z_loss:
            as in :func:`fk.cross_entropy`.
        chunk_size: rows per chunk. Default: logits of about the size of ``x``, but at least
            1024 rows (fewer make the matmuls slower: every chunk reads and writes all of
            ``grad_weight``); the transient memory is ``chunk_size * V`` elements of x's
            dtype. Pass a smaller value to trade speed for memory.
        accum_dtype: dtype ``grad_weight`` and ``grad_bias`` are summed over chunks in:
            None (the weight's dtype) or ``torch.float32`` (more accurate for bf16 / fp16
            weights; a float32 buffer of the weight's size while the forward runs). On CUDA,
            float32 sums of bf16 / fp16 products cost more than the default: each chunk's
            product goes through a float32 temporary that is then added to the sum (torch's
            stable C ABI cannot call an accumulating matmul with a float32 output), two more
            passes over a float32 ``grad_weight`` per chunk and up to the chunk's logits
            buffer of extra memory.
        loss_dtype: the dtype of the returned losses: None (the default) for ``x``'s dtype,
            as ``F.cross_entropy(F.linear(x, weight, bias), target)`` returns it, or
            ``torch.float32`` (what Liger Kernel's fused linear cross entropy returns) /
            ``float64`` / ``bfloat16`` / ``float16``. Computed in float32 (float64 for
            float64 ``x``) and rounded once; the gradients do not depend on it.
        use_token_scaling: multiply each row's loss (its z-loss and label smoothing terms
            included) by the model's predicted probability of its target,
            ``softmax(logits)[target]`` (of the softcapped logits), taken as a constant in
            the gradient, as Liger Kernel's option of the same name: confident rows weigh
            more. The ``"mean"`` still divides by the (weighted) count of non-ignored rows,
            and a returned z-loss is scaled the same way. fk computes the probability in
            float32 from the kernel's own logsumexp (Liger from a softmax in the logits'
            dtype).
        return_token_accuracy, return_predicted_tokens: as in :func:`fk.cross_entropy`
            (the argmax of each row of ``x @ weight.T + bias``).

    Returns:
        The loss, or ``(loss, z_loss)`` with ``return_z_loss``, in ``loss_dtype``; with
        ``return_token_accuracy`` or ``return_predicted_tokens`` a
        :class:`fk.CrossEntropyOutput`, as :func:`fk.cross_entropy`.
        Differentiable in ``x``, ``weight`` and
        ``bias``; a double backward raises. No host synchronisation.
    """
    out = torch.ops.fk.fused_linear_cross_entropy(
        x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
        lse_square_scale, softcap, chunk_size, accum_dtype, loss_dtype, use_token_scaling,
        return_token_accuracy, return_predicted_tokens)
    return ce_output(*out, return_z_loss, return_token_accuracy, return_predicted_tokens)


# --- checks and fake kernel (csrc/ops/fused_linear_cross_entropy/fused_linear_cross_entropy.cpp
# raises the same messages) -------------------------------------------------------------------

def check_linear_head(op, x, weight, bias, chunk_size, x_name="x", classes="V"):
    """The checks of a chunked linear head's inputs: x (N, H), weight (classes, H), bias
    (classes,), chunk_size (also the vocab-parallel head's, whose x is `hidden`)."""
    c.check(x.dim() == 2, op, ": ", x_name, " must have shape (N, H), got ", c.shape_text(x))
    c.check_pair(op, x_name, x, "weight", weight)
    c.check(weight.dim() == 2 and weight.shape[1] == x.shape[1], op,
            ": weight must have shape (", classes, ", ", x.shape[1], ") to match ", x_name,
            ", got ", c.shape_text(weight))
    c.check(weight.shape[0] >= 1, op, ": weight must have at least one class (row), got shape ",
            c.shape_text(weight))
    if bias is not None:
        c.check_pair(op, x_name, x, "bias", bias)
        c.check(bias.dim() == 1 and bias.shape[0] == weight.shape[0], op,
                ": bias must have shape (", weight.shape[0], ",), got ", c.shape_text(bias))
    c.check(chunk_size is None or chunk_size >= 1, op, ": chunk_size must be positive, got ",
            0 if chunk_size is None else chunk_size)


def check_fused_linear_cross_entropy(x, weight, target, bias, ce_weight, ignore_index,
                                     label_smoothing, reduction, lse_square_scale, softcap,
                                     chunk_size, accum_dtype):
    op = "fk::fused_linear_cross_entropy"
    check_linear_head(op, x, weight, bias, chunk_size)
    c.check(accum_dtype is None or accum_dtype in (torch.float32, weight.dtype), op,
            ": accum_dtype must be None, torch.float32 or the weight's dtype, got ",
            c.dtype_name(torch.float32 if accum_dtype is None else accum_dtype))
    check_ce_target_and_options(op, "x", x, x.shape[0], weight.shape[0], target, ce_weight,
                                "ce_weight", ignore_index, label_smoothing, reduction,
                                lse_square_scale, softcap)


@torch.library.register_fake("fk::_fused_linear_cross_entropy_forward")
def _forward_fake(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
                  lse_square_scale, softcap, chunk_size, accum_dtype, grad_mask, grad_rows,
                  use_token_scaling, extras):
    check_fused_linear_cross_entropy(x, weight, target, bias, ce_weight, ignore_index,
                                     label_smoothing, reduction, lse_square_scale, softcap,
                                     chunk_size, accum_dtype)
    loss, z = losses_like(x, x.shape[0], reduction)
    gx = x.new_empty(x.shape) if grad_mask[0] else None
    gw = weight.new_empty(weight.shape) if grad_mask[1] else None
    gb = bias.new_empty(bias.shape) if grad_mask[2] and bias is not None else None
    return (loss, z, gx, gw, gb) + extras_like(x, x.shape[0], reduction, extras)


# --- autograd --------------------------------------------------------------------------------

class _FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Reductions "mean" and "sum": the forward computes grad_x, grad_weight and grad_bias
    for a grad_output of 1 (only those in grad_mask) and keeps them; the backward scales
    them by grad_output (in place where safe: cross_entropy.scale_stored_grad).

    Reduction "none": each row's grad_output must weigh the logits' gradient before the
    products sum over rows, so the forward keeps x, weight, target (and bias) and the
    backward runs the chunked pass again with grad_output per row."""

    @staticmethod
    def forward(ctx, x, weight, target, bias, ce_weight, ignore_index, label_smoothing,
                reduction, lse_square_scale, softcap, chunk_size, accum_dtype, grad_mask,
                use_token_scaling, extras):
        ctx.set_materialize_grads(False)
        deferred = reduction == "none"
        now = [False, False, False] if deferred else grad_mask
        with torch._C._AutoDispatchBelowAutograd():
            loss, z, gx, gw, gb, acc, pred = torch.ops.fk._fused_linear_cross_entropy_forward(
                x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
                lse_square_scale, softcap, chunk_size, accum_dtype, now, None,
                use_token_scaling, extras)
        ctx.deferred = deferred
        if deferred:
            ctx.save_for_backward(x, weight, target, bias, ce_weight)
            ctx.options = (ignore_index, label_smoothing, lse_square_scale, softcap,
                           chunk_size, accum_dtype, grad_mask, use_token_scaling)
        else:
            ctx.save_for_backward(gx, gw, gb)
        # z_loss is part of loss already and is returned for logging, the token accuracy and
        # predicted tokens are metrics: no gradient through them.
        ctx.mark_non_differentiable(*(t for t in (z, acc, pred) if t is not None))
        return loss, z, acc, pred

    @staticmethod
    def backward(ctx, grad_loss, _grad_z, _grad_acc, _grad_pred):
        out = [None] * 15
        # No grad_output for the loss: only the outputs without a gradient were used.
        if grad_loss is None:
            return tuple(out)
        if ctx.deferred:
            x, weight, target, bias, ce_weight = ctx.saved_tensors
            (ignore_index, ls, lse_square_scale, softcap, chunk_size, accum, mask,
             token_scaling) = ctx.options
            create_graph = torch.is_grad_enabled()
            with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
                _, _, gx, gw, gb, _, _ = torch.ops.fk._fused_linear_cross_entropy_forward(
                    x, weight, target, bias, ce_weight, ignore_index, ls, "none",
                    lse_square_scale, softcap, chunk_size, accum, mask, grad_loss,
                    token_scaling, False)
            if create_graph:
                gx, gw, gb = raise_when_differentiated(_OP, gx, gw, gb)
            out[0], out[1], out[3] = gx, gw, gb
            return tuple(out)
        gx, gw, gb = ctx.saved_tensors
        if gx is not None:
            out[0] = scale_stored_grad(_OP, gx, grad_loss)
        if gw is not None:
            out[1] = scale_stored_grad(_OP, gw, grad_loss)
        if gb is not None:
            out[3] = scale_stored_grad(_OP, gb.unsqueeze(0), grad_loss).squeeze(0)
        return tuple(out)


def _fused_linear_cross_entropy_autograd(keyset, x, weight, target, bias=None, ce_weight=None,
                                         ignore_index=-100, label_smoothing=0.0,
                                         reduction="mean", lse_square_scale=0.0, softcap=None,
                                         chunk_size=None, accum_dtype=None, loss_dtype=None,
                                         use_token_scaling=False, return_token_accuracy=False,
                                         return_predicted_tokens=False):
    # The defaults are the schema's: the dispatcher may leave out arguments equal to them.
    out = output_dtype(_OP, x, loss_dtype)
    extras = return_token_accuracy or return_predicted_tokens
    grad_mode = torch.is_grad_enabled()
    mask = [grad_mode and x.requires_grad, grad_mode and weight.requires_grad,
            grad_mode and bias is not None and bias.requires_grad]
    if not any(mask):
        # No gradient wanted (ce_weight is not differentiated): losses only.
        with torch._C._AutoDispatchBelowAutograd():
            loss, z, _, _, _, acc, pred = torch.ops.fk._fused_linear_cross_entropy_forward(
                x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
                lse_square_scale, softcap, chunk_size, accum_dtype, [False, False, False],
                None, use_token_scaling, extras)
    else:
        loss, z, acc, pred = _FusedLinearCrossEntropyFunction.apply(
            x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
            lse_square_scale, softcap, chunk_size, accum_dtype, mask, use_token_scaling, extras)
    # Rounded once to the output dtype; autograd casts grad_output back to float32.
    return (loss.to(out), z.to(out), acc if return_token_accuracy else None,
            pred if return_predicted_tokens else None)


_lib = torch.library.Library("fk", "IMPL")
_lib.impl("fused_linear_cross_entropy", _fused_linear_cross_entropy_autograd, "Autograd",
          with_keyset=True)

# Under autocast: the head's matmul inputs in the autocast dtype (as F.linear), the loss and
# z-loss in float32 (as F.cross_entropy); ce_weight is left as given.
_autocast.lower_precision("fused_linear_cross_entropy", ("x", "weight", "bias"),
                          float32_outputs=(0, 1),
                          none_defaults={"loss_dtype": torch.float32})
