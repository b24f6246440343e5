"""Sweep the rms_norm_fp8 rows kernel with Triton's JIT (tuning only; the library uses the AOT
variants in triton_src/rms_norm_fp8.py): one pass over ROWS rows of at most BLOCK_K columns
a program, writing rstd and the row-wise copy (--layout rowwise, or the first pass of
"both"), over ROWS and warps at the library's BLOCK_K for the width.

    python benchmarks/tune_rms_norm_fp8.py [--rows 8192] [--cols 2048,4096]

Bytes: read x, write q, its scales and rstd.
"""
import argparse

import torch
import triton

import _tune as T
import rms_norm_fp8 as K  # noqa: E402 (triton_src, on the path _tune sets)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", default="2048,4096")
    T.add_device_args(ap)
    args = ap.parse_args()
    T.setup(args.device)
    m, dev, f8 = args.rows, args.device, torch.float8_e4m3fn
    for k in (int(c) for c in args.cols.split(",")):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(k, device=dev, dtype=torch.bfloat16)
        rstd = torch.empty(m, device=dev)
        q = torch.empty(m, k, device=dev, dtype=f8)
        s = torch.empty(triton.cdiv(k, 128), m, device=dev)
        y = torch.empty_like(x)
        block, aot_rows, aot_warps = next(b for b in K._ROWS_BUCKETS if b[0] >= k)
        nbytes = m * k * 3 + m * k // 32 + 4 * m
        print(f"x ({m}, {k}) bf16; AOT bucket BLOCK_K={block}: ROWS={aot_rows} "
              f"warps={aot_warps}", flush=True)
        for rows in (1, 2, 4, 8):
            for warps in (2, 4, 8, 16):
                if rows * block // (32 * warps) < 8:  # under 8 elements a thread
                    continue
                T.timed(f"  ROWS={rows} warps={warps:2d}"
                        + (" (AOT)" if (rows, warps) == (aot_rows, aot_warps) else ""),
                        lambda: K.rms_norm_fp8_rows_kernel[(triton.cdiv(m, rows),)](
                            x, w, q, s, y, rstd, m, k, 1e-6, 1, 0, 0, BLOCK_K=block,
                            ROWS=rows, num_warps=warps), nbytes)


if __name__ == "__main__":
    main()
