"""fk.cross_entropy.

Autograd: a Python Autograd kernel on the public op fk::cross_entropy (a
torch.autograd.Function around the internal ops, registered with
``torch.library.Library("fk", "IMPL").impl(..., "Autograd", with_keyset=True)``, as
torch.library.register_autograd does internally). register_autograd cannot express it: the
forward computes the gradient, and writes it into the logits' own memory, only when the
logits require grad and in plain eager execution, and the backward scales it in place only
when the graph is not retained. With defer_grad the forward keeps the logits and each row's
logsumexp instead, and the backward computes the gradient (into the logits' memory under the
same conditions). The internal ops fk::_cross_entropy_forward(_),
fk::_cross_entropy_backward(_), fk::_cross_entropy_deferred_forward and
fk::_cross_entropy_deferred_backward(_) have fake kernels and no autograd formula.
"""
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch._C import DispatchKey
from torch.autograd.graph import increment_version

from . import _autograd, _checks as c
from ._sharding import reduce_partials, replicated_like, rows_sharded

REDUCTIONS = ("mean", "sum", "none")
_OP = "fk::cross_entropy"

# The predicted token of an ignored row (csrc/ops/cross_entropy/cross_entropy.h).
IGNORED_PREDICTION = -100


class CrossEntropyOutput(NamedTuple):
    """What :func:`fk.cross_entropy` and :func:`fk.fused_linear_cross_entropy` return when
    ``return_token_accuracy`` or ``return_predicted_tokens`` is set (the fields of Liger
    Kernel's output of the same name); a field not asked for is None."""
    loss: torch.Tensor
    z_loss: Optional[torch.Tensor] = None
    token_accuracy: Optional[torch.Tensor] = None
    predicted_tokens: Optional[torch.Tensor] = None


def ce_output(loss, z_loss, token_accuracy, predicted_tokens, return_z_loss,
              return_token_accuracy, return_predicted_tokens):
    """The public functions' return value: the loss, ``(loss, z_loss)`` with only
    return_z_loss, a CrossEntropyOutput when an extra output is asked for."""
    if return_token_accuracy or return_predicted_tokens:
        return CrossEntropyOutput(loss, z_loss if return_z_loss else None, token_accuracy,
                                  predicted_tokens)
    if return_z_loss:
        return loss, z_loss
    return loss


def cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                  weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean",
                  lse_square_scale: float = 0.0, softcap: Optional[float] = None,
                  return_z_loss: bool = False, grad_in_logits: bool = True,
                  loss_dtype: Optional[torch.dtype] = None,
                  return_token_accuracy: bool = False, return_predicted_tokens: bool = False,
                  mean_denominator: Optional[Union[torch.Tensor, float]] = None,
                  defer_grad: bool = False
                  ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor],
                             CrossEntropyOutput]:
    """Cross entropy over a vocabulary, with the gradient computed in the forward pass (or,
    with ``defer_grad``, in the backward pass).

    ``torch.nn.functional.cross_entropy(logits, target, weight, ignore_index=...,
    label_smoothing=..., reduction=...)`` (class weights, ignored targets and label
    smoothing with weights as torch defines them; ``"mean"`` divides by the sum of the
    weights of the non-ignored targets), plus:

    - z-loss: ``lse_square_scale * logsumexp(logits_i)**2`` added to each non-ignored row's
      loss (not weighted by the class weights; ``"mean"`` divides it by the number of
      non-ignored rows), as in PaLM and Liger Kernel;
    - softcap: ``logits -> softcap * tanh(logits / softcap)`` before everything else
      (Gemma 2), differentiated through.

    Args:
        logits: ``(N, V)``, float32, bfloat16 or float16 (float64 on CPU). Non-contiguous
            logits are copied once.
        target: ``(N,)`` int64 class indices in ``[0, V)`` or ``ignore_index``. Any other
            value raises: on CPU a RuntimeError naming the value, its row and ``V``; on
            CUDA, without making the host wait, a device-side assert (the error surfaces at
            the next synchronisation as "device-side assert triggered", and the CUDA
            context is unusable afterwards, as with torch's own out-of-range targets).
        weight: ``(V,)`` class weights of any floating dtype (used in float32), or None.
            They get no gradient (as in torch).
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (one loss per row; ignored rows 0).
            A ``"mean"`` whose rows are all ignored is NaN, as in torch.
        return_z_loss: also return the z-loss part, reduced like the loss, for logging
            (it is already included in the loss and carries no gradient of its own).
        grad_in_logits: when ``logits`` requires grad, the forward pass writes the gradient
            into ``logits``' own memory (in ``logits``' dtype, as Liger Kernel does), so no
            second logits-sized buffer is ever allocated; the backward scales it by
            ``grad_output`` in place (nothing to do for the usual ``loss.backward()``).
            **The logits' values are gone after this call**: do not read ``logits`` after
            it (an op that saved them for its own backward raises autograd's "modified by
            an inplace operation" error instead of reading gradients; so does this op's
            backward if something else overwrites them before it). With ``defer_grad`` the
            gradient is written into ``logits``' memory in the backward instead, and the
            logits keep their values until then (the same errors then come from anything
            that reads its saved logits after this op's backward, or from writing into the
            logits before it). Pass False to allocate a separate gradient buffer and leave
            ``logits`` untouched. Under ``torch.compile`` and other tracing a separate
            buffer is always used. In TorchScript (where this function's return type is a
            Union) use ``fk.nn.CrossEntropyLoss``, which keeps the gradient out of the
            logits there.
        loss_dtype: the dtype of the returned loss and z-loss: None (the default) for the
            logits' dtype, as ``torch.nn.functional.cross_entropy`` and Liger Kernel return
            it, or ``torch.float32`` (``float64``, ``bfloat16``, ``float16``). The losses
            are always computed in float32 (float64 for float64 logits) and rounded once to
            this dtype; the gradient does not depend on it.
        mean_denominator: with ``reduction="mean"`` only: the number the sum of the rows'
            losses (and z-losses) is divided by, in place of the (weighted) count of
            non-ignored rows; Hugging Face's ``num_items_in_batch`` (the count over all
            gradient-accumulation steps or ranks). A tensor of one element on ``logits``'
            device (float or integer; no gradient), read on the device (no host
            synchronisation), or a Python number (made a float32 tensor on that device).
            ``cross_entropy(x, t, reduction="mean", mean_denominator=n)`` is
            ``cross_entropy(x, t, reduction="sum") / n`` without the division's pass over
            the gradient in the backward. With no rows, or every row ignored, the loss is 0.
        defer_grad: compute the gradient in the backward pass instead: the forward reads
            the logits once (the losses and each row's logsumexp, kept in float32) and keeps
            the logits as they are; the backward reads them once more and writes the
            gradient times ``grad_output``, rounded once to ``logits``' dtype (into
            ``logits``' memory with ``grad_in_logits``, see there). For a loss that is
            scaled before ``backward()`` (divided for gradient accumulation, weighted,
            scaled by a GradScaler): three passes over the logits instead of four. For the
            plain ``loss.backward()`` the default is faster (two passes). Every other option
            works with it.
        return_token_accuracy: also return the token accuracy (float32, no gradient): for
            ``"mean"`` and ``"sum"`` the fraction of non-ignored rows whose argmax over the
            vocabulary is the target (NaN when every row is ignored, like the mean loss);
            for ``"none"`` one value per row, 1.0 or 0.0 (0.0 for ignored rows), as Liger
            Kernel returns it.
        return_predicted_tokens: also return each row's argmax over the vocabulary
            (``(N,)`` int64, no gradient; -100 for rows whose target is ``ignore_index``).

        The argmax is taken over the logits the loss sees (after the softcap, which keeps
        their order but may round large ones to ties), the first maximal index as
        ``torch.argmax``, from the forward's own pass over each row (on CUDA a variant of
        the kernel that tracks it; no second pass over the logits, no host
        synchronisation). With NaN logits in a row its predicted token is unspecified (its
        loss is NaN).

    Returns:
        The loss in ``loss_dtype``: a scalar, or ``(N,)`` for ``"none"``; with
        ``return_z_loss``, ``(loss, z_loss)``; with ``return_token_accuracy`` or
        ``return_predicted_tokens``, a :class:`CrossEntropyOutput` ``(loss, z_loss,
        token_accuracy, predicted_tokens)`` whose fields not asked for are None.
        Differentiable in
        ``logits`` (any ``grad_output``, per row for ``"none"``); the gradient is computed
        in float32 and rounded once to ``logits``' dtype, then scaled by ``grad_output``
        in the backward (a second rounding unless ``grad_output`` is 1; with
        ``defer_grad`` computed in the backward, times ``grad_output``, and rounded once).
        A double backward raises. No host synchronisation: the mean's denominator stays
        on the device, so the op can be captured in a CUDA graph.
    """
    if mean_denominator is not None and not isinstance(mean_denominator, torch.Tensor):
        # A fill on the device: no host-to-device copy to wait for.
        mean_denominator = torch.full((), float(mean_denominator), dtype=torch.float32,
                                      device=logits.device)
    out = torch.ops.fk.cross_entropy(logits, target, weight, ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap, grad_in_logits,
                                     loss_dtype, return_token_accuracy, return_predicted_tokens,
                                     mean_denominator, defer_grad)
    return ce_output(*out, return_z_loss, return_token_accuracy, return_predicted_tokens)


