"""Sweep the rms_norm_fp8 kernels with Triton's JIT (tuning only; the library uses the AOT
variants in triton_src/rms_norm_fp8.py).

--part rows (default): the rows kernel, one pass over ROWS rows of at most BLOCK_K columns a
program, writing rstd and the row-wise copy (--layout rowwise, or the first pass of "both"),
over ROWS and warps at the library's BLOCK_K for the width. Bytes: read x, write q, its
scales and rstd.
--part tile: the tile kernel writing the column-wise copy alone (the second pass of "both"),
over tile widths and warps, each width's bytes and scales checked equal to the 128 x 32
tile's first. Bytes: read x, write qt and its scales.

    python benchmarks/tune_rms_norm_fp8.py [--rows 8192] [--cols 2048,4096] [--part tile]
    TRITON_INTERPRET=1 python benchmarks/tune_rms_norm_fp8.py --device cpu --part tile
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
    ap.add_argument("--part", default="rows", choices=["rows", "tile"])
    T.add_device_args(ap)
    args = ap.parse_args()
    T.setup(args.device)
    if args.part == "tile":
        return tile(args)
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


def tile(args):
    dev, f8 = args.device, torch.float8_e4m3fn
    m, cols = (272, "400") if dev != "cuda" else (args.rows, args.cols)
    for k in (int(c) for c in cols.split(",")):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(k, device=dev, dtype=torch.bfloat16)
        rstd = torch.rsqrt(x.float().pow(2).mean(1) + 1e-6)
        nbytes = m * k * 3 + m * k // 32

        def run(tk, warps=4):
            qt = torch.full((k, m), 7, device=dev, dtype=torch.uint8).view(f8)
            st = torch.full((triton.cdiv(m, 128), k), 7.0, device=dev)
            g = (triton.cdiv(m, 128), triton.cdiv(k, tk))
            return qt, st, lambda: K.rms_norm_fp8_tile_kernel[g](
                x, w, rstd, qt, st, qt, st, x, m, k, 0, 1, 0, 0, TILE_M=128, TILE_K=tk,
                num_warps=warps)

        plain = [f[2:] for f in K.TILE_FORMS if f[0] == K.FLAG_COLS][0]
        print(f"x ({m}, {k}) bf16; AOT tile 128 x {plain[0]} at {plain[1]} warps, aligned "
              f"128 x {K.ALIGNED_COLS_TILE[1]} at {K.ALIGNED_COLS_TILE[2]}", flush=True)
        ref = None
        for tk in (32, 64, 128):
            qt, st, fn = run(tk)
            fn()
            if ref is None:
                ref = (qt.view(torch.uint8), st)
            same = torch.equal(ref[0], qt.view(torch.uint8)) and torch.equal(ref[1], st)
            print(f"  128 x {tk}: equal to 128 x 32: {same}", flush=True)
            if not same:
                raise SystemExit(f"128 x {tk} tile WRONG")
            for warps in (2, 4, 8):
                T.timed(f"  128 x {tk:3d} warps={warps}", run(tk, warps)[2], nbytes)


if __name__ == "__main__":
    main()
