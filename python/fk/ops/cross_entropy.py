from typing import Optional, Tuple, Union

import torch

REDUCTIONS = ("mean", "sum", "none")


def cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                  weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean",
                  lse_square_scale: float = 0.0, softcap: Optional[float] = None,
                  return_z_loss: bool = False, grad_in_logits: bool = True
                  ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Cross entropy over a vocabulary, with the gradient computed in the forward pass.

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
        target: ``(N,)`` int64 class indices in ``[0, V)`` or ``ignore_index``. A target
            outside that range makes its row's loss and gradient NaN (and a ``"mean"``
            NaN): there is no check that would need the host to wait for the device.
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
            backward if something else overwrites them before it). Pass False to allocate
            a separate gradient buffer and leave ``logits`` untouched. Under
            ``torch.compile`` and other tracing a separate buffer is always used. In
            TorchScript (where this function's return type is a Union) use
            ``fk.nn.CrossEntropyLoss``, which keeps the gradient out of the logits there.

    Returns:
        The float32 loss (float64 for float64 logits): a scalar, or ``(N,)`` for
        ``"none"``; with ``return_z_loss``, ``(loss, z_loss)``. Differentiable in
        ``logits`` (any ``grad_output``, per row for ``"none"``); the gradient is computed
        in float32 and rounded once to ``logits``' dtype, then scaled by ``grad_output``
        in the backward (a second rounding unless ``grad_output`` is 1). No host
        synchronisation: the mean's denominator stays on the device, so the op can be
        captured in a CUDA graph.
    """
    loss, z_loss = torch.ops.fk.cross_entropy(logits, target, weight, ignore_index,
                                              label_smoothing, reduction, lse_square_scale,
                                              softcap, grad_in_logits)
    if return_z_loss:
        return loss, z_loss
    return loss