# --- checks and fake kernels (csrc/ops/cross_entropy/cross_entropy.cpp raises the same
# messages) ---------------------------------------------------------------------------------

def number_text(v: float) -> str:
    """A float as C++'s ostream prints it (6 significant digits, no trailing zeros)."""
    return "%g" % v


def check_ce_target_and_options(op, like_name, like, n, v, target, weight, weight_name,
                                ignore_index, label_smoothing, reduction, lse_square_scale,
                                softcap):
    c.check_same_device(op, like_name, like, "target", target)
    c.check(target.dtype == torch.int64, op, ": target must be int64 (class indices), got ",
            c.dtype_name(target.dtype))
    c.check(target.dim() == 1 and target.shape[0] == n, op, ": target must have shape (", n,
            ",) to match ", like_name, ", got ", c.shape_text(target))
    if weight is not None:
        c.check_same_device(op, like_name, like, weight_name, weight)
        c.check_float(op, weight_name, weight)
        c.check(weight.dim() == 1 and weight.shape[0] == v, op, ": ", weight_name,
                " must have shape (", v, ",) (one per class), got ", c.shape_text(weight))
    c.check(0.0 <= label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], got ",
            number_text(label_smoothing))
    c.check(softcap is None or softcap > 0.0, op, ": softcap must be positive, got ",
            number_text(0.0 if softcap is None else softcap))
    c.check(reduction in REDUCTIONS, op, ": reduction must be one of 'mean', 'sum', 'none', "
            "got '", reduction, "'")


_LOSS_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def output_dtype(op, like, loss_dtype):
    """The dtype the public ops return their losses in (C++ ce_output_dtype)."""
    if loss_dtype is None:
        return like.dtype
    c.check(loss_dtype in _LOSS_DTYPES, op, ": loss_dtype must be None, float32, float64, "
            "bfloat16 or float16, got ", c.dtype_name(loss_dtype))
    return loss_dtype


def check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing, reduction,
                        lse_square_scale, softcap):
    c.check(logits.dim() == 2, op, ": logits must have shape (N, V), got ", c.shape_text(logits))
    c.check_float(op, "logits", logits)
    c.check(logits.shape[1] >= 1, op, ": logits must have at least one class, got shape ",
            c.shape_text(logits))
    check_ce_target_and_options(op, "logits", logits, logits.shape[0], logits.shape[1], target,
                                weight, "weight", ignore_index, label_smoothing, reduction,
                                lse_square_scale, softcap)


