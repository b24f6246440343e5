"""fk.sparsemax. Autograd is registered on ``fk::sparsemax`` itself: its backward needs only
the op's output y, whose nonzero entries are the support (``fk::_sparsemax_backward``)."""
import torch

from . import _autograd, _over_dim


def sparsemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax over ``dim`` (Martins and Astudillo, 2016): the Euclidean projection of
    each slice onto the probability simplex, ``y = max(x - tau, 0)`` with the threshold
    ``tau`` chosen per slice so that ``y`` sums to 1. Unlike softmax, entries below the
    threshold are exactly 0.

    Args:
        x: any shape, float32, bfloat16 or float16 (float64 on CPU).
        dim: the dimension to project over (negative counts from the end). The last
            dimension is the fast path: on CUDA a slice of up to 32768 elements is held on
            chip by one program, read once and written once, forward and backward; tau is
            found there without a sort (see triton_src/sparsemax.py). Longer slices raise
            an error on CUDA (the CPU backend takes any length). Any other ``dim`` is moved
            last with one copy in and one copy out; a non-contiguous ``x`` is copied to
            contiguous memory first.

    Returns:
        A new contiguous tensor of ``x``'s shape and dtype, computed in float32 (float64 for
        float64 ``x``) and rounded once. A slice holding ``+inf`` or NaN, or only ``-inf``,
        gives NaN; ``-inf`` entries of any other slice give 0. Differentiable in ``x``: the
        backward uses only the output; with ``S = {y > 0}`` per slice,
        ``grad_x = grad_y - mean_S(grad_y)`` on ``S`` and 0 elsewhere, in float32. (In
        float16 a positive value below 2^-24 rounds to 0 in ``y`` and so leaves the
        support.)
    """
    if torch.jit.is_scripting() or not _autograd.eager():
        return torch.ops.fk.sparsemax(x, dim)
    return _eager_sparsemax(x, dim)


@torch.jit.unused
def _eager_sparsemax(x, dim: int):
    return _sparsemax_eager(x, dim)


# --- checks, fake kernels and autograd (the forward keeps its output y) ---------------------

check_sparsemax, _sparsemax_eager = _over_dim.register("sparsemax")
