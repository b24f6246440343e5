"""fk.multi_tensor_norm and fk.multi_tensor_count_zeros: reductions over a list of tensors
(gradient clipping, statistics). No autograd: the results are not differentiable."""
import math
from typing import List

import torch

from . import _checks as c


def multi_tensor_norm(tensors: List[torch.Tensor], ord: float = 2.0) -> torch.Tensor:
    """The norm of all elements of ``tensors`` taken together: what
    ``torch.nn.utils.get_total_norm(tensors, ord)`` returns, in one kernel over the whole
    list on CUDA (two launches whatever the number of tensors, shapes and dtypes).

    Args:
        tensors: a list of tensors of any shapes, float32, bfloat16 or float16 (mixed;
            float64 on CPU), all on one device. Non-contiguous tensors are read through a
            contiguous copy.
        ord: ``2`` (the square root of the sum of squares) or ``inf`` (the largest
            ``|x|``).

    Returns:
        A 0-dim float32 tensor on the tensors' device (on the CPU for an empty list:
        ``0``). Squares are summed in float32, each program's partial in a fixed order
        (deterministic); NaN in any element gives NaN, inf gives inf. No host
        synchronization: on CUDA the list's addresses and sizes go to the device through a
        non-blocking copy from pinned memory (also under CUDA-graph capture), so the result
        can be used, e.g. in ``clip_grad_norm_``'s scaling, without ``.item()``.
    """
    if len(tensors) == 0:
        return torch.zeros((), dtype=torch.float32)
    # A new list: torch 2.11's stable-ABI boxing moves the tensors out of the list it is
    # given, which TorchScript callers would see emptied (eager calls convert afresh).
    return torch.ops.fk.multi_tensor_norm(list(tensors), float(ord))


def multi_tensor_count_zeros(tensors: List[torch.Tensor]) -> torch.Tensor:
    """The number of elements equal to zero (``+0`` or ``-0``; not NaN) in all of
    ``tensors``, in one kernel over the whole list on CUDA (as
    :func:`multi_tensor_norm`).

    Args:
        tensors: a list of float32, bfloat16 or float16 tensors (mixed; float64 on CPU) on
            one device.

    Returns:
        A 0-dim int64 tensor on the tensors' device (on the CPU for an empty list: ``0``).
    """
    if len(tensors) == 0:
        return torch.zeros((), dtype=torch.int64)
    return torch.ops.fk.multi_tensor_count_zeros(list(tensors))  # (a new list: see above)


# --- checks and fake kernels (csrc/ops/multi_tensor_norm/multi_tensor_norm.cpp raises the
# same messages) ----------------------------------------------------------------------------

def check_tensor_list(op, tensors):
    c.check(len(tensors) > 0, op, ": tensors must not be empty")
    for i, t in enumerate(tensors):
        name = f"tensors[{i}]"
        c.check_float(op, name, t)
        if i > 0:
            c.check_same_device(op, "tensors[0]", tensors[0], name, t)


def _ord_text(ord):
    """ord as C++'s stream prints a double (6 significant digits, inf / nan)."""
    return "%g" % ord


def check_norm_ord(ord):
    c.check(ord == 2.0 or (math.isinf(ord) and ord > 0), "fk::multi_tensor_norm: ord must be 2 "
            "or inf, got ", _ord_text(ord))


@torch.library.register_fake("fk::multi_tensor_norm")
def _multi_tensor_norm_fake(tensors, ord=2.0):
    check_tensor_list("fk::multi_tensor_norm", tensors)
    check_norm_ord(ord)
    return tensors[0].new_empty((), dtype=torch.float32)


@torch.library.register_fake("fk::multi_tensor_count_zeros")
def _multi_tensor_count_zeros_fake(tensors):
    check_tensor_list("fk::multi_tensor_count_zeros", tensors)
    return tensors[0].new_empty((), dtype=torch.int64)