_DENOMINATOR_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                       torch.int32)


def check_mean_denominator(op, like, mean_denominator, reduction):
    if mean_denominator is None:
        return
    c.check(reduction == "mean", op, ": mean_denominator is only used with reduction='mean'")
    c.check_same_device(op, "logits", like, "mean_denominator", mean_denominator)
    c.check(mean_denominator.dtype in _DENOMINATOR_DTYPES, op, ": mean_denominator must be "
            "float32, float64, bfloat16, float16, int64 or int32, got ",
            c.dtype_name(mean_denominator.dtype))
    c.check(mean_denominator.numel() == 1, op, ": mean_denominator must have one element, got "
            "shape ", c.shape_text(mean_denominator))


def check_deferred_backward(op, logits, target, weight, lse, den, grad_loss, ignore_index,
                            label_smoothing, lse_square_scale, softcap):
    check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing, "none",
                        lse_square_scale, softcap)
    dtype, n = c.acc_dtype(logits), logits.shape[0]
    c.check_same_device(op, "logits", logits, "lse", lse)
    c.check(lse.dtype == dtype and lse.dim() == 1 and lse.shape[0] == n, op, ": lse must be ",
            c.dtype_name(dtype), " of shape (", n, ",), got ", c.dtype_name(lse.dtype),
            " of shape ", c.shape_text(lse))
    c.check_same_device(op, "logits", logits, "den", den)
    c.check(den.dtype == dtype and den.dim() == 1 and den.shape[0] == 2, op, ": den must be ",
            c.dtype_name(dtype), " of shape (2,), got ", c.dtype_name(den.dtype), " of shape ",
            c.shape_text(den))
    check_cross_entropy_backward(op, logits, grad_loss)


def check_cross_entropy_backward(op, grad, grad_loss):
    c.check(grad.dim() == 2, op, ": grad must have shape (N, V), got ", c.shape_text(grad))
    c.check_float(op, "grad", grad)
    c.check_same_device(op, "grad", grad, "grad_loss", grad_loss)
    loss_dtype = c.acc_dtype(grad)
    c.check(grad_loss.dtype == loss_dtype, op, ": grad_loss must be ", c.dtype_name(loss_dtype),
            ", got ", c.dtype_name(grad_loss.dtype))
    c.check(grad_loss.dim() == 0 or (grad_loss.dim() == 1 and grad_loss.shape[0] == grad.shape[0]),
            op, ": grad_loss must be a scalar or have shape (", grad.shape[0], ",), got ",
            c.shape_text(grad_loss))


def losses_like(like, n, reduction):
    """Fake (loss, z_loss) of n rows: float32 (float64 for float64 `like`), (n,) or scalars."""
    shape = (n,) if reduction == "none" else ()
    dtype = c.acc_dtype(like)
    return like.new_empty(shape, dtype=dtype), like.new_empty(shape, dtype=dtype)


def extras_like(like, n, reduction, extras):
    """Fake (token_accuracy, predicted_tokens) of n rows, (None, None) without extras."""
    if not extras:
        return None, None
    shape = (n,) if reduction == "none" else ()
    return (like.new_empty(shape, dtype=torch.float32),
            like.new_empty((n,), dtype=torch.int64))


@torch.library.register_fake("fk::_cross_entropy_forward")
def _forward_fake(logits, target, weight, ignore_index, label_smoothing, reduction,
                  lse_square_scale, softcap, compute_grad, extras, mean_denominator=None):
    check_cross_entropy("fk::cross_entropy", logits, target, weight, ignore_index,
                        label_smoothing, reduction, lse_square_scale, softcap)
    check_mean_denominator("fk::cross_entropy", logits, mean_denominator, reduction)
    n = logits.shape[0]
    loss, z = losses_like(logits, n, reduction)
    grad = logits.new_empty(logits.shape) if compute_grad else None
    return (loss, z, grad) + extras_like(logits, n, reduction, extras)


