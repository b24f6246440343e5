"""DTensor sharding rules of fk's ops (``torch.distributed.tensor``), so that models
parallelized with torch's own tools (``torch.distributed.tensor.parallel``: SequenceParallel
norms, sharded batches, ...) keep running fk's kernels on the local shards.

Each rule lists, for one mesh dimension, the placements an op accepts and the placements of
what it returns; DTensor expands them over the mesh, redistributes an input whose placement
is not listed to the cheapest one that is, and calls the op on the local tensors. The rules
are registered with ``torch.distributed.tensor.experimental.register_sharding`` on the
internal forward and backward ops (the public ops of the norms are composites of them; the
autograd formulas run above DTensor, so gradients come back as DTensors):

- norms (rms_norm, fused_add_rms_norm, layer_norm): sharded on any dim but the last (the
  normalized one), weight and bias replicated; the weight and bias gradients are
  ``Partial`` sums over the shards, as torch's own norms return them. An input sharded on the
  last dim is redistributed (never normalized piecewise).
- rope: q and k sharded on batch (cos / sin sharded too where they have one row per batch
  element), heads or sequence (cos / sin sharded on their sequence dim), never on head_dim.
- swiglu / geglu: elementwise, any dim, a and b alike.
- cross_entropy: rows (dim 0) sharded with ``reduction="none"`` (per-row losses sharded) or
  ``"sum"`` (``Partial`` losses), never the vocabulary dim. ``"mean"`` over sharded rows is
  computed by ``fk.cross_entropy`` as the sum over all rows divided by the number of
  non-ignored rows over all shards (a mean of per-shard means would be wrong); with class
  weights it is computed on replicated rows.
Everything also runs replicated.

The rules are registered when ``torch.distributed.tensor`` is imported (at ``import fk`` if it
already is, else by an import hook): importing it takes about half a second, which a
program that never uses DTensor should not pay.
"""
import importlib.abc
import importlib.util
import sys

import torch

_MODULE = "torch.distributed.tensor"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``torch.distributed.tensor`` so that the
    rules are registered right after that module has run, then leaves ``sys.meta_path``."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register()

        spec.loader.exec_module = exec_module
        return spec


def register_when_imported() -> None:
    """Registers the rules now if ``torch.distributed.tensor`` is imported, else on its
    import."""
    if not torch.distributed.is_available():
        return
    if _MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


