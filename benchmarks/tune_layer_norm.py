"""Sweep launch configurations of the layer_norm kernels with Triton's JIT (tuning only; the
library uses the AOT variants in triton_src/layer_norm.py). Prints the median time of each
configuration at one shape, so the chosen ones can be written into triton_src/layer_norm.py
as data (_FWD_BUCKETS, _BWD_BUCKETS, LOOP_BWD, _DWDB_BLOCK).

    python benchmarks/tune_layer_norm.py [--rows 8192] [--hidden 4096] [--quick]
    TRITON_INTERPRET=1 python benchmarks/tune_layer_norm.py --device cpu --rows 64 \
        --hidden 256 --quick        # smoke test of this script (each kernel runs once)

Reference lines: torch's copy of x, a 1 GiB copy, and torch's own fused LayerNorm kernels
(aten native_layer_norm and native_layer_norm_backward) at the same shape.
"""
import argparse
import itertools
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import layer_norm as K  # noqa: E402


DEVICE = "cuda"


def bench(fn):
    if DEVICE != "cuda":
        fn()
        return 1.0
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def better(best, ms, label):
    """The faster of `best` (None or (ms, label)) and (ms, label)."""
    return (ms, label) if best is None or ms < best[0] else best


def line(what, ms, nbytes):
    print(f"{what}: {ms * 1e3:7.1f} us  {nbytes / ms / 1e6:6.0f} GB/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="fewer backward configurations")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    m, n = args.rows, args.hidden
    block = triton.next_power_of_2(n)
    dt = torch.bfloat16
    x = torch.randn(m, n, device=DEVICE, dtype=dt)
    w = 1 + 0.1 * torch.randn(n, device=DEVICE, dtype=dt)
    b = 0.1 * torch.randn(n, device=DEVICE, dtype=dt)
    dy = torch.randn_like(x)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    mean = torch.empty(m, device=DEVICE, dtype=torch.float32)
    rstd = torch.empty(m, device=DEVICE, dtype=torch.float32)
    esz = x.element_size()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 2
    fwd_bytes = 2 * m * n * esz + 2 * n * esz + 8 * m
    bwd_bytes = 3 * m * n * esz + 3 * n * esz + 8 * m
    big = torch.empty(1 << (30 if DEVICE == "cuda" else 20), device=DEVICE, dtype=torch.uint8)
    big2 = torch.empty_like(big)
    copy_ms = bench(lambda: big2.copy_(big))
    copy_gbs = 2 * big.numel() / copy_ms / 1e6
    del big, big2
    print(f"layer_norm {m} x {n} bf16, {sms} SMs; floors at the measured copy bandwidth "
          f"({copy_gbs:.0f} GB/s): forward {fwd_bytes / copy_gbs / 1e3:.1f} us, backward "
          f"{bwd_bytes / copy_gbs / 1e3:.1f} us")
    line("torch copy of x", bench(lambda: y.copy_(x)), 2 * m * n * esz)
    line("torch copy 1 GiB", copy_ms, 2 * (1 << (30 if DEVICE == "cuda" else 20)))

    # torch's fused kernels, without autograd
    _, tmean, trstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)
    line("aten native_layer_norm", bench(lambda: torch.ops.aten.native_layer_norm(
        x, [n], w, b, 1e-5)), fwd_bytes)
    line("aten native_layer_norm_backward (dx, dw, db)", bench(
        lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [n], tmean, trstd, w, b,
                                                          [True, True, True])), bwd_bytes)

    # forward: rows per program x warps (single pass), or the looped kernel
    fwd_best = None
    if n <= 16384:
        for rows, warps in itertools.product((1, 2, 4), (4, 8, 16)):
            grid = (triton.cdiv(m, rows),)
            ms = bench(lambda: K.layer_norm_fwd_kernel[grid](
                x, w, b, y, mean, rstd, n, n, m, n, 1e-5, 1, 1, BLOCK_N=block, ROWS=rows,
                num_warps=warps))
            line(f"fwd rows={rows} warps={warps:2d}", ms, fwd_bytes)
            fwd_best = better(fwd_best, ms, f"rows={rows} warps={warps}")
    for lb, warps in itertools.product((2048, 4096, 8192), (4, 8, 16)):
        if lb > block:
            continue
        ms = bench(lambda: K.layer_norm_fwd_looped_kernel[(m,)](
            x, w, b, y, mean, rstd, n, n, m, n, 1e-5, 1, 1, BLOCK_N=lb, num_warps=warps))
        line(f"fwd looped BLOCK_N={lb} warps={warps:2d}", ms, fwd_bytes)
        fwd_best = better(fwd_best, ms, f"looped BLOCK_N={lb} warps={warps}")

    # backward: warps x pipeline stages x programs per SM (grid = per_sm * SMs)
    def bwd(kernel, blk, warps, stages, per_sm):
        programs = min(m, per_sm * sms)
        rpp = triton.cdiv(m, programs)
        programs = triton.cdiv(m, rpp)
        part = torch.empty(2, programs, n, device=DEVICE, dtype=torch.float32)
        fn = lambda: kernel[(programs,)](  # noqa: E731
            dy, x, w, mean, rstd, dx, part[0], part[1], n, n, n, m, n, rpp, 1, 1, 1, 1,
            BLOCK_N=blk, STAGES=stages, PER_SM=per_sm, num_warps=warps)
        return bench(fn), part

    x32 = x.float()
    mean.copy_(x32.mean(-1))
    rstd.copy_(torch.rsqrt(x32.var(-1, unbiased=False) + 1e-5))
    del x32
    warps_list = (8, 16) if args.quick else (4, 8, 16)
    stages_list = (1, 3) if args.quick else (1, 2, 3, 4)
    per_sm_list = (1, 2) if args.quick else (1, 2, 3, 4)
    bwd_best = None
    configs = []
    if n <= 8192:
        configs += [("single", K.layer_norm_bwd_kernel, block, wp, st, ps)
                    for wp, st, ps in itertools.product(warps_list, stages_list, per_sm_list)]
    if n <= 8192:  # the looped backward as shipped, for comparison
        configs.append(("looped", K.layer_norm_bwd_looped_kernel, *K.LOOP_BWD))
    else:
        configs += [("looped", K.layer_norm_bwd_looped_kernel, lb, wp, st, ps)
                    for lb, wp, st, ps in itertools.product((1024, 2048, 4096), (4, 8, 16),
                                                            (1, 2, 3), (1, 2))
                    if not (args.quick and (wp == 4 or lb == 1024))]
    part = None
    for kind, kernel, blk, warps, stages, per_sm in configs:
        try:
            ms, p = bwd(kernel, blk, warps, stages, per_sm)
        except Exception as e:  # noqa: BLE001  (out of shared memory / registers)
            print(f"bwd {kind} BLOCK_N={blk} warps={warps} stages={stages} per_sm={per_sm}: "
                  f"failed: {type(e).__name__}")
            continue
        line(f"bwd {kind} BLOCK_N={blk:5d} warps={warps:2d} stages={stages} per_sm={per_sm}",
             ms, bwd_bytes)
        label = f"{kind} BLOCK_N={blk} warps={warps} stages={stages} per_sm={per_sm}"
        if bwd_best is None or ms < bwd_best[0]:
            bwd_best, part = (ms, label), p

    # dw / db reduction of the best backward's partials
    dwdb = torch.empty(2, n, device=DEVICE, dtype=dt)
    red_best = None
    for bp, bn, warps in ((32, 32, 4), (32, 64, 4), (64, 32, 4), (64, 64, 8), (128, 32, 8),
                          (256, 16, 8), (256, 32, 8), (512, 16, 8)):
        ms = bench(lambda: K.layer_norm_dwdb_kernel[(triton.cdiv(n, bn), 2)](
            part, dwdb[0], dwdb[1], part.shape[1], n, BLOCK_P=bp, BLOCK_N=bn, num_warps=warps))
        print(f"dw+db reduce of {part.shape[1]} partial rows BLOCK_P={bp} BLOCK_N={bn} "
              f"warps={warps}: {ms * 1e3:6.1f} us", flush=True)
        red_best = better(red_best, ms, f"BLOCK_P={bp} BLOCK_N={bn} warps={warps}")
    print(f"\nbest forward:  {fwd_best[0] * 1e3:.1f} us ({fwd_best[1]})")
    print(f"best backward: {bwd_best[0] * 1e3:.1f} us ({bwd_best[1]})")
    print(f"best reduce:   {red_best[0] * 1e3:.1f} us ({red_best[1]})")


if __name__ == "__main__":
    main()