@torch.library.register_fake("fk::_cross_entropy_forward_")
def _forward_inplace_fake(logits, target, weight, ignore_index, label_smoothing, reduction,
                          lse_square_scale, softcap, extras, mean_denominator=None):
    op = "fk::_cross_entropy_forward_"
    check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing, reduction,
                        lse_square_scale, softcap)
    check_mean_denominator(op, logits, mean_denominator, reduction)
    n = logits.shape[0]
    return losses_like(logits, n, reduction) + extras_like(logits, n, reduction, extras)


@torch.library.register_fake("fk::_cross_entropy_backward")
def _backward_fake(grad, grad_loss):
    check_cross_entropy_backward("fk::_cross_entropy_backward", grad, grad_loss)
    return grad.new_empty(grad.shape)


@torch.library.register_fake("fk::_cross_entropy_backward_")
def _backward_inplace_fake(grad, grad_loss):
    check_cross_entropy_backward("fk::_cross_entropy_backward_", grad, grad_loss)


@torch.library.register_fake("fk::_cross_entropy_deferred_forward")
def _deferred_forward_fake(logits, target, weight, ignore_index, label_smoothing, reduction,
                           lse_square_scale, softcap, extras, mean_denominator=None):
    check_cross_entropy(_OP, logits, target, weight, ignore_index, label_smoothing, reduction,
                        lse_square_scale, softcap)
    check_mean_denominator(_OP, logits, mean_denominator, reduction)
    n = logits.shape[0]
    dtype = c.acc_dtype(logits)
    return (losses_like(logits, n, reduction) + (logits.new_empty((n,), dtype=dtype),
                                                 logits.new_empty((2,), dtype=dtype))
            + extras_like(logits, n, reduction, extras))


@torch.library.register_fake("fk::_cross_entropy_deferred_backward")
def _deferred_backward_fake(logits, target, weight, lse, den, grad_loss, ignore_index,
                            label_smoothing, lse_square_scale, softcap):
    check_deferred_backward("fk::_cross_entropy_deferred_backward", logits, target, weight, lse,
                            den, grad_loss, ignore_index, label_smoothing, lse_square_scale,
                            softcap)
    return logits.new_empty(logits.shape)


@torch.library.register_fake("fk::_cross_entropy_deferred_backward_")
def _deferred_backward_inplace_fake(logits, target, weight, lse, den, grad_loss, ignore_index,
                                    label_smoothing, lse_square_scale, softcap):
    check_deferred_backward("fk::_cross_entropy_deferred_backward_", logits, target, weight,
                            lse, den, grad_loss, ignore_index, label_smoothing,
                            lse_square_scale, softcap)


# --- autograd (shared with fused_linear_cross_entropy) -------------------------------------

_WRAPPED = (DispatchKey.Python, DispatchKey.Functionalize)


def plain_eager(*tensors: torch.Tensor) -> bool:
    """Plain eager tensors on which fk may write in place: no dispatch mode active, no
    functional / fake / subclass tensors (as under torch.compile or opcheck), strided."""
    if torch._C._len_torch_dispatch_stack() > 0:
        return False
    for t in tensors:
        keys = torch._C._dispatch_keys(t)
        if t.layout != torch.strided or any(keys.has(k) for k in _WRAPPED):
            return False
    return True


def raise_when_differentiated(op: str, *grads):
    """The gradients a backward returns under create_graph, marked so that differentiating
    them raises (python/fk/ops/_autograd.py's guard), even where no grad_output requires
    grad: they depend on a gradient the forward stored, which the internal ops cannot
    differentiate."""
    return _autograd._raising(op, grads)


