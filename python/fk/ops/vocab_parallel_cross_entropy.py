"""fk.vocab_parallel_cross_entropy and fk.vocab_parallel_fused_linear_cross_entropy: cross
entropy over a vocabulary split across the ranks of a torch.distributed process group
(Megatron's layout: rank r of W holds the classes [r * V_loc, (r + 1) * V_loc) of V = W *
V_loc; the targets are global class ids, the same on every rank).

The kernels (fk::_vocab_parallel_cross_entropy_stats / _loss(_), CPU and CUDA) are local;
the communication is here, with torch.distributed, between them:

1. stats: per row of this rank's shard, six float32 values (local max, sum of exp relative
   to it, the target's logit and class weight if the target is in this shard, and for label
   smoothing the sums of w_j x_j and w_j): a (6, N) tensor;
2. one all_gather_into_tensor of those stats (6 * N floats per rank, nothing logits-sized)
   into (W, 6, N). Gathering, rather than all-reducing a max and then a sum of exps, takes
   one collective instead of two and lets every rank combine each row as log-sum-exp over
   the ranks' (max, sum) pairs in rank order: the same bits on every rank and no overflow;
3. loss: each rank combines the stats of every rank per row and writes the row's loss (the
   same on every rank) and the gradient of its shard, into the shard's own memory where
   allowed (as fk.cross_entropy does). The backward needs no communication: it scales the
   stored gradient by grad_output (fk::_cross_entropy_backward(_)).

No host synchronisation. Autograd: torch.autograd.Function around the internal ops (which
have fake kernels); torch.compile(fullgraph=True) traces fk.vocab_parallel_cross_entropy,
its all-gather included (Dynamo turns it into a functional collective), and then keeps the
gradient in a separate buffer. The fused linear head is for eager mode.
"""
import contextlib
from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.autograd.graph import increment_version

from . import _checks as c
from .cross_entropy import (REDUCTIONS, check_ce_target_and_options, output_dtype,
                            plain_eager, raise_when_differentiated, scale_stored_grad)
from .fused_linear_cross_entropy import check_linear_head

