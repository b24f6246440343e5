"""Sweep the poly_norm kernels with Triton's JIT (tuning only; the library uses the AOT
variants in triton_src/poly_norm.py): the forward's (ROWS, warps), the backward's (warps,
programs per multiprocessor), and candidate forms (a persistent forward; rsqrt.approx).
Prints the median time and the fraction of the measured copy bandwidth at one shape,
forward (x read; y and the (M, 3) rstd written) and backward (x, dy read, dx written; the
parameter-gradient reduction timed apart) separately.

    python benchmarks/tune_poly_norm.py [--rows 8192] [--hidden 4096] [--quick]
    TRITON_INTERPRET=1 python benchmarks/tune_poly_norm.py --device cpu --rows 40 --hidden 300
"""
import argparse

import torch
import triton
import triton.language as tl

import _tune as T
import poly_norm as K  # noqa: E402 (triton_src on the path through _tune)


@triton.jit
def _rstd(ms, eps, RSQRT: tl.constexpr):
    if RSQRT:
        return tl.rsqrt(ms + eps)
    else:
        return 1.0 / tl.sqrt(ms + eps)


@triton.jit
def poly_norm_fwd_persistent_kernel(x_ptr, w_ptr, b_ptr, y_ptr, rstd_ptr, M, N, eps,
                                    BLOCK_N: tl.constexpr, RSQRT: tl.constexpr):
    """Candidate: a persistent grid, each program striding over rows one at a time (the
    parameters loaded once). RSQRT: rsqrt.approx (about 2 ulp) instead of 1 / sqrt (an IEEE
    square root and division): the rstd values and so y may differ in the last fp32 bits."""
    dtype = y_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w0 = tl.load(w_ptr).to(tl.float32)
    w1 = tl.load(w_ptr + 1).to(tl.float32)
    w2 = tl.load(w_ptr + 2).to(tl.float32)
    b = tl.load(b_ptr).to(tl.float32)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r64 = tl.cast(row, tl.int64)
        x = tl.load(x_ptr + r64 * N + cols, mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        x2 = x * x
        x3 = x2 * x
        r1 = _rstd(tl.sum(x2, axis=0) / N, eps, RSQRT)
        r2 = _rstd(tl.sum(x2 * x2, axis=0) / N, eps, RSQRT)
        r3 = _rstd(tl.sum(x3 * x3, axis=0) / N, eps, RSQRT)
        tl.store(rstd_ptr + r64 * 3, r3)
        tl.store(rstd_ptr + r64 * 3 + 1, r2)
        tl.store(rstd_ptr + r64 * 3 + 2, r1)
        y = (x3 * (w0 * r3) + x2 * (w1 * r2) + x * (w2 * r1)) + b
        tl.store(y_ptr + r64 * N + cols, y.to(dtype), mask=mask)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    T.add_device_args(ap)
    args = ap.parse_args()
    dev, cpu = args.device, args.device != "cuda"
    sms = T.setup(dev)
    m, n = args.rows, args.hidden
    block = triton.next_power_of_2(n)
    dt, esz = torch.bfloat16, 2
    x = torch.randn(m, n, device=dev, dtype=dt)
    w = torch.tensor([0.3, 0.5, 0.8], device=dev)
    b = torch.tensor([0.1], device=dev)
    dy = torch.randn_like(x)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(m, 3, device=dev)
    eps = 1e-6
    fwd_bytes = 2 * m * n * esz + 12 * m
    bwd_bytes = 3 * m * n * esz + 12 * m
    print(f"poly_norm {m} x {n} bf16, float32 parameters", flush=True)
    if not cpu:
        T.timed("torch copy of x", lambda: y.copy_(x), 2 * m * n * esz)
    lib_fwd = next((r, wp) for bl, r, wp in K._FWD_BUCKETS if bl >= n)
    lib_bwd_warps = next(wp for bl, wp in K._BWD_BUCKETS if bl >= n)

    def fwd(rows, warps):
        return lambda: K.poly_norm_fwd_kernel[(triton.cdiv(m, rows),)](
            x, w, b, y, rstd, m, n, eps, BLOCK_N=block, ROWS=rows, num_warps=warps)

    def fwd_persistent(per_sm, warps, rsqrt):
        return lambda: poly_norm_fwd_persistent_kernel[(min(m, per_sm * sms),)](
            x, w, b, y, rstd, m, n, eps, BLOCK_N=block, RSQRT=rsqrt, num_warps=warps)

    def bwd(warps, per_sm):
        rpp = triton.cdiv(m, min(m, per_sm * sms))
        programs = triton.cdiv(m, rpp)
        part = torch.empty(programs, 4, device=dev)
        return (lambda: K.poly_norm_bwd_kernel[(programs,)](
            dy, x, w, rstd, dx, part, m, n, rpp, BLOCK_N=block, num_warps=warps)), part

    def reduce(part):
        dw, db = torch.empty(3, device=dev), torch.empty(1, device=dev)
        K.poly_norm_reduce_kernel[(1,)](part, dw, db, part.shape[0], BLOCK_P=K.REDUCE_ROWS,
                                        num_warps=K.REDUCE_WARPS)
        return dw, db

    # checks: the candidate forward against the library kernel's y and rstd
    fwd(*lib_fwd)()
    y_ref, rstd_ref = y.clone(), rstd.clone()
    for rsqrt in (0, 1):
        fwd_persistent(2, lib_fwd[1], rsqrt)()
        # another reduction order (and rsqrt.approx): the fp32 rstd a few ulps apart, y a
        # bf16 rounding apart at most
        T.check(f"persistent forward RSQRT={rsqrt} y", y, y_ref, atol=1e-5, rtol=2 ** -7)
        T.check(f"persistent forward RSQRT={rsqrt} rstd", rstd, rstd_ref, atol=0.0,
                rtol=4e-6)
    rstd.copy_(rstd_ref)
    run, part = bwd(lib_bwd_warps, 2)
    run()
    dx_ref, g_ref = dx.clone(), reduce(part)
    for per_sm in (1, 4):  # the backward's grid changes only the partial sums' order
        run, part = bwd(lib_bwd_warps, per_sm)
        run()
        T.check(f"backward per_sm={per_sm} dx", dx, dx_ref, atol=0.0)  # the same per row
        T.check(f"backward per_sm={per_sm} dweight, dbias", reduce(part), g_ref,
                atol=1e-3, rtol=1e-4)
    if cpu:
        return

    print(f"-- forward (library: ROWS, warps = {lib_fwd}, BLOCK_N {block})", flush=True)
    for rows, warps in ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16)):
        if args.quick and (rows, warps) not in ((1, 8), (2, 16)):
            continue
        T.timed(f"fwd ROWS={rows} warps={warps:2d}", fwd(rows, warps), fwd_bytes)
    for per_sm in ((2, 4) if args.quick else (1, 2, 4, 8)):
        for warps in (8, 16):
            for rsqrt in (0, 1):
                T.timed(f"fwd persistent per_sm={per_sm} warps={warps:2d} RSQRT={rsqrt}",
                        fwd_persistent(per_sm, warps, rsqrt), fwd_bytes)
    rstd.copy_(rstd_ref)
    lib_per_sm = 16 if block == 4096 else 2  # csrc/ops/poly_norm/poly_norm_cuda.cpp
    print(f"-- backward kernel (library: warps {lib_bwd_warps}, {lib_per_sm} programs / SM)",
          flush=True)
    best = None
    for warps in ((8,) if args.quick else (4, 8, 16)):
        for per_sm in (1, 2, 4, 8, 16):
            ms = T.timed(f"bwd warps={warps:2d} per_sm={per_sm:2d}", bwd(warps, per_sm)[0],
                         bwd_bytes)
            if ms is not None and (best is None or ms < best[0]):
                best = (ms, (warps, per_sm))
    part = bwd(*best[1])[1]
    T.timed(f"parameter-gradient reduction ({part.shape[0]} partial rows)",
            lambda: reduce(part), part.numel() * 4)


if __name__ == "__main__":
    main()
