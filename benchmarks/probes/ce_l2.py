"""Cross entropy forward with the gradient at 8192 x 128256 bf16, in place: what limits the
two-pass kernel (pass 1: max and sum of exp over the row; pass 2: re-read it, write the
gradient). With one row per program on every SM, 33 MB of rows are in flight against a
50 MB L2, with the gradient writes passing through it, and the re-read largely misses.
Levers swept with Triton's JIT (benchmarks/NOTES.md v7 has the results; the library took
the lean loops with pass 2 reversed):

  reverse   pass 2 walks the row's blocks last to first, so the blocks read most recently
            (still in L2) are re-read first
  grid      fewer programs than rows, each walking rows pid, pid + P, ...: fewer rows in
            flight at once (P < SMs leaves SMs idle, which costs only if the remaining
            ones cannot keep DRAM busy)
  stages    (--stages) both passes' loads software-pipelined (tl.range num_stages:
            cp.async, or TMA bulk copies, into shared memory): more bytes in flight per SM
            than the registers hold
  lean      fewer instructions per element (ce_lean_kernel), once the grid sweep showed
            the time following the number of SMs, not DRAM

Prints each configuration's time (do_bench, L2 flushed before each call), its bandwidth for
the 4.2 GB floor (read once, write once), and its largest difference from the library
kernel's losses and gradient (the reference: the library's plain variant with its sm_90
config, the first timed line).

    python benchmarks/probes/ce_l2.py [--rows 8192] [--vocab 128256] [--stages]
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ce_probe import Problem  # noqa: E402  (puts triton_src on the path)
from cross_entropy import LOG2E  # noqa: E402


@triton.jit
def _ignored_row(x_row, loss_at, V, BLOCK: tl.constexpr):
    """An ignored row: loss 0, gradient zeros."""
    lanes = tl.arange(0, BLOCK)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        tl.store(x_row + cols, tl.zeros((BLOCK,), x_row.dtype.element_ty), mask=cols < V,
                 eviction_policy="evict_first")
    tl.store(loss_at, 0.0)


@triton.jit
def _load_block(x_row, desc, row, start, cols, V, other, policy: tl.constexpr,
                TMA: tl.constexpr, BLOCK: tl.constexpr):
    if TMA:
        x = desc.load([row.to(tl.int32), start.to(tl.int32)]).reshape(BLOCK).to(tl.float32)
        return tl.where(cols < V, x, other)
    return tl.load(x_row + cols, mask=cols < V, other=other,
                   eviction_policy=policy).to(tl.float32)


@triton.jit
def ce_two_pass_kernel(x_ptr, target_ptr, den_ptr, loss_ptr, stride, M, V, ignore_index,
                       BLOCK: tl.constexpr, REVERSE: tl.constexpr, NS: tl.constexpr,
                       TMA: tl.constexpr):
    """The v6 library's plain variant (no weights, smoothing, softcap or z-loss; reduction
    "mean"; gradient in place), with pass 2 optionally reversed, both passes' loads
    optionally software-pipelined NS deep (NS 1: plain loads into registers; NS > 1:
    cp.async or, with TMA, bulk tensor copies into shared memory, NS - 1 blocks ahead)."""
    pid = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    inv_dw = 1.0 / tl.load(den_ptr)
    nblk = tl.cdiv(V, BLOCK)
    desc = x_ptr
    if TMA:
        desc = tl.make_tensor_descriptor(x_ptr, [M, V], [stride, 1], [1, BLOCK])
    for row in range(pid, M, tl.num_programs(0)):
        y = tl.load(target_ptr + row)
        x_row = x_ptr + row * stride
        if y == ignore_index:
            _ignored_row(x_row, loss_ptr + row, V, BLOCK)
        else:
            x_y = tl.load(x_row + y).to(tl.float32)
            m = -float("inf")
            d = 0.0
            for start in tl.range(0, V, BLOCK, num_stages=NS):
                cols = start + lanes
                x = _load_block(x_row, desc, row, start, cols, V, -float("inf"), "evict_last",
                                TMA, BLOCK)
                m_new = tl.maximum(m, tl.max(x, axis=0))
                d = d * tl.exp2((m - m_new) * LOG2E) + tl.sum(tl.exp2((x - m_new) * LOG2E),
                                                              axis=0)
                m = m_new
            lse = m + tl.log(d)
            tl.store(loss_ptr + row, (lse - x_y) * inv_dw)
            for i in tl.range(0, nblk, num_stages=NS):
                if REVERSE:
                    start = (nblk - 1 - i) * BLOCK
                else:
                    start = i * BLOCK
                cols = start + lanes
                mask = cols < V
                x = _load_block(x_row, desc, row, start, cols, V, 0.0, "evict_first", TMA, BLOCK)
                g = tl.exp2((x - lse) * LOG2E) * inv_dw - tl.where(cols == y, inv_dw, 0.0)
                tl.store(x_row + cols, g.to(x_ptr.dtype.element_ty), mask=mask,
                         eviction_policy="evict_first")


@triton.jit
def ce_lean_kernel(x_ptr, target_ptr, den_ptr, loss_ptr, stride, M, V, ignore_index,
                   BLOCK: tl.constexpr, REVERSE: tl.constexpr, FOLD: tl.constexpr,
                   RAW_MAX: tl.constexpr):
    """ce_two_pass_kernel with fewer instructions per element (the v6 library kernel issued
    about 23 per element: 10.7 in pass 1, 12.5 in pass 2, from its SASS):
      - masked lanes loaded as -inf (no select per element);
      - exponents as one FMA, x * log2(e) - m * log2(e), instead of a subtraction and a
        multiplication;
      - the target's one-hot term only in the block that holds the target, compared in
        32-bit lanes (the v6 library compared 64-bit column indices: 5 instructions an
        element).
    FOLD: the gradient's scale (1 / D, positive) folded into the exponent (no multiply).
    RAW_MAX: each block's maximum taken on the 16-bit values before widening."""
    pid = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    inv_dw = 1.0 / tl.load(den_ptr)
    nblk = tl.cdiv(V, BLOCK)
    for row in range(pid, M, tl.num_programs(0)):
        y = tl.load(target_ptr + row)
        x_row = x_ptr + row * stride
        if y == ignore_index:
            _ignored_row(x_row, loss_ptr + row, V, BLOCK)
        else:
            x_y = tl.load(x_row + y).to(tl.float32)
            m = -float("inf")
            d = 0.0
            for start in range(0, V, BLOCK):
                raw = tl.load(x_row + start + lanes, mask=lanes < V - start,
                              other=-float("inf"), eviction_policy="evict_last")
                x = raw.to(tl.float32)
                if RAW_MAX:
                    m_new = tl.maximum(m, tl.max(raw, axis=0).to(tl.float32))
                else:
                    m_new = tl.maximum(m, tl.max(x, axis=0))
                m_ref = tl.where(m_new == -float("inf"), 0.0, m_new) * LOG2E
                d = d * tl.exp2(m * LOG2E - m_ref) + tl.sum(tl.exp2(x * LOG2E - m_ref), axis=0)
                m = m_new
            lse = m + tl.log(d)
            lse2 = lse * LOG2E
            scale = inv_dw
            if FOLD:
                lse2 = lse2 - tl.log2(inv_dw)
                scale = 1.0
            tl.store(loss_ptr + row, (lse - x_y) * inv_dw)
            y_start = (y // BLOCK) * BLOCK
            for i in range(0, nblk):
                if REVERSE:
                    start = (nblk - 1 - i) * BLOCK
                else:
                    start = i * BLOCK
                ok = lanes < V - start
                x = tl.load(x_row + start + lanes, mask=ok, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                g = tl.exp2(x * LOG2E - lse2)
                if not FOLD:
                    g = g * scale
                if start == y_start:
                    g = g - tl.where(lanes == (y - start).to(tl.int32), inv_dw, 0.0)
                tl.store(x_row + start + lanes, g.to(x_ptr.dtype.element_ty), mask=ok,
                         eviction_policy="evict_first")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--stages", action="store_true", help="also the pipelined-load sweep")
    args = ap.parse_args()
    m, v = args.rows, args.vocab
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    p = Problem(m, v, width=56)
    t, den, loss, sms = p.t, p.den, p.loss, p.sms

    def probe(block, warps, grid, reverse, ns=1, tma=0):
        def fn(x):
            ce_two_pass_kernel[(grid,)](x, t, den, loss, v, m, v, -100, BLOCK=block,
                                        REVERSE=reverse, NS=ns, TMA=tma, num_warps=warps)
        return fn

    def lean(block, warps, grid, reverse, fold=0, raw_max=0):
        def fn(x):
            ce_lean_kernel[(grid,)](x, t, den, loss, v, m, v, -100, BLOCK=block,
                                    REVERSE=reverse, FOLD=fold, RAW_MAX=raw_max,
                                    num_warps=warps)
        return fn

    p.copy()
    p.reference()
    results = []

    def check(name, fn):
        ms = p.check(name, fn)
        if ms is not None:
            results.append((ms, name))

    configs = [(32768, 32, m, 0, 1, 0), (16384, 16, m, 1, 1, 0)]
    if args.stages:  # measured 1.41-4.5 ms, none faster than without (h200_probe_ce_l2_stages.log)
        for block, warps in ((16384, 16), (8192, 8), (8192, 16)):
            for ns in (3, 4):
                for tma in (0, 1):
                    for grid in (m, sms, 3 * sms // 4, sms // 2):
                        for reverse in (0, 1):
                            configs.append((block, warps, grid, reverse, ns, tma))
    for block, warps, grid, reverse, ns, tma in configs:
        check(f"{block} x {warps} w, grid {grid}, rev {reverse}, stages {ns}"
              + (", tma" if tma else ""), probe(block, warps, grid, reverse, ns, tma))
    for block, warps in ((32768, 32), (16384, 16), (16384, 32), (8192, 8), (8192, 16)):
        for grid in (m, sms, 3 * sms // 4):
            for reverse in (0, 1):
                check(f"lean {block} x {warps} w, grid {grid}, rev {reverse}",
                      lean(block, warps, grid, reverse))
    for block, warps in ((32768, 32), (16384, 16), (8192, 8)):
        for grid in (m, sms):
            for fold, raw_max in ((1, 0), (0, 1), (1, 1)):
                check(f"lean {block} x {warps} w, grid {grid}, rev 1, fold {fold}, "
                      f"raw max {raw_max}", lean(block, warps, grid, 1, fold, raw_max))
    print("fastest:")
    for ms, name in sorted(results)[:6]:
        print(f"  {name:56s} {ms * 1e3:8.1f} us")
    p.report("library again", p.library)  # the spread within this run


if __name__ == "__main__":
    main()