def register() -> None:
    if not torch.distributed.is_available():
        return
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    fk = torch.ops.fk
    rep = Replicate()

    def opt(t, p):
        """The placement of an optional tensor argument: None where it is absent."""
        return None if t is None else p

    def grad_of_replicated(p):
        """A replicated parameter's gradient when the activations are placed as ``p``."""
        return Partial() if isinstance(p, Shard) else rep

    def each(dims, make):
        """``make(placement)`` for replicated and for each dim in ``dims`` sharded."""
        return [make(rep)] + [make(Shard(d)) for d in dims]

    def leading(x):
        return range(x.ndim - 1)

    # --- norms over the last dim ------------------------------------------------------------

    @register_sharding(fk._rms_norm_forward.default)
    def _rms_norm_forward(x, weight, eps, offset, casting_mode):
        return each(leading(x), lambda p: ([p, p], [p, opt(weight, rep), None, None, None]))

    @register_sharding(fk._rms_norm_backward.default)
    def _rms_norm_backward(grad_y, x, weight, rstd, offset, casting_mode, output_mask):
        return each(leading(x), lambda p: (
            [p, opt(weight, grad_of_replicated(p))],
            [p, p, opt(weight, rep), p, None, None, None]))

    @register_sharding(fk._fused_add_rms_norm_forward.default)
    def _fused_add_rms_norm_forward(x, residual, weight, eps, offset, casting_mode):
        return each(leading(x), lambda p: (
            [p, p, p], [p, p, opt(weight, rep), None, None, None]))

    @register_sharding(fk._fused_add_rms_norm_backward.default)
    def _fused_add_rms_norm_backward(grad_y, grad_residual_out, residual_out, weight, rstd,
                                     offset, casting_mode, output_mask):
        return each(leading(residual_out), lambda p: (
            [p, opt(weight, grad_of_replicated(p))],
            [p, opt(grad_residual_out, p), p, opt(weight, rep), p, None, None, None]))

    @register_sharding(fk._layer_norm_forward.default)
    def _layer_norm_forward(x, weight, bias, eps):
        return each(leading(x), lambda p: (
            [p, p, p], [p, opt(weight, rep), opt(bias, rep), None]))

    @register_sharding(fk._layer_norm_backward.default)
    def _layer_norm_backward(grad_y, x, weight, mean, rstd, output_mask):
        return each(leading(x), lambda p: (
            [p, grad_of_replicated(p), grad_of_replicated(p)],
            [p, p, opt(weight, rep), p, p, None]))

    # The dispatcher leaves out trailing arguments equal to the schema's defaults: the rules
    # of the public ops (rope, swiglu, geglu) take them as optional.

    # --- rope: q, k (batch, heads, seq, head_dim); cos, sin (..., seq, rotary width) -------

    def _rope(q, k, cos, sin, rotary_dim=None, interleaved=False):
        def make(pq, pc):
            return [pq, pq], [pq, pq, pc, pc, None, None]
        per_batch = cos.ndim >= 3 and cos.shape[0] != 1  # one cos / sin row per batch element
        return [make(rep, rep), make(Shard(0), Shard(0) if per_batch else rep),
                make(Shard(1), rep), make(Shard(2), Shard(cos.ndim - 2))]

    register_sharding(fk.rope.default)(_rope)
    register_sharding(fk._rope_backward.default)(_rope)

    # --- gated activations: elementwise ----------------------------------------------------

    def _glu(extra):
        def forward(a, b, *args):
            return each(range(a.ndim), lambda p: ([p], [p, p] + [None] * extra))

        def backward(grad_c, a, b, *args):
            return each(range(a.ndim), lambda p: ([p, p], [p, p, p] + [None] * (extra - 1)))
        return forward, backward

    # (the non-tensor arguments after a and b: swiglu's backward_in_place and its two
    # multipliers, geglu's approximate and backward_in_place; the backwards lack the flag)
    for name, extra in (("swiglu", 3), ("geglu", 2)):
        forward, backward = _glu(extra)
        register_sharding(getattr(fk, name).default)(forward)
        register_sharding(getattr(fk, f"_{name}_backward").default)(backward)

    # --- cross entropy: rows sharded, the vocabulary never ----------------------------------

    @register_sharding(fk._cross_entropy_forward.default)
    def _cross_entropy_forward(logits, target, weight, ignore_index, label_smoothing,
                               reduction, lse_square_scale, softcap, compute_grad, extras,
                               mean_denominator=None):
        # outputs: loss, z_loss, grad, and with extras token_accuracy, predicted_tokens
        rest = [None] * 7 + [opt(mean_denominator, rep)]
        w = opt(weight, rep)

        def ext(p):
            return [p, p] if extras else [None, None]
        rules = [([rep, rep, rep] + ext(rep), [rep, rep, w] + rest)]
        rows = Shard(0)
        if reduction == "none":  # every output per row
            rules.append(([rows, rows, rows] + ext(rows), [rows, rows, w] + rest))
        elif reduction == "sum" and not extras:  # (an accuracy is a fraction, not a sum)
            rules.append(([Partial(), Partial(), rows, None, None], [rows, rows, w] + rest))
        # "mean" over sharded rows: see fk.ops.cross_entropy (sum / count over all shards).
        return rules

    @register_sharding(fk._cross_entropy_deferred_forward.default)
    def _cross_entropy_deferred_forward(logits, target, weight, ignore_index, label_smoothing,
                                        reduction, lse_square_scale, softcap, extras,
                                        mean_denominator=None):
        # outputs: loss, z_loss, lse, den, and with extras token_accuracy, predicted_tokens;
        # den is ones unless the reduction is "mean" (the same on every shard then)
        rest = [None] * 6 + [opt(mean_denominator, rep)]
        w = opt(weight, rep)

        def ext(p):
            return [p, p] if extras else [None, None]
        rules = [([rep, rep, rep, rep] + ext(rep), [rep, rep, w] + rest)]
        rows = Shard(0)
        if reduction == "none":
            rules.append(([rows, rows, rows, rep] + ext(rows), [rows, rows, w] + rest))
        elif reduction == "sum" and not extras:
            rules.append(([Partial(), Partial(), rows, rep, None, None], [rows, rows, w] + rest))
        return rules

    @register_sharding(fk._cross_entropy_deferred_backward.default)
    def _cross_entropy_deferred_backward(logits, target, weight, lse, den, grad_loss,
                                         ignore_index, label_smoothing, lse_square_scale,
                                         softcap):
        rows = Shard(0)
        w = opt(weight, rep)
        per_row = grad_loss.ndim == 1
        return [([rep], [rep, rep, w, rep, rep, rep] + [None] * 4),
                ([rows], [rows, rows, w, rows, rep, rows if per_row else rep] + [None] * 4)]

    @register_sharding(fk._cross_entropy_backward.default)
    def _cross_entropy_backward(grad, grad_loss):
        rows = Shard(0)
        per_row = grad_loss.ndim == 1  # reduction "none": one grad_output per row
        return [([rep], [rep, rep]), ([rows], [rows, rows if per_row else rep])]


def rows_sharded(t) -> bool:
    """Whether ``t`` is a DTensor sharded on dim 0 over some mesh dim."""
    if type(t) is torch.Tensor or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor, Shard
    return isinstance(t, DTensor) and any(
        isinstance(p, Shard) and p.dim == 0 for p in t.placements)


def replicated_like(t, like):
    """t (a plain tensor, or already a DTensor) as a DTensor replicated over ``like``'s
    mesh."""
    from torch.distributed.tensor import DTensor, Replicate
    if isinstance(t, DTensor):
        return t
    mesh = like.device_mesh
    return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)


def reduce_partials(t):
    """The DTensor ``t`` with its Partial placements reduced (Replicate)."""
    from torch.distributed.tensor import Replicate
    placements = [Replicate() if p.is_partial() else p for p in t.placements]
    return t.redistribute(t.device_mesh, placements)
