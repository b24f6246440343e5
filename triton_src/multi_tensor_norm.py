"""Reductions over a list of tensors in one launch: the global 2-norm or inf-norm (gradient
clipping) and the count of zero elements, with float32 accumulation.

The tensors are described by a table in device memory, four int64 per tensor:
    (address, numel, dtype code, first block)
dtype code 0 float32, 1 bfloat16, 2 float16; the tensors' elements are read as flat
contiguous arrays, BLOCK elements at a time, from 16-byte aligned addresses (the C++ side
copies a tensor that is not), so that full blocks load 16 bytes a thread at a time. Block j of tensor i has the global index
``first block + j`` (the prefix sum of the tensors' block counts), and program p of the P
programs handles the global blocks p, p + P, p + 2P, ...: the work is spread evenly over the
programs whatever the sizes, and every program reads the table (a few KiB, from L2 after the
first) once.

``multi_tensor_reduce_kernel`` writes one partial per program (MODE 0: sum of squares, 1:
max of |x|, both float32; 2: the count of zeros, int64); ``multi_tensor_finish_kernel``
(one program) combines the P partials into the 0-dim result: sqrt of the sum, the max, or
the count. Both in a fixed order: the result is deterministic. NaN propagates (a NaN
element makes the norm NaN in both modes, as torch.linalg.vector_norm does); inf too.
"""
import triton
import triton.language as tl

from _common import Variant

# MODE values (the C++ side passes the same).
SUM_SQUARES, MAX_ABS, COUNT_ZEROS = 0, 1, 2
# Table columns.
TABLE_COLS = 4


@triton.jit
def _combine(acc, v, MODE: tl.constexpr):
    if MODE == 0:
        acc += v * v
    elif MODE == 1:
        acc = tl.maximum(acc, tl.abs(v), propagate_nan=tl.PropagateNan.ALL)
    else:
        acc += (v == 0.0).to(tl.int32)
    return acc


@triton.jit
def _reduce_blocks(acc, ptr, numel, b0, P, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """acc combined with blocks b0, b0 + P, ... of one tensor (elements at `ptr`, 16-byte
    aligned: the C++ side guarantees it). Full blocks load without a mask (16-byte loads:
    numel has no divisibility hint), the last one masked; masked lanes are left out."""
    lanes = tl.arange(0, BLOCK)
    for b in range(b0, tl.cdiv(numel, BLOCK), P):
        start = b * BLOCK
        if start + BLOCK <= numel:
            # (the hint that makes these 16-byte loads: start is a multiple of BLOCK and
            # the tensor 16-byte aligned; a hint on the scalar address is not kept)
            ptrs = tl.max_contiguous(tl.multiple_of(ptr + start + lanes, 16), BLOCK)
            acc = _combine(acc, tl.load(ptrs).to(tl.float32), MODE)
        else:
            mask = lanes < numel - start
            v = tl.load(ptr + start + lanes, mask=mask, other=1.0).to(tl.float32)
            # other=1.0 counts no zero; for the norms the masked lanes are 0
            if MODE != 2:
                v = tl.where(mask, v, 0.0)
            acc = _combine(acc, v, MODE)
    return acc


@triton.jit
def _max_nan(acc):
    """max over a block, NaN if any lane is NaN (tl.max may drop NaN)."""
    return tl.where(tl.sum((acc != acc).to(tl.int32), axis=0) > 0, float("nan"),
                    tl.max(acc, axis=0))


@triton.jit
def multi_tensor_reduce_kernel(table_ptr, partial_ptr, n_tensors, MODE: tl.constexpr,
                               BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    P = tl.num_programs(0).to(tl.int64)
    if MODE == 2:
        acc = tl.zeros((BLOCK,), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(n_tensors):
        row = table_ptr + i * 4
        addr = tl.load(row)
        numel = tl.load(row + 1)
        code = tl.load(row + 2)
        first = tl.load(row + 3)
        # the first of this tensor's blocks that is ours: (pid - first) mod P
        b0 = ((pid - first) % P + P) % P
        if code == 0:
            acc = _reduce_blocks(acc, addr.to(tl.pointer_type(tl.float32)), numel, b0, P,
                                 MODE, BLOCK)
        elif code == 1:
            acc = _reduce_blocks(acc, addr.to(tl.pointer_type(tl.bfloat16)), numel, b0, P,
                                 MODE, BLOCK)
        else:
            acc = _reduce_blocks(acc, addr.to(tl.pointer_type(tl.float16)), numel, b0, P,
                                 MODE, BLOCK)
    if MODE == 0:
        tl.store(partial_ptr + pid, tl.sum(acc, axis=0))
    elif MODE == 1:
        tl.store(partial_ptr + pid, _max_nan(acc))
    else:
        tl.store(partial_ptr + pid, tl.sum(acc.to(tl.int64), axis=0))


@triton.jit
def multi_tensor_finish_kernel(partial_ptr, out_ptr, n, MODE: tl.constexpr,
                               BLOCK: tl.constexpr):
    """One program: out = sqrt(sum), max, or sum (int64) of the n partials."""
    lanes = tl.arange(0, BLOCK)
    if MODE == 2:
        acc = tl.zeros((BLOCK,), dtype=tl.int64)
    else:
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = lanes < n - start
        v = tl.load(partial_ptr + start + lanes, mask=mask, other=0)
        if MODE == 1:
            acc = tl.maximum(acc, v, propagate_nan=tl.PropagateNan.ALL)
        else:
            acc += v
    if MODE == 0:
        tl.store(out_ptr, tl.sqrt(tl.sum(acc, axis=0)))
    elif MODE == 1:
        tl.store(out_ptr, _max_nan(acc))
    else:
        tl.store(out_ptr, tl.sum(acc, axis=0))


# --- AOT variants ----------------------------------------------------------------------
#
# Reduce: BLOCK 4096 elements a step over 8 warps (16 per thread: two 16-byte loads of a
# 16-bit tensor, four of float32), PROGRAMS_PER_SM programs per SM (the C++ side launches
# min(blocks, PROGRAMS_PER_SM x SMs) programs): enough loads in flight to stream at copy
# bandwidth. Finish: one program of 1024 lanes. The variants are keyed by MODE in the flags
# (fp32 is the partials' dtype for the norms; the count's are int64, the same kernel).
REDUCE_BLOCK, REDUCE_WARPS, PROGRAMS_PER_SM = 4096, 8, 8
FINISH_BLOCK, FINISH_WARPS = 1024, 4


def variants(arch: int) -> list:
    out = []
    for mode in (SUM_SQUARES, MAX_ABS, COUNT_ZEROS):
        part = "*i64" if mode == COUNT_ZEROS else "*fp32"
        out.append(Variant(family="multi_tensor_reduce", kernel="multi_tensor_reduce_kernel",
                           dtype="fp32", block=REDUCE_BLOCK,
                           signature={"table_ptr": "*i64", "partial_ptr": part,
                                      "n_tensors": "i32", "MODE": "constexpr",
                                      "BLOCK": "constexpr"},
                           constexprs={"MODE": mode, "BLOCK": REDUCE_BLOCK},
                           num_warps=REDUCE_WARPS, flags=mode << 1))
        out.append(Variant(family="multi_tensor_finish", kernel="multi_tensor_finish_kernel",
                           dtype="fp32", block=FINISH_BLOCK,
                           signature={"partial_ptr": part, "out_ptr": part, "n": "i32",
                                      "MODE": "constexpr", "BLOCK": "constexpr"},
                           constexprs={"MODE": mode, "BLOCK": FINISH_BLOCK},
                           num_warps=FINISH_WARPS, flags=mode << 1))
    return out