def grad_in_place_or_new(op: str, dst: torch.Tensor, grad_loss: torch.Tensor, out_of_place,
                         in_place, args: tuple, may_write: bool = True) -> torch.Tensor:
    """The gradient a backward op computes from ``args``: into ``dst``'s own memory by
    ``in_place(*args)`` where that is safe and ``may_write`` (plain eager, the graph not
    retained, no higher-order graph; ``dst``'s version counter is bumped, and a new tensor
    object on the same memory is returned, so a leaf's .grad takes it without a copy), else
    into a new tensor by ``out_of_place(*args)``. Under create_graph the result raises when
    differentiated (an error naming `op`)."""
    if torch.is_grad_enabled():  # create_graph
        with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
            out = out_of_place(*args)
        return raise_when_differentiated(op, out)[0]
    with torch._C._AutoDispatchBelowAutograd():
        if (may_write and not torch._C._autograd._get_current_graph_task_keep_graph()
                and dst.is_contiguous() and plain_eager(dst, grad_loss)):
            in_place(*args)
            increment_version(dst)
            return dst.detach()
        return out_of_place(*args)


def scale_stored_grad(op: str, stored: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """The backward of a gradient the forward computed for a grad_output of 1 (2-D): scaled
    by grad_loss, in place where that is safe (grad_in_place_or_new)."""
    return grad_in_place_or_new(op, stored, grad_loss, torch.ops.fk._cross_entropy_backward,
                                torch.ops.fk._cross_entropy_backward_, (stored, grad_loss))


class _CrossEntropyFunction(torch.autograd.Function):
    """The forward computes the gradient of the loss for a grad_output of 1 and keeps it;
    the backward scales it by grad_output.

    Where the gradient lives: with grad_in_logits in the logits' own memory, in plain eager
    execution only (plain_eager; under torch.compile or opcheck a new buffer is used). The
    logits' version counter is bumped, so anything else that saved them for its backward
    raises autograd's "modified by an inplace operation" error instead of reading
    gradients; the logits are saved as they are, so a later write into them makes this
    backward raise too."""

    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, label_smoothing, reduction,
                lse_square_scale, softcap, grad_in_logits, extras, mean_denominator):
        ctx.set_materialize_grads(False)
        with torch._C._AutoDispatchBelowAutograd():
            if grad_in_logits and plain_eager(logits, target):
                # The gradient goes into the logits, or into the one contiguous copy of them.
                x = logits if logits.is_contiguous() else logits.contiguous()
                loss, z, acc, pred = torch.ops.fk._cross_entropy_forward_(
                    x, target, weight, ignore_index, label_smoothing, reduction,
                    lse_square_scale, softcap, extras, mean_denominator)
                if x is logits:
                    increment_version(logits)
                grad = x
            else:
                loss, z, grad, acc, pred = torch.ops.fk._cross_entropy_forward(
                    logits, target, weight, ignore_index, label_smoothing, reduction,
                    lse_square_scale, softcap, True, extras, mean_denominator)
        ctx.save_for_backward(grad)
        # z_loss is part of loss already and is returned for logging, the token accuracy and
        # predicted tokens are metrics: no gradient through them.
        ctx.mark_non_differentiable(*(t for t in (z, acc, pred) if t is not None))
        return loss, z, acc, pred

    @staticmethod
    def backward(ctx, grad_loss, _grad_z, _grad_acc, _grad_pred):
        # No grad_output for the loss: only the outputs without a gradient were used.
        if grad_loss is None:
            return (None,) * 11
        (grad,) = ctx.saved_tensors
        return (scale_stored_grad(_OP, grad, grad_loss),) + (None,) * 10


