"""Sweep launch configurations of the cross_entropy kernels with Triton's JIT (tuning only;
the library uses the AOT variants in triton_src/cross_entropy.py). Prints the median time
of each configuration at one shape, so the chosen ones can be written into
triton_src/cross_entropy.py (_CONFIG) as data.

    python benchmarks/tune_cross_entropy.py [--rows 8192] [--vocab 128256] [--dtype bf16]

Floor: the forward with the gradient reads the logits once from DRAM and writes the
gradient once (pass 2 re-reads the row, ideally from L2): 2 * rows * vocab * element bytes.
"""
import argparse
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import cross_entropy as K  # noqa: E402
import triton.language as tl  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@triton.jit
def two_pass_baseline_kernel(x_ptr, t_ptr, loss_ptr, V, BLOCK: tl.constexpr,
                             REVERSE: tl.constexpr):
    """Candidate without the manual prefetch: one row per program, plain loops (Triton's own
    pipelining with num_stages), pass 2 in forward or reverse order; mean over all rows."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * V
    y = tl.load(t_ptr + row)
    lanes = tl.arange(0, BLOCK)
    m = -float("inf")
    d = 0.0
    for start in range(0, V, BLOCK):
        cols = start + lanes
        x = tl.load(x_row + cols, mask=cols < V, other=-float("inf"),
                    eviction_policy="evict_last").to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp2((m - m_new) * 1.4426950408889634) + tl.sum(
            tl.exp2((x - m_new) * 1.4426950408889634), axis=0)
        m = m_new
    lse = m + tl.log(d)
    inv_n = 1.0 / tl.num_programs(0)
    nb = tl.cdiv(V, BLOCK)
    for k in range(0, nb):
        b = nb - 1 - k if REVERSE else k
        cols = b * BLOCK + lanes
        mask = cols < V
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        g = tl.exp2((x.to(tl.float32) - lse) * 1.4426950408889634) * inv_n
        g = g - tl.where(cols == y, inv_n, 0.0)
        tl.store(x_row + cols, g.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(loss_ptr + row, lse * inv_n)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--quick", action="store_true", help="fewer configurations")
    args = ap.parse_args()
    m, v, dtype = args.rows, args.vocab, DTYPES[args.dtype]
    x = torch.randn(m, v, device="cuda", dtype=dtype)
    t = torch.randint(0, v, (m,), device="cuda")
    w = torch.rand(v, device="cuda") + 0.5
    loss = torch.empty(m, device="cuda")
    z = torch.empty(m, device="cuda")
    den = torch.empty(2, device="cuda")
    ones = torch.ones(2, device="cuda")  # the forward's (D_w, D_n) for a "sum" reduction
    esz = x.element_size()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nbytes = 2 * m * v * esz
    print(f"cross_entropy {m} x {v} {args.dtype}, {sms} SMs, L2 "
          f"{torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MiB; floor traffic "
          f"{nbytes / 1e9:.2f} GB")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    print(f"torch copy of the logits: {ms * 1e3:8.1f} us {nbytes / ms / 1e6:6.0f} GB/s")
    del y
    big = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    big2 = torch.empty_like(big)
    ms = bench(lambda: big2.copy_(big))
    print(f"torch copy 1 GiB: {2 * big.numel() / ms / 1e6:6.0f} GB/s")
    del big, big2

    pred = torch.empty(m, device="cuda", dtype=torch.long)

    def fwd(block, warps, programs, general=0, write_grad=1, ls=0.0, weight=None, extra=0):
        """extra: the EXTRA variant (general), with the argmax into pred (no token scaling)."""
        grid = (min(m, programs),)
        return lambda: K.cross_entropy_fwd_kernel[grid](
            x, x, t, w if weight is not None else loss, ones, loss, z, v, v, m, v, -100, ls,
            0.0, 1.0, int(weight is not None), 0, write_grad, pred, 0, loss, 0, BLOCK=block,
            GENERAL=general or extra, PER_SM=1, CHUNKS=1, EXTRA=extra, num_warps=warps)

    def report(name, fn, traffic):
        try:
            ms = bench(fn)
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile / launch
            print(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
            return None
        print(f"{name}: {ms * 1e3:8.1f} us {traffic / ms / 1e6:6.0f} GB/s")
        return ms

    blocks = (8192, 16384) if args.quick else (4096, 8192, 16384, 32768)
    warps_list = (16,) if args.quick else (8, 16, 32)
    per_sm_list = (1, 2) if args.quick else (1, 2, 4)
    results = []
    for block in blocks:
        for warps in warps_list:
            if block // (32 * warps) < 4:  # fewer than 4 elements per thread
                continue
            for per_sm in per_sm_list + (0,):
                programs = per_sm * sms if per_sm else m
                label = f"{per_sm}/SM" if per_sm else "1 row/program"
                ms = report(f"fwd+grad BLOCK={block:5d} warps={warps:2d} {label:>13s}",
                            fwd(block, warps, programs), nbytes)
                if ms is not None:
                    results.append((ms, block, warps, per_sm))
    results.sort()
    print("best fwd+grad configurations:")
    for ms, block, warps, per_sm in results[:5]:
        print(f"  {ms * 1e3:8.1f} us  BLOCK={block} warps={warps} per_sm={per_sm or 'rows'}")
    for block in (16384, 32768):
        for warps in (16, 32):
            for stages in (1, 3):
                for reverse in (False, True):
                    report(f"baseline BLOCK={block} warps={warps} stages={stages} "
                           f"reverse={reverse}",
                           lambda: two_pass_baseline_kernel[(m,)](
                               x, t, loss, v, BLOCK=block, REVERSE=reverse, num_warps=warps,
                               num_stages=stages), nbytes)
    ms0, block, warps, per_sm = results[0]
    programs = per_sm * sms if per_sm else m
    report("fwd loss only (best config)", fwd(block, warps, programs, write_grad=0), nbytes // 2)
    for gblock in (2048, 4096, 8192):
        for gwarps in (8, 16):
            report(f"fwd+grad general (weight, smoothing) BLOCK={gblock} warps={gwarps}",
                   fwd(gblock, gwarps, sms, general=1, ls=0.1, weight=w), nbytes)
            # The argmax (token accuracy, predicted tokens) costs against the same variant
            # without it.
            report(f"fwd+grad general, no options BLOCK={gblock} warps={gwarps}",
                   fwd(gblock, gwarps, sms, general=1), nbytes)
            report(f"fwd+grad general + argmax (EXTRA) BLOCK={gblock} warps={gwarps}",
                   fwd(gblock, gwarps, sms, extra=1), nbytes)

    grad1 = torch.ones((), device="cuda")
    grad2 = torch.full((), 0.5, device="cuda")
    for sblock in (2048, 4096, 8192):
        for swarps in (4, 8, 16):
            for per_sm in (4, 8, 16):
                tiles = m * triton.cdiv(v, sblock)
                grid = (min(tiles, per_sm * sms),)
                report(f"scale x0.5 in place BLOCK={sblock} warps={swarps:2d} {per_sm:2d}/SM",
                       lambda: K.cross_entropy_scale_kernel[grid](
                           x, x, grad2, 0, v, v, m, v, 1, BLOCK=sblock, PER_SM=per_sm,
                           num_warps=swarps), nbytes)
    grid = (min(m * triton.cdiv(v, 4096), 8 * sms),)
    report("scale by 1 in place (returns at once)",
           lambda: K.cross_entropy_scale_kernel[grid](x, x, grad1, 0, v, v, m, v, 1, BLOCK=4096,
                                                      PER_SM=8, num_warps=8), 1)
    # The denominators of a weighted mean as the library runs them: zero the pair, then
    # programs over blocks of targets add their partial sums atomically (the library: 256
    # targets per block, at most 1 program per SM). The single program of the first version
    # (1024 targets per step) took 26.5 us here.
    for dblock in (128, 256, 512, 1024):
        for per_sm in (1, 2):
            progs = min(triton.cdiv(m, dblock), per_sm * sms)
            report(f"denominators (zero + {progs:3d} programs of {dblock:4d} targets)",
                   lambda: K.cross_entropy_den_kernel[(progs,)](
                       t, w, den.zero_(), m, v, -100, 1, BLOCK=dblock, PER_SM=per_sm,
                       num_warps=4), m * 8)


if __name__ == "__main__":
    main()
