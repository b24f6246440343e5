from typing import Optional, Tuple, Union

import torch


def fused_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: Optional[torch.Tensor] = None,
                               ce_weight: Optional[torch.Tensor] = None,
                               ignore_index: int = -100, label_smoothing: float = 0.0,
                               reduction: str = "mean", lse_square_scale: float = 0.0,
                               softcap: Optional[float] = None, return_z_loss: bool = False,
                               chunk_size: Optional[int] = None,
                               accum_dtype: Optional[torch.dtype] = None
                               ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
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
        target: ``(N,)`` int64 class indices or ``ignore_index``.
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
            weights; a float32 buffer of the weight's size while the forward runs).

    Returns:
        The float32 loss, or ``(loss, z_loss)`` with ``return_z_loss``, as
        :func:`fk.cross_entropy` returns them. Differentiable in ``x``, ``weight`` and
        ``bias``. No host synchronisation.
    """
    loss, z_loss = torch.ops.fk.fused_linear_cross_entropy(
        x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
        lse_square_scale, softcap, chunk_size, accum_dtype)
    if return_z_loss:
        return loss, z_loss
    return loss