class _CrossEntropyDeferredFunction(torch.autograd.Function):
    """defer_grad: the forward computes the losses and each row's logsumexp and keeps the
    logits (unmodified); the backward computes the gradient times grad_output from them in
    one pass.

    Where the gradient goes: with grad_in_logits into the logits' own memory (or the one
    contiguous copy of them), in plain eager execution with the graph not retained and no
    higher-order graph; the logits' version counter is bumped then, so anything that
    saved them and runs its backward later raises autograd's "modified by an inplace
    operation" error instead of reading gradients. Elsewhere a new buffer."""

    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, label_smoothing, reduction,
                lse_square_scale, softcap, grad_in_logits, extras, mean_denominator):
        ctx.set_materialize_grads(False)
        x = logits if logits.is_contiguous() else logits.contiguous()
        with torch._C._AutoDispatchBelowAutograd():
            loss, z, lse, den, acc, pred = torch.ops.fk._cross_entropy_deferred_forward(
                x, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale,
                softcap, extras, mean_denominator)
        ctx.save_for_backward(x, target, weight, lse, den)
        ctx.options = (ignore_index, label_smoothing, lse_square_scale, softcap)
        # x is the caller's tensor: written into only where the caller allowed it.
        ctx.in_logits = grad_in_logits or x is not logits
        ctx.mark_non_differentiable(*(t for t in (z, acc, pred) if t is not None))
        return loss, z, acc, pred

    @staticmethod
    def backward(ctx, grad_loss, _grad_z, _grad_acc, _grad_pred):
        if grad_loss is None:
            return (None,) * 11
        x, target, weight, lse, den = ctx.saved_tensors
        args = (x, target, weight, lse, den, grad_loss) + ctx.options
        grad = grad_in_place_or_new(_OP, x, grad_loss,
                                    torch.ops.fk._cross_entropy_deferred_backward,
                                    torch.ops.fk._cross_entropy_deferred_backward_, args,
                                    ctx.in_logits)
        return (grad,) + (None,) * 10


def _cross_entropy_autograd(keyset, logits, target, weight=None, ignore_index=-100,
                            label_smoothing=0.0, reduction="mean", lse_square_scale=0.0,
                            softcap=None, grad_in_logits=True, loss_dtype=None,
                            return_token_accuracy=False, return_predicted_tokens=False,
                            mean_denominator=None, defer_grad=False):
    # The defaults are the schema's: the dispatcher may leave out arguments equal to them.
    out = output_dtype(_OP, logits, loss_dtype)
    check_mean_denominator(_OP, logits, mean_denominator, reduction)
    extras = return_token_accuracy or return_predicted_tokens
    if reduction == "mean" and weight is None and rows_sharded(logits):
        # Rows spread over ranks (a DTensor): the sum over all of them (a Partial DTensor)
        # divided by the number of non-ignored rows over all ranks (or mean_denominator);
        # each rank's own mean would weigh its rows by its own count. Returned replicated,
        # as a mean is used. (With class weights it is computed on replicated rows.)
        if extras:
            raise NotImplementedError(
                "fk::cross_entropy: return_token_accuracy / return_predicted_tokens with "
                "reduction='mean' over rows sharded across ranks (a DTensor) are not "
                "supported; use reduction='none' there")
        loss, z, _, _ = torch.ops.fk.cross_entropy(
            logits, target, None, ignore_index, label_smoothing, "sum", lse_square_scale,
            softcap, grad_in_logits, torch.float32, defer_grad=defer_grad)
        if mean_denominator is not None:
            count = replicated_like(mean_denominator, loss)
        else:
            count = (target != ignore_index).sum()
        return (reduce_partials(loss / count).to(out), reduce_partials(z / count).to(out),
                None, None)
    if not (torch.is_grad_enabled() and logits.requires_grad):
        # No gradient wanted (class weights are not differentiated, as in torch): losses only.
        with torch._C._AutoDispatchBelowAutograd():
            loss, z, _, acc, pred = torch.ops.fk._cross_entropy_forward(
                logits, target, weight, ignore_index, label_smoothing, reduction,
                lse_square_scale, softcap, False, extras, mean_denominator)
    else:
        fn = _CrossEntropyDeferredFunction if defer_grad else _CrossEntropyFunction
        loss, z, acc, pred = fn.apply(
            logits, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale,
            softcap, grad_in_logits, extras, mean_denominator)
    # Rounded once to the output dtype; autograd casts grad_output back to float32.
    return (loss.to(out), z.to(out), acc if return_token_accuracy else None,
            pred if return_predicted_tokens else None)


_lib = torch.library.Library("fk", "IMPL")
_lib.impl("cross_entropy", _cross_entropy_autograd, "Autograd", with_keyset=True)
