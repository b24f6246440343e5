"""Sweep launch configurations of the geglu kernels with Triton's JIT (tuning only; the
library uses the AOT variants in triton_src/geglu.py). Prints the median time and bandwidth
of each (gelu form, block, warps) at one shape, forward and backward, next to a plain copy
and swiglu's kernels at the same shape, so the chosen configs can be written into
triton_src/geglu.py as data.

    python benchmarks/tune_geglu.py [--rows 8192] [--cols 14336] [--dtype bf16]
"""
import argparse
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import geglu as K  # noqa: E402
import swiglu as S  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def report(what, ms, nbytes):
    print(f"{what:44s} {ms * 1e3:8.1f} us  {nbytes / ms / 1e6:6.0f} GB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=14336)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = ap.parse_args()
    n = args.rows * args.cols
    dt = DTYPES[args.dtype]
    a, b, dc = (torch.randn(n, device="cuda", dtype=dt) for _ in range(3))
    c, da, db = (torch.empty_like(a) for _ in range(3))
    t = n * a.element_size()
    print(f"geglu {args.rows} x {args.cols} {args.dtype}, "
          f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs; "
          f"forward moves {3 * t / 1e6:.0f} MB, backward {5 * t / 1e6:.0f} MB")
    report("torch copy of a (2 tensors)", bench(lambda: c.copy_(a)), 2 * t)
    for block, warps in ((2048, 8),):
        grid = (triton.cdiv(n, block),)
        report(f"swiglu fwd block={block} warps={warps}", bench(lambda: S.swiglu_fwd_kernel[grid](
            a, b, c, n, 1.0, 1.0, BLOCK=block, SCALED=0, num_warps=warps)), 3 * t)
        report(f"swiglu bwd block={block} warps={warps}", bench(lambda: S.swiglu_bwd_kernel[grid](
            dc, a, b, da, db, n, 1.0, 1.0, BLOCK=block, SCALED=0, num_warps=warps)), 5 * t)
    for mode, approx in K.MODES.items():
        for block in (1024, 2048, 4096):
            for warps in (4, 8, 16):
                grid = (triton.cdiv(n, block),)
                ms = bench(lambda: K.geglu_fwd_kernel[grid](a, b, c, n, APPROX=approx,
                                                            BLOCK=block, num_warps=warps))
                report(f"geglu {mode} fwd block={block} warps={warps}", ms, 3 * t)
                ms = bench(lambda: K.geglu_bwd_kernel[grid](dc, a, b, da, db, n, APPROX=approx,
                                                            BLOCK=block, num_warps=warps))
                report(f"geglu {mode} bwd block={block} warps={warps}", ms, 5 * t)
                # The in-place backward (da, db into a, b) as fk.nn.GEGLUMLP runs it.
                if (block, warps) == (2048, 8):
                    ms = bench(lambda: K.geglu_bwd_kernel[grid](dc, a, b, a, b, n, APPROX=approx,
                                                                BLOCK=block, num_warps=warps))
                    report(f"geglu {mode} bwd in place block={block} warps={warps}", ms, 5 * t)
                    a.copy_(torch.randn_like(a))
                    b.copy_(torch.randn_like(b))


if __name__ == "__main__":
    main()
