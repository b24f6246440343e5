"""Sweep launch configurations of the rms_norm kernels with Triton's JIT (tuning only; the
library uses the AOT variants in triton_src/rms_norm.py). Prints the median time of each
configuration at one shape, forward and backward, so the chosen ones can be written into
triton_src/rms_norm.py as data.

    python benchmarks/tune_rms_norm.py [--rows 8192] [--hidden 4096] [--wide 12288,16384]

--wide: the single-pass backward (the library's up to 16384 columns, where it spills some
registers) against the looped one at the same widths.
"""
import argparse
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import rms_norm as K  # noqa: E402
import triton.language as tl  # noqa: E402
from rms_norm import _normalize, _weight  # noqa: E402


@triton.jit
def rms_norm_fwd_persistent_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, x_stride, y_stride, M, N, eps,
                                   offset, has_w, casting, BLOCK_N: tl.constexpr):
    """Candidate: a persistent grid, each program striding over rows (loads pipelined)."""
    dtype = y_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    wp = _weight(w_ptr, cols, col_mask, offset, has_w, casting, dtype)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r64 = row.to(tl.int64)
        x = tl.load(x_ptr + r64 * x_stride + cols, mask=col_mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
        tl.store(rstd_ptr + r64, rstd)
        y = _normalize(x, rstd, casting, dtype) * wp
        tl.store(y_ptr + r64 * y_stride + cols, y.to(dtype), mask=col_mask)




@triton.jit
def fwd_constexpr_casting_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, x_stride, y_stride, M, N, eps,
                                 offset, EVICT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Candidate: llama casting fixed at compile time, optional streaming cache hints."""
    dtype = y_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    if EVICT:
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
    else:
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last")
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(rstd_ptr + row, rstd)
    xh = (x * rstd).to(dtype)
    y = xh * (w + offset).to(dtype)
    tl.store(y_ptr + row * y_stride + cols, y, mask=mask)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--fwd-only", action="store_true")
    ap.add_argument("--wide", default="12288,16384",
                    help="comma-separated widths for the wide-row backward ('' skips it)")
    args = ap.parse_args()
    m, n = args.rows, args.hidden
    block = triton.next_power_of_2(n)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(m, device="cuda", dtype=torch.float32)
    esz = x.element_size()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"rms_norm {m} x {n} bf16, {sms} SMs")
    ms = bench(lambda: y.copy_(x))
    print(f"torch copy of x ({2 * m * n * esz / 1e6:.0f} MB moved): {ms * 1e3:7.1f} us "
          f"{2 * m * n * esz / ms / 1e6:6.0f} GB/s")
    big = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    big2 = torch.empty_like(big)
    ms = bench(lambda: big2.copy_(big))
    print(f"torch copy 1 GiB: {2 * big.numel() / ms / 1e6:6.0f} GB/s")
    del big, big2
    for evict in (False, True):
        for warps in (4, 8):
            ms = bench(lambda: fwd_constexpr_casting_kernel[(m,)](
                x, w, y, rstd, n, n, m, n, 1e-5, 0.0, EVICT=evict, BLOCK_N=block,
                num_warps=warps))
            gbs = (2 * m * n * esz + n * esz + 4 * m) / ms / 1e6
            print(f"fwd constexpr-casting evict={evict} warps={warps}: {ms * 1e3:7.1f} us  "
                  f"{gbs:6.0f} GB/s")
    if args.fwd_only:
        return
    for rows in (1, 2, 4):
        for warps in (4, 8, 16):
            grid = (triton.cdiv(m, rows),)
            ms = bench(lambda: K.rms_norm_fwd_kernel[grid](
                x, w, y, rstd, n, n, m, n, 1e-5, 0.0, 1, 1, BLOCK_N=block, ROWS=rows,
                num_warps=warps))
            gbs = (2 * m * n * esz + n * esz + 4 * m) / ms / 1e6
            print(f"fwd rows={rows} warps={warps:2d}: {ms * 1e3:7.1f} us  {gbs:6.0f} GB/s")
    for per_sm in (1, 2, 4, 8):
        for stages in (1, 2, 3):
            programs = min(m, per_sm * sms)
            ms = bench(lambda: rms_norm_fwd_persistent_kernel[(programs,)](
                x, w, y, rstd, n, n, m, n, 1e-5, 0.0, 1, 1, BLOCK_N=block, num_warps=8,
                num_stages=stages))
            gbs = (2 * m * n * esz + n * esz + 4 * m) / ms / 1e6
            print(f"fwd persistent per_sm={per_sm} stages={stages}: {ms * 1e3:7.1f} us  {gbs:6.0f} GB/s")
    dw = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    for bp, bn in ((32, 64), (16, 128), (64, 32), (8, 256)):
        part = torch.randn(2 * sms, n, device="cuda")
        ms = bench(lambda: K.rms_norm_dw_kernel[(triton.cdiv(n, bn),)](
            part, dw, part.shape[0], n, BLOCK_P=bp, BLOCK_N=bn, num_warps=4))
        print(f"dw reduce BLOCK_P={bp} BLOCK_N={bn}: {ms * 1e3:6.1f} us")
    for per_sm in (1, 2, 4, 8, 16):
        for warps in (4, 8, 16):
            programs = min(m, per_sm * sms)
            rpp = triton.cdiv(m, programs)
            programs = triton.cdiv(m, rpp)
            dwp = torch.empty(programs, n, device="cuda", dtype=torch.float32)
            ms = bench(lambda: K.rms_norm_bwd_kernel[(programs,)](
                dy, x, w, rstd, dx, dwp, n, n, n, m, n, 0.0, rpp, 1, 1, BLOCK_N=block,
                num_warps=warps))
            red = bench(lambda: dwp.sum(0).to(torch.bfloat16))
            gbs = (3 * m * n * esz + 4 * m) / ms / 1e6
            print(f"bwd per_sm={per_sm:2d} warps={warps:2d}: kernel {ms * 1e3:7.1f} us "
                  f"{gbs:6.0f} GB/s, dw reduce {red * 1e3:6.1f} us")
    wide_backward(m, sms, [int(w) for w in args.wide.split(",") if w])


def wide_backward(m, sms, widths):
    """Backward kernels at wide rows (bf16, weight, llama casting), on the library's grid of
    2 programs per multiprocessor: the looped kernel against the single-pass one at 16
    warps."""
    programs = min(m, 2 * sms)
    rpp = triton.cdiv(m, programs)
    programs = triton.cdiv(m, rpp)
    for n in widths:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dy, dx = torch.randn_like(x), torch.empty_like(x)
        rstd = torch.rand(m, device="cuda") + 0.5
        dwp = torch.empty(programs, n, device="cuda", dtype=torch.float32)
        gbs = 3 * m * n * x.element_size() + 4 * m
        for name, kernel, block, warps in (
                ("looped", K.rms_norm_bwd_looped_kernel, K.LOOP_BLOCK, 8),
                ("single pass", K.rms_norm_bwd_kernel, triton.next_power_of_2(n), 16)):
            ms = bench(lambda: kernel[(programs,)](
                dy, x, w, rstd, dx, dwp, n, n, n, m, n, 0.0, rpp, 1, 1, BLOCK_N=block,
                num_warps=warps))
            print(f"bwd {m} x {n} {name:16s} BLOCK_N={block:5d} warps={warps:2d}: kernel "
                  f"{ms * 1e3:7.1f} us {gbs / ms / 1e6:6.0f} GB/s")


if __name__ == "__main__":
    main()
