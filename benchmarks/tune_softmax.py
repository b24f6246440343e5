"""Sweep launch configurations of the softmax kernels with Triton's JIT (tuning only; the
library uses the AOT variants in triton_src/softmax.py). Prints the median time of each
configuration, so the chosen ones can be written into triton_src/softmax.py as data
(_BUCKETS, _LOOPED, _max_block).

    python benchmarks/tune_softmax.py                       # 8192 x 32768 bf16, all parts
    python benchmarks/tune_softmax.py --part buckets        # warps / rows per bucket
    python benchmarks/tune_softmax.py --width 128256 --part fwd,bwd   # looped only

Parts:
  fwd      the forward at rows x width: the library's single-pass kernel in both forms (the
           per-group shift, ROW_MAX=0, and the row-max shift, ROW_MAX=1, which the 32768
           bucket uses) at 16 and 32 warps, and the looped kernel over chunk x warps x
           programs per multiprocessor.
  bwd      the backward: the single-pass kernel holding y and dy (RELOAD=0) and the one that
           keeps only y and reads dy again for dx (RELOAD=1, the 32768 bucket), and the
           looped kernel sweep.
  buckets  every single-pass bucket at the same bytes (rows = rows * width / bucket):
           rows per program x warps x form (alt = ROW_MAX / RELOAD), forward and backward,
           best first.
"""
import argparse
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import softmax as K  # noqa: E402


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


class Report:
    def __init__(self, nbytes):
        self.nbytes, self.rows = nbytes, []

    def add(self, name, fn):
        try:
            ms = bench(fn)
        except Exception as e:  # noqa: BLE001  (a config that does not compile or launch)
            print(f"  {name:58s} failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            return
        self.rows.append((ms, name))
        print(f"  {name:58s} {ms * 1e3:8.1f} us {self.nbytes / ms / 1e6:6.0f} GB/s", flush=True)

    def best(self, title, k=3):
        print(f"  best {title}:")
        for ms, name in sorted(self.rows)[:k]:
            print(f"    {name:56s} {ms * 1e3:8.1f} us {self.nbytes / ms / 1e6:6.0f} GB/s")


def looped_configs(sms, m):
    for block in (2048, 4096, 8192):
        for warps in (4, 8, 16):
            if block // (32 * warps) < 4:
                continue
            for per_sm in (1, 2, 4, 8, 0):
                programs = m if per_sm == 0 else min(m, per_sm * sms)
                yield block, warps, per_sm, programs


def single_pass(kind, tensors, m, n, block, warps):
    """(name, launch) of the library's single-pass kernel in both forms."""
    for alt in (0, 1):
        if kind == "fwd":
            x, y = tensors
            yield (f"single {('group shift', 'row-max shift')[alt]} ROW_MAX={alt} warps={warps}",
                   lambda: K.softmax_fwd_kernel[(m,)](x, y, n, n, m, n, BLOCK_N=block, ROWS=1,
                                                      ROW_MAX=alt, num_warps=warps))
        else:
            dy, y, dx = tensors
            yield (f"single {('y + dy', 'reload dy')[alt]} RELOAD={alt} warps={warps}",
                   lambda: K.softmax_bwd_kernel[(m,)](dy, y, dx, n, n, n, m, n, BLOCK_N=block,
                                                      ROWS=1, RELOAD=alt, num_warps=warps))


def part_rows(kind, m, n, dtype, sms):
    """The forward ("fwd") or backward ("bwd") at m x n: single pass (both forms), looped."""
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    if kind == "fwd":
        tensors, looped = (x, torch.empty_like(x)), K.softmax_fwd_looped_kernel
    else:
        y = torch.softmax(x.float(), -1).to(dtype)
        tensors, looped = (torch.randn_like(y), y, torch.empty_like(y)), K.softmax_bwd_looped_kernel
    r = Report(len(tensors) * x.numel() * x.element_size())
    print(f"\n{kind} {m} x {n}")
    block = triton.next_power_of_2(n)
    if block <= 32768:
        for warps in (16, 32):
            for name, fn in single_pass(kind, tensors, m, n, block, warps):
                r.add(name, fn)
    strides = (n,) * len(tensors)
    for block, warps, per_sm, programs in looped_configs(sms, m):
        # PER_SM only sizes the grid (on the host): one compile serves every value.
        r.add(f"looped chunk={block} warps={warps} per_sm={per_sm or 'all rows'}",
              lambda: looped[(programs,)](*tensors, *strides, m, n, BLOCK_N=block, PER_SM=1,
                                          num_warps=warps))
    r.best(kind)


def tune_bucket(kind, block, total, dtype):
    """Rows per program x warps x form for one single-pass bucket; returns the fastest as
    (block, rows, warps, alt)."""
    m = total // block
    x = torch.randn(m, block, device="cuda", dtype=dtype)
    y, dy, dx = torch.empty_like(x), torch.randn_like(x), torch.empty_like(x)
    r = Report((2 if kind == "fwd" else 3) * x.numel() * x.element_size())
    print(f" {kind} {m} x {block}")
    for rows in (1, 2, 4, 8, 16, 32):
        for warps in (2, 4, 8, 16, 32):
            per_thread = rows * block // (32 * warps)
            if rows * block > 32768 or not 4 <= per_thread <= 64:
                continue
            grid = (triton.cdiv(m, rows),)
            for alt in (0, 1):
                if kind == "fwd":
                    fn = lambda: K.softmax_fwd_kernel[grid](  # noqa: E731
                        x, y, block, block, m, block, BLOCK_N=block, ROWS=rows, ROW_MAX=alt,
                        num_warps=warps)
                else:
                    fn = lambda: K.softmax_bwd_kernel[grid](  # noqa: E731
                        dy, y, dx, block, block, block, m, block, BLOCK_N=block, ROWS=rows,
                        RELOAD=alt, num_warps=warps)
                r.add(f"{kind} block={block} rows={rows} warps={warps} alt={alt}", fn)
    r.best(f"{kind} {block}", k=2)
    name = min(r.rows)[1]
    rows, warps, alt = (int(p.split("=")[1]) for p in name.split()[2:5])
    return block, rows, warps, alt


def part_buckets(total, dtype):
    print(f"\nsingle-pass buckets, {total} elements each (AOT: rows per program, warps, alt)")
    picks = {kind: [tune_bucket(kind, b[0], total, dtype) for b in K._BUCKETS[kind]]
             for kind in ("fwd", "bwd")}
    print("\nfastest per bucket, as triton_src/softmax.py data:")
    for kind, picked in picks.items():
        print(f'    "{kind}": {tuple(picked)},')


def baselines(m, n, dtype):
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    nbytes = 2 * x.numel() * x.element_size()
    ms = bench(lambda: torch.empty_like(x).copy_(x))
    print(f"torch copy of x ({nbytes / 1e6:.0f} MB moved): {ms * 1e3:7.1f} us "
          f"{nbytes / ms / 1e6:6.0f} GB/s")
    ms = bench(lambda: torch.softmax(x, -1))
    print(f"torch.softmax: {ms * 1e3:7.1f} us {nbytes / ms / 1e6:6.0f} GB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=32768)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--part", default="fwd,bwd,buckets")
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    m, n = args.rows, args.width
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"softmax {m} x {n} {args.dtype}, {sms} SMs, {torch.cuda.get_device_name()}")
    baselines(m, n, dtype)
    parts = args.part.split(",")
    for kind in ("fwd", "bwd"):
        if kind in parts:
            part_rows(kind, m, n, dtype, sms)
    if "buckets" in parts:
        part_buckets(m * n, dtype)


if __name__ == "__main__":
    main()
