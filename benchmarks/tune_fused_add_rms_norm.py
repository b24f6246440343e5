"""Sweep launch configurations of the fused_add_rms_norm kernels with Triton's JIT (tuning
only; the library uses the AOT variants in triton_src/fused_add_rms_norm.py). Prints the
median time, bandwidth and registers of each configuration at one shape, so the chosen
ones can be written into triton_src/fused_add_rms_norm.py as data.

    python benchmarks/tune_fused_add_rms_norm.py [--rows 8192] [--hidden 4096] [--dtype bf16]

The AOT build uses, for an aligned bf16 row of 4096: forward 1 row / program, 8 warps;
backward 8 warps, prefetch on, 16 / warps programs per multiprocessor.
"""
import argparse
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import fused_add_rms_norm as K  # noqa: E402
from rms_norm import rms_norm_dw_kernel  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_ms(numel, dtype):
    src = torch.empty(numel, device="cuda", dtype=dtype)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def regs(compiled):
    return f"{compiled.n_regs:3d} regs {compiled.n_spills:3d} spills"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = ap.parse_args()
    m, n, dtype = args.rows, args.hidden, DTYPES[args.dtype]
    block = triton.next_power_of_2(n)
    mk = lambda: torch.randn(m, n, device="cuda", dtype=dtype)  # noqa: E731
    x, r, dy, ds = mk(), mk(), mk(), mk()
    w = torch.randn(n, device="cuda", dtype=dtype)
    y, s, dx = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(m, device="cuda", dtype=torch.float32)
    mn = m * n * x.element_size()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"fused_add_rms_norm {m} x {n} {args.dtype}, {sms} SMs; forward and backward each "
          f"move {4 * mn / 1e6:.0f} MB")
    ms = copy_ms(1 << 30, torch.uint8)
    print(f"torch copy 1 GiB: {2 * (1 << 30) / ms / 1e6:6.0f} GB/s")
    ms = copy_ms(2 * m * n, dtype)
    print(f"torch copy of 2 x ({m}, {n}) ({4 * mn / 1e6:.0f} MB moved): {ms * 1e3:7.1f} us "
          f"{4 * mn / ms / 1e6:6.0f} GB/s")

    fwd_bytes = 4 * mn + n * x.element_size() + 4 * m
    for rows in (1, 2, 4):
        for warps in (4, 8, 16):
            grid = (triton.cdiv(m, rows),)
            k = K.fused_add_rms_norm_fwd_kernel[grid](x, r, w, y, s, rstd, m, n, 1e-5, 0.0, 1, 1,
                                                      BLOCK_N=block, ROWS=rows, num_warps=warps)
            ms = bench(lambda: K.fused_add_rms_norm_fwd_kernel[grid](
                x, r, w, y, s, rstd, m, n, 1e-5, 0.0, 1, 1, BLOCK_N=block, ROWS=rows,
                num_warps=warps))
            print(f"fwd rows={rows} warps={warps:2d}: {ms * 1e3:7.1f} us "
                  f"{fwd_bytes / ms / 1e6:6.0f} GB/s  {regs(k)}")

    bwd_bytes = 4 * mn + 4 * m
    dw = torch.empty(n, device="cuda", dtype=dtype)
    for prefetch in (0, 1):
        for warps in (4, 8, 16):
            for per_sm in (1, 2, 4):
                programs = min(m, per_sm * sms)
                rpp = triton.cdiv(m, programs)
                programs = triton.cdiv(m, rpp)
                part = torch.empty(programs, n, device="cuda", dtype=torch.float32)

                def run():
                    return K.fused_add_rms_norm_bwd_kernel[(programs,)](
                        dy, ds, s, w, rstd, dx, part, m, n, 0.0, rpp, 1, 1, 1, 1, 1,
                        BLOCK_N=block, PREFETCH=prefetch, num_warps=warps)

                k = run()
                ms = bench(run)
                red = bench(lambda: rms_norm_dw_kernel[(triton.cdiv(n, 64),)](
                    part, dw, programs, n, BLOCK_P=32, BLOCK_N=64, num_warps=4))
                print(f"bwd prefetch={prefetch} warps={warps:2d} per_sm={per_sm}: kernel "
                      f"{ms * 1e3:7.1f} us {bwd_bytes / ms / 1e6:6.0f} GB/s  {regs(k)}, "
                      f"dw reduce {red * 1e3:5.1f} us")

    rpp = triton.cdiv(m, min(m, 2 * sms))
    programs = triton.cdiv(m, rpp)
    part = torch.empty(programs, n, device="cuda", dtype=torch.float32)
    ms = bench(lambda: K.fused_add_rms_norm_fwd_looped_kernel[(m,)](
        x, r, w, y, s, rstd, m, n, 1e-5, 0.0, 1, 1, BLOCK_N=K.LOOP_BLOCK, num_warps=8))
    print(f"fwd looped (for reference): {ms * 1e3:7.1f} us {fwd_bytes / ms / 1e6:6.0f} GB/s")
    ms = bench(lambda: K.fused_add_rms_norm_bwd_looped_kernel[(programs,)](
        dy, ds, s, w, rstd, dx, part, m, n, 0.0, rpp, 1, 1, 1, 1, 1, BLOCK_N=K.LOOP_BLOCK,
        num_warps=8))
    print(f"bwd looped (for reference): {ms * 1e3:7.1f} us {bwd_bytes / ms / 1e6:6.0f} GB/s")


if __name__ == "__main__":
    main()