_OP = "fk::vocab_parallel_cross_entropy"
_FLCE_OP = "fk::vocab_parallel_fused_linear_cross_entropy"
NSTATS = 6


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group=None,
                                 weight: Optional[torch.Tensor] = None,
                                 ignore_index: int = -100, label_smoothing: float = 0.0,
                                 reduction: str = "mean", lse_square_scale: float = 0.0,
                                 softcap: Optional[float] = None, return_z_loss: bool = False,
                                 grad_in_logits: bool = True,
                                 loss_dtype: Optional[torch.dtype] = None
                                 ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`fk.cross_entropy` of logits whose vocabulary is split across the ranks of
    ``group`` (tensor / vocabulary parallelism, as Megatron-LM's
    ``vocab_parallel_cross_entropy``), without gathering the logits.

    Every rank of ``group`` calls it with its own shard and the same targets, and gets the
    loss of the whole vocabulary (the same value on every rank) and the gradient of its
    own shard. The ranks exchange ``6 * N`` float32 values (one all-gather); the backward
    communicates nothing.

    Args:
        logits: ``(N, V_loc)``, this rank's classes ``[rank * V_loc, (rank + 1) * V_loc)``
            of ``V = world_size * V_loc``; float32, bfloat16 or float16 (float64 on CPU).
        target: ``(N,)`` int64 global class ids in ``[0, V)`` or ``ignore_index``, the same
            on every rank. Any other value raises as in :func:`fk.cross_entropy` (on CUDA
            through a device-side assert).
        group: the process group over which the vocabulary is split (None: the default
            group, or no communication at all when torch.distributed is not initialized:
            then this is :func:`fk.cross_entropy`).
        weight: ``(V_loc,)`` this rank's slice of the class weights, or None.
        ignore_index, label_smoothing, reduction, lse_square_scale, softcap, return_z_loss,
        grad_in_logits, loss_dtype: as in :func:`fk.cross_entropy` (the smoothing spreads
            over all V classes; with ``grad_in_logits`` the gradient of the shard is written
            into ``logits``' memory, whose values are then gone).

    Returns:
        The loss in ``loss_dtype`` (a scalar, or ``(N,)`` for ``"none"``), or ``(loss,
        z_loss)`` with ``return_z_loss``; differentiable in ``logits``.
    """
    rank, world = group_rank_and_size(group)
    c.check(reduction in REDUCTIONS, _OP, ": reduction must be one of 'mean', 'sum', 'none', "
            "got '", reduction, "'")
    out = output_dtype(_OP, logits, loss_dtype)
    opts = (ignore_index, label_smoothing, lse_square_scale, softcap)
    if torch.is_grad_enabled() and logits.requires_grad:
        loss, z = _VocabParallelCrossEntropyFunction.apply(logits, target, weight, group, rank,
                                                           world, reduction, opts,
                                                           grad_in_logits)
    else:
        loss, z, _ = _forward(logits, target, weight, group, rank, world, reduction, opts,
                              "none")
    loss, z = loss.to(out), z.to(out)
    return (loss, z) if return_z_loss else loss


# --- communication and the forward ------------------------------------------------------

def group_rank_and_size(group):
    """(rank, world size) of this process in `group`; (0, 1) without torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        c.check(group is None, _OP, ": a process group was given but torch.distributed is "
                "not initialized")
        return 0, 1
    rank = dist.get_rank(group)
    c.check(rank >= 0, _OP, ": this process is not a member of the process group")
    return rank, dist.get_world_size(group)


def gather_stats(stats: torch.Tensor, group, world: int) -> torch.Tensor:
    """(6, N) stats of every rank -> (world, 6, N), in rank order (one all-gather)."""
    if world == 1:
        return stats.unsqueeze(0)
    out = stats.new_empty((world * stats.shape[0], stats.shape[1]))
    if stats.numel() > 0:  # N is the same on every rank (the targets are)
        dist.all_gather_into_tensor(out, stats.contiguous(), group=group)
    return out.view(world, stats.shape[0], stats.shape[1])


def denominators(gathered, target, ignore_index, reduction):
    """(D_w, D_n) for a mean: the sum of the targets' class weights (stats row 3, 0 on every
    rank but the target's and on ignored rows) and the count of non-ignored rows; else
    ones."""
    if reduction != "mean":
        return gathered.new_ones(2)
    count = (target != ignore_index).sum().to(gathered.dtype)
    return torch.stack([gathered[:, 3].sum(), count])


def _reduce(loss_rows, z_rows, reduction):
    if reduction == "none":
        return loss_rows, z_rows
    if reduction == "mean" and loss_rows.numel() == 0:  # torch: the mean of nothing is NaN
        nan = loss_rows.new_full((), float("nan"))
        return nan, nan.clone()
    return loss_rows.sum(), z_rows.sum()


def _forward(logits, target, weight, group, rank, world, reduction, opts, grad, scale=None):
    """(loss, z_loss, gradient or None). grad: "none", "separate" (a new buffer) or
    "inplace" (into logits, contiguous)."""
    ignore_index, ls, s, cap = opts
    n, v = logits.shape[0], logits.shape[-1]
    start, size = rank * v, world * v
    stats = torch.ops.fk._vocab_parallel_cross_entropy_stats(logits, target, weight, start,
                                                             size, ignore_index, ls, cap)
    gathered = gather_stats(stats, group, world)
    den = denominators(gathered, target, ignore_index, reduction)
    if grad == "inplace":
        loss_rows, z_rows = torch.ops.fk._vocab_parallel_cross_entropy_loss_(
            logits, target, weight, gathered, den, scale, start, size, ignore_index, ls, s, cap)
        g = logits
    else:
        loss_rows, z_rows, g = torch.ops.fk._vocab_parallel_cross_entropy_loss(
            logits, target, weight, gathered, den, scale, start, size, ignore_index, ls, s, cap,
            grad == "separate")
    loss, z = _reduce(loss_rows, z_rows, reduction)
    return loss, z, g


def _below_autograd():
    """Eager: skip the autograd dispatch of the internal ops (they have no formula); under
    torch.compile's tracing (which cannot enter that guard) a plain call."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return torch._C._AutoDispatchBelowAutograd()


def _scale(op, grad, grad_loss):
    """The stored gradient times grad_output: in place where safe in eager mode
    (cross_entropy.scale_stored_grad), into a new tensor under torch.compile's tracing."""
    if torch.compiler.is_compiling():
        return torch.ops.fk._cross_entropy_backward(grad, grad_loss)
    return scale_stored_grad(op, grad, grad_loss)


class _VocabParallelCrossEntropyFunction(torch.autograd.Function):
    """The forward computes the shard's gradient for a grad_output of 1 (into the logits'
    memory with grad_in_logits in plain eager execution, as fk.cross_entropy); the backward
    scales it by grad_output, with no communication."""

    @staticmethod
    def forward(ctx, logits, target, weight, group, rank, world, reduction, opts,
                grad_in_logits):
        ctx.set_materialize_grads(False)
        with _below_autograd():
            if (grad_in_logits and not torch.compiler.is_compiling()
                    and plain_eager(logits, target)):
                x = logits if logits.is_contiguous() else logits.contiguous()
                loss, z, grad = _forward(x, target, weight, group, rank, world, reduction, opts,
                                         "inplace")
                if x is logits:
                    increment_version(logits)
            else:
                loss, z, grad = _forward(logits, target, weight, group, rank, world,
                                         reduction, opts, "separate")
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        if grad_loss is None:
            return (None,) * 9
        (grad,) = ctx.saved_tensors
        return (_scale(_OP, grad, grad_loss),) + (None,) * 8


# --- checks and fake kernels (csrc/ops/vocab_parallel_cross_entropy/ raises the same
# messages) -------------------------------------------------------------------------------

def check_vocab_parallel_cross_entropy(op, logits, target, weight, vocab_start, vocab_size,
                                       ignore_index, label_smoothing, softcap):
    c.check(logits.dim() == 2, op, ": logits must have shape (N, V_local), got ",
            c.shape_text(logits))
    c.check_float(op, "logits", logits)
    v = logits.shape[1]
    c.check(v >= 1, op, ": logits must have at least one class, got shape ",
            c.shape_text(logits))
    check_ce_target_and_options(op, "logits", logits, logits.shape[0], v, target, None,
                                "weight", ignore_index, label_smoothing, "sum", 0.0, softcap)
    if weight is not None:
        c.check_same_device(op, "logits", logits, "weight", weight)
        c.check_float(op, "weight", weight)
        c.check(weight.dim() == 1 and weight.shape[0] == v, op, ": weight must have shape (",
                v, ",) (this shard's class weights), got ", c.shape_text(weight))
    c.check(vocab_start >= 0 and vocab_start + v <= vocab_size, op, ": the shard's classes [",
            vocab_start, ", ", vocab_start + v, ") must lie in [0, vocab_size) = [0, ",
            vocab_size, ")")


def check_vocab_parallel_stats(op, logits, stats, den, grad_scale):
    dtype = c.acc_dtype(logits)
    n = logits.shape[0]
    c.check_same_device(op, "logits", logits, "stats", stats)
    c.check(stats.dtype == dtype, op, ": stats must be ", c.dtype_name(dtype), ", got ",
            c.dtype_name(stats.dtype))
    c.check(stats.dim() == 3 and stats.shape[0] >= 1 and stats.shape[1] == NSTATS
            and stats.shape[2] == n, op, ": stats must have shape (world, ", NSTATS, ", ", n,
            "), got ", c.shape_text(stats))
    c.check_same_device(op, "logits", logits, "den", den)
    c.check(den.dtype == dtype and den.dim() == 1 and den.shape[0] == 2, op,
            ": den must be a (2,) tensor of ", c.dtype_name(dtype), ", got ",
            c.dtype_name(den.dtype), " ", c.shape_text(den))
    if grad_scale is not None:
        c.check_same_device(op, "logits", logits, "grad_scale", grad_scale)
        c.check(grad_scale.dtype == dtype, op, ": grad_scale must be ", c.dtype_name(dtype),
                ", got ", c.dtype_name(grad_scale.dtype))
        c.check(grad_scale.dim() == 0 or (grad_scale.dim() == 1 and grad_scale.shape[0] == n),
                op, ": grad_scale must be a scalar or have shape (", n, ",), got ",
                c.shape_text(grad_scale))


@torch.library.register_fake("fk::_vocab_parallel_cross_entropy_stats")
def _stats_fake(logits, target, weight, vocab_start, vocab_size, ignore_index, label_smoothing,
                softcap):
    check_vocab_parallel_cross_entropy(_OP, logits, target, weight, vocab_start, vocab_size,
                                       ignore_index, label_smoothing, softcap)
    return logits.new_empty((NSTATS, logits.shape[0]), dtype=c.acc_dtype(logits))


@torch.library.register_fake("fk::_vocab_parallel_cross_entropy_loss")
def _loss_fake(logits, target, weight, stats, den, grad_scale, vocab_start, vocab_size,
               ignore_index, label_smoothing, lse_square_scale, softcap, compute_grad):
    check_vocab_parallel_cross_entropy(_OP, logits, target, weight, vocab_start, vocab_size,
                                       ignore_index, label_smoothing, softcap)
    check_vocab_parallel_stats(_OP, logits, stats, den, grad_scale)
    n, dtype = logits.shape[0], c.acc_dtype(logits)
    grad = logits.new_empty(logits.shape) if compute_grad else None
    return logits.new_empty((n,), dtype=dtype), logits.new_empty((n,), dtype=dtype), grad


@torch.library.register_fake("fk::_vocab_parallel_cross_entropy_loss_")
def _loss_inplace_fake(logits, target, weight, stats, den, grad_scale, vocab_start, vocab_size,
                       ignore_index, label_smoothing, lse_square_scale, softcap):
    op = "fk::_vocab_parallel_cross_entropy_loss_"
    check_vocab_parallel_cross_entropy(op, logits, target, weight, vocab_start, vocab_size,
                                       ignore_index, label_smoothing, softcap)
    check_vocab_parallel_stats(op, logits, stats, den, grad_scale)
    n, dtype = logits.shape[0], c.acc_dtype(logits)
    return logits.new_empty((n,), dtype=dtype), logits.new_empty((n,), dtype=dtype)


# --- the vocabulary-parallel language-model head ------------------------------------------

def vocab_parallel_fused_linear_cross_entropy(
        hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, group=None,
        bias: Optional[torch.Tensor] = None, ce_weight: Optional[torch.Tensor] = None,
        ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
        lse_square_scale: float = 0.0, softcap: Optional[float] = None,
        return_z_loss: bool = False, chunk_size: Optional[int] = None,
        loss_dtype: Optional[torch.dtype] = None
        ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """:func:`fk.fused_linear_cross_entropy` for a column-parallel head: each rank of
    ``group`` holds the rows ``[rank * V_loc, (rank + 1) * V_loc)`` of the ``(V, H)`` head
    weight and computes the loss of the whole vocabulary without ever holding logits wider
    than its shard or longer than a chunk.

    Per chunk of rows: the shard's logits ``hidden_c @ weight.T (+ bias)`` into one reused
    buffer, the vocabulary-parallel cross entropy kernels (one all-gather of 6 floats per
    row and rank) writing the loss and the logits' gradient into that buffer, then this
    rank's part of ``grad_hidden`` and its ``grad_weight`` / ``grad_bias``; after the last
    chunk one all-reduce (sum) of ``grad_hidden`` over the group. The gradients are computed
    in the forward for a grad_output of 1 and scaled in the backward (no communication
    there), except for ``reduction="none"``, where the backward runs the chunks again with
    each row's grad_output (the stats saved by the forward: no all-gather, one all-reduce).

    Args:
        hidden: ``(N, H)`` the head's input, the same on every rank; float32, bfloat16 or
            float16 (float64 on CPU).
        weight: ``(V_loc, H)`` this rank's rows of the head weight, hidden's dtype.
        target: ``(N,)`` int64 global class ids in ``[0, V)`` or ``ignore_index``, the same
            on every rank (other values raise, as in :func:`fk.cross_entropy`).
        group: as in :func:`fk.vocab_parallel_cross_entropy`.
        bias: ``(V_loc,)`` this rank's slice of the head bias, or None.
        ce_weight: ``(V_loc,)`` this rank's slice of the class weights, or None.
        ignore_index, label_smoothing, reduction, lse_square_scale, softcap, return_z_loss,
        loss_dtype: as in :func:`fk.cross_entropy`.
        chunk_size: rows per chunk (default: logits of about the size of ``hidden``, at
            least 1024 rows, as :func:`fk.fused_linear_cross_entropy` chooses with V_loc).

    Returns:
        The loss (the same on every rank), or ``(loss, z_loss)``; differentiable in
        ``hidden``, ``weight`` and ``bias``. ``grad_weight`` is summed over chunks in the
        weight's dtype.
    """
    op = _FLCE_OP
    rank, world = group_rank_and_size(group)
    check_linear_head(op, hidden, weight, bias, chunk_size, x_name="hidden", classes="V_local")
    c.check(reduction in REDUCTIONS, op, ": reduction must be one of 'mean', 'sum', 'none', "
            "got '", reduction, "'")
    out = output_dtype(op, hidden, loss_dtype)
    opts = (ignore_index, label_smoothing, lse_square_scale, softcap)
    grad_mode = torch.is_grad_enabled()
    mask = (grad_mode and hidden.requires_grad, grad_mode and weight.requires_grad,
            grad_mode and bias is not None and bias.requires_grad)
    if any(mask):
        loss, z = _VocabParallelLinearFunction.apply(hidden, weight, target, bias, ce_weight,
                                                     group, rank, world, reduction, opts,
                                                     chunk_size, mask)
    else:
        loss, z, *_ = _flce_pass(hidden, weight, target, bias, ce_weight, group, rank, world,
                                 reduction, opts, chunk_size, (False, False, False))
    loss, z = loss.to(out), z.to(out)
    return (loss, z) if return_z_loss else loss


def flce_chunk_rows(n, h, v, chunk_size):
    """csrc/ops/fused_linear_cross_entropy's rule (there kFlceMinChunkRows = 1024)."""
    if chunk_size is not None:
        return max(1, min(chunk_size, n))
    return max(1, min(max(n * h // max(v, 1), 1024) // 128 * 128, n))


def _check_targets(op, target, vocab_size, ignore_index):
    """The out-of-range check of fk.cross_entropy over all rows at once (its messages: on
    CPU naming the first bad target and its row; on CUDA a device-side assert, no host
    synchronisation)."""
    if target.numel() == 0:
        return
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab_size))
    if target.device.type == "cpu":
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            c.fail(f"{op}: target {int(target[i])} (row {i}) is out of range: each target "
                   f"must be in [0, {vocab_size}) (V = {vocab_size}) or ignore_index "
                   f"({ignore_index})")
        return
    torch._assert_async(~bad.any(), f"{op}: a target is out of range: each target must be "
                        f"in [0, {vocab_size}) (V = {vocab_size}) or ignore_index "
                        f"({ignore_index})")


def _flce_denominators(target, ce_weight, rank, v, group, world, ignore_index, reduction,
                       dtype):
    """(D_w, D_n) over all rows, before the chunks: with class weights, the sum of the
    targets' weights is one all-reduce of this rank's part."""
    if reduction != "mean":
        return torch.ones(2, dtype=dtype, device=target.device)
    keep = target != ignore_index
    count = keep.sum().to(dtype)
    if ce_weight is None:
        return torch.stack([count, count])
    local = target - rank * v
    here = keep & (local >= 0) & (local < v)
    w = ce_weight.to(dtype)[torch.where(here, local, 0)]
    dw = torch.where(here, w, 0).sum()
    if world > 1:
        dist.all_reduce(dw, group=group)
    return torch.stack([dw, count])


def _flce_pass(hidden, weight, target, bias, ce_weight, group, rank, world, reduction, opts,
               chunk_size, mask, grad_rows=None, saved_stats=None, den=None):
    """The chunked pass. Returns (loss, z, grad_hidden, grad_weight, grad_bias, stats, den):
    the gradients where mask asks (for a grad_output of 1, or grad_rows per row); stats
    (world, 6, N) of every row, gathered (or saved_stats, then no all-gather)."""
    ignore_index, ls, s, cap = opts
    n, h = hidden.shape
    v = weight.shape[0]
    start, size = rank * v, world * v
    dtype = c.acc_dtype(hidden)
    need_x, need_w, need_b = mask[0], mask[1], mask[2] and bias is not None
    any_grad = need_x or need_w or need_b
    if saved_stats is None:
        _check_targets(_FLCE_OP, target, size, ignore_index)
        den = _flce_denominators(target, ce_weight, rank, v, group, world, ignore_index,
                                 reduction, dtype)
    x = hidden.contiguous()
    wc = weight.contiguous()
    loss_rows = hidden.new_empty((n,), dtype=dtype)
    z_rows = hidden.new_empty((n,), dtype=dtype)
    all_stats = saved_stats if saved_stats is not None else hidden.new_empty(
        (world, NSTATS, n), dtype=dtype)
    gx = hidden.new_empty((n, h)) if need_x else None
    gw = torch.zeros_like(weight) if need_w else None
    gb = torch.zeros_like(bias) if need_b else None
    rows = flce_chunk_rows(n, h, v, chunk_size)
    buf = hidden.new_empty((min(rows, n), v))
    for s0 in range(0, n, rows):
        r = min(rows, n - s0)
        xs, ts, lg = x[s0:s0 + r], target[s0:s0 + r], buf[:r]
        if bias is not None:
            torch.addmm(bias, xs, wc.t(), out=lg)
        else:
            torch.mm(xs, wc.t(), out=lg)
        if saved_stats is None:
            stats = torch.ops.fk._vocab_parallel_cross_entropy_stats(lg, ts, ce_weight, start,
                                                                     size, ignore_index, ls,
                                                                     cap)
            gathered = gather_stats(stats, group, world)
            all_stats[:, :, s0:s0 + r] = gathered
        else:
            gathered = saved_stats[:, :, s0:s0 + r].contiguous()
        scale = None if grad_rows is None else grad_rows[s0:s0 + r]
        if any_grad:
            lr, zr = torch.ops.fk._vocab_parallel_cross_entropy_loss_(
                lg, ts, ce_weight, gathered, den, scale, start, size, ignore_index, ls, s, cap)
        else:
            lr, zr, _ = torch.ops.fk._vocab_parallel_cross_entropy_loss(
                lg, ts, ce_weight, gathered, den, None, start, size, ignore_index, ls, s, cap,
                False)
        loss_rows[s0:s0 + r] = lr
        z_rows[s0:s0 + r] = zr
        if need_x:
            torch.mm(lg, wc, out=gx[s0:s0 + r])
        if need_w:
            gw.addmm_(lg.t(), xs)
        if need_b:
            gb += lg.sum(0)
    del buf
    if need_x and world > 1:
        dist.all_reduce(gx, group=group)
    loss, z = _reduce(loss_rows, z_rows, reduction)
    return loss, z, gx, gw, gb, all_stats, den


class _VocabParallelLinearFunction(torch.autograd.Function):
    """Reductions "mean" / "sum": the forward computes the gradients for a grad_output of 1
    and the backward scales them (cross_entropy.scale_stored_grad). Reduction "none": the
    forward keeps the inputs and the gathered stats; the backward runs the chunks again
    with each row's grad_output."""

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, ce_weight, group, rank, world, reduction,
                opts, chunk_size, mask):
        ctx.set_materialize_grads(False)
        deferred = reduction == "none"
        now = (False, False, False) if deferred else mask
        with _below_autograd():
            loss, z, gx, gw, gb, stats, den = _flce_pass(
                hidden, weight, target, bias, ce_weight, group, rank, world, reduction, opts,
                chunk_size, now)
        ctx.deferred = deferred
        if deferred:
            ctx.save_for_backward(hidden, weight, target, bias, ce_weight, stats, den)
            ctx.args = (group, rank, world, opts, chunk_size, mask)
        else:
            ctx.save_for_backward(gx, gw, gb)
        ctx.mark_non_differentiable(z)
        return loss, z

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        out = [None] * 12
        if grad_loss is None:
            return tuple(out)
        if ctx.deferred:
            hidden, weight, target, bias, ce_weight, stats, den = ctx.saved_tensors
            group, rank, world, opts, chunk_size, mask = ctx.args
            create_graph = torch.is_grad_enabled()
            with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
                _, _, gx, gw, gb, _, _ = _flce_pass(
                    hidden, weight, target, bias, ce_weight, group, rank, world, "none", opts,
                    chunk_size, mask, grad_rows=grad_loss.to(stats.dtype).contiguous(),
                    saved_stats=stats, den=den)
            if create_graph:
                gx, gw, gb = raise_when_differentiated(_FLCE_OP, gx, gw, gb)
            out[0], out[1], out[3] = gx, gw, gb
            return tuple(out)
        gx, gw, gb = ctx.saved_tensors
        if gx is not None:
            out[0] = _scale(_FLCE_OP, gx, grad_loss)
        if gw is not None:
            out[1] = _scale(_FLCE_OP, gw, grad_loss)
        if gb is not None:
            out[3] = _scale(_FLCE_OP, gb.unsqueeze(0), grad_loss).squeeze(0)
        return tuple(out)
