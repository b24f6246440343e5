"""Sweep the dyt kernels with Triton's JIT (tuning only; the library uses the AOT variants in
triton_src/dyt.py): the forward's (BLOCK_N, ROWS, warps), the backward's (BLOCK_N, ROWS,
warps, programs per multiprocessor), and candidate forms of tanh. Prints the median time and
the fraction of the measured copy bandwidth at one shape, forward (x read, y written) and
backward (x, dy read, dx written; the parameter-gradient reduction timed apart) separately.

    python benchmarks/tune_dyt.py [--rows 8192] [--hidden 4096] [--quick]
    TRITON_INTERPRET=1 python benchmarks/tune_dyt.py --device cpu --rows 40 --hidden 300

Candidate tanh forms (TANH), each checked against the library kernels' outputs first:
  0  the library's: 1 - 2 / (2^(2 u log2 e) + 1) (Triton's fp32 division is div.full.f32,
     an rcp.approx and a multiply): two MUFU operations an element.
  1  the same with 2^v by _tune.exp2_poly on the FMA pipe: one MUFU operation (the rcp)
     an element; 2^v about 1e-7 relative apart from ex2.approx, so y a bf16 rounding
     apart at most.
  2  tanh.approx.f32 (PTX, GPU only): one MUFU operation; relative error about 2^-11, fine
     for a bf16 output, not for fp32.
MUFU runs at 16 operations a clock per multiprocessor (sm_90): at two an element the
forward's tanh needs about 40 % of the time its 4 bytes an element take to move.
"""
import argparse

import torch
import triton
import triton.language as tl

import _tune as T
import dyt as K  # noqa: E402 (triton_src on the path through _tune)


@triton.jit
def _tanh_form(u, TANH: tl.constexpr):
    if TANH == 2:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [u],
                                         dtype=tl.float32, is_pure=True, pack=1)
    elif TANH == 1:
        return 1.0 - 2.0 / (T.exp2_poly(u * (2.0 * K.LOG2E)) + 1.0)
    else:
        return K._tanh(u)


@triton.jit
def dyt_fwd_form_kernel(x_ptr, alpha_ptr, gamma_ptr, beta_ptr, y_ptr, M, N, has_beta,
                        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, TANH: tl.constexpr):
    """Candidate: dyt_fwd_kernel with the tanh form TANH (see the module docstring for the
    numerics of each)."""
    dtype = y_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    alpha = tl.load(alpha_ptr).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + cols, mask=col_mask & (has_beta != 0), other=0.0).to(tl.float32)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = _tanh_form(alpha * x, TANH) * gamma[None, :] + beta[None, :]
    tl.store(y_ptr + offs, y.to(dtype), mask=mask)


@triton.jit
def dyt_bwd_form_kernel(dy_ptr, x_ptr, alpha_ptr, gamma_ptr, dx_ptr, partial_ptr, M, N,
                        rows_per_program, n_col_blocks, BLOCK_N: tl.constexpr,
                        ROWS: tl.constexpr, TANH: tl.constexpr):
    """Candidate: dyt_bwd_kernel with the tanh form TANH, and the partial sums kept as
    (BLOCK_N,) vectors (each tile summed over its rows as it comes) instead of (ROWS,
    BLOCK_N) tiles: fewer registers, a different fp32 summation order."""
    dtype = dx_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = cb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    alpha = tl.load(alpha_ptr).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dg = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    da = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(row_start, row_end, ROWS):
        rows = start + tl.arange(0, ROWS)
        mask = (rows < row_end)[:, None] & col_mask[None, :]
        offs = rows[:, None] * N + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        t = _tanh_form(alpha * x, TANH)
        s = (1.0 - t * t) * (dy * gamma[None, :])
        tl.store(dx_ptr + offs, (alpha * s).to(dtype), mask=mask)
        dg += tl.sum(dy * t, axis=0)
        db += tl.sum(dy, axis=0)
        da += tl.sum(x * s, axis=0)
    part = partial_ptr + pid * (2 * N + n_col_blocks)
    tl.store(part + cols, dg, mask=col_mask)
    tl.store(part + N + cols, db, mask=col_mask)
    tl.store(part + 2 * N + cb, tl.sum(da, axis=0))


def bwd_grid(m, n, block, rows, per_sm, sms):
    """The launcher's backward grid (csrc/ops/dyt/dyt_cuda.cpp) for per_sm programs per
    multiprocessor: (programs, column blocks, rows per program)."""
    col_blocks = triton.cdiv(n, block)
    tiles = triton.cdiv(m, rows)
    want = max(1, triton.cdiv(per_sm * sms, col_blocks))
    rpp = triton.cdiv(tiles, min(tiles, want)) * rows
    return triton.cdiv(m, rpp), col_blocks, rpp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    T.add_device_args(ap)
    args = ap.parse_args()
    dev, cpu = args.device, args.device != "cuda"
    sms = T.setup(dev)
    m, n = args.rows, args.hidden
    dt = torch.bfloat16
    esz = 2
    x = torch.randn(m, n, device=dev, dtype=dt) * 2
    alpha = torch.tensor([0.7], device=dev)
    gamma = (1 + 0.1 * torch.randn(n, device=dev))
    beta = 0.1 * torch.randn(n, device=dev)
    dy = torch.randn_like(x)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    fwd_bytes, bwd_bytes = 2 * m * n * esz, 3 * m * n * esz
    print(f"dyt {m} x {n} bf16, float32 parameters", flush=True)
    if not cpu:
        T.timed("torch copy of x", lambda: y.copy_(x), fwd_bytes)
    lib_fwd = K._FWD_BUCKETS[-1] if n >= 1024 else K._FWD_BUCKETS[0]
    lib_bwd = K._BWD_BUCKETS[-1] if n >= 1024 else K._BWD_BUCKETS[0]
    tanh_forms = (1,) if cpu else (1, 2)

    def fwd(block, rows, warps, form=None):
        grid = (triton.cdiv(m, rows), triton.cdiv(n, block))
        if form is None:
            return lambda: K.dyt_fwd_kernel[grid](x, alpha, gamma, beta, y, m, n, 1,
                                                  BLOCK_N=block, ROWS=rows, num_warps=warps)
        return lambda: dyt_fwd_form_kernel[grid](x, alpha, gamma, beta, y, m, n, 1,
                                                 BLOCK_N=block, ROWS=rows, TANH=form,
                                                 num_warps=warps)

    def bwd(block, rows, warps, per_sm, form=None):
        programs, col_blocks, rpp = bwd_grid(m, n, block, rows, per_sm, sms)
        part = torch.empty(programs, 2 * n + col_blocks, device=dev)
        kernel = K.dyt_bwd_kernel if form is None else dyt_bwd_form_kernel
        extra = {} if form is None else {"TANH": form}
        return (lambda: kernel[(programs, col_blocks)](
            dy, x, alpha, gamma, dx, part, m, n, rpp, col_blocks, BLOCK_N=block, ROWS=rows,
            num_warps=warps, **extra)), part, programs, col_blocks

    def grads(part, programs, col_blocks):
        """dalpha, dgamma, dbeta from the partials (the library's reduction kernel)."""
        da = torch.empty(1, device=dev)
        dg, db = torch.empty(n, device=dev), torch.empty(n, device=dev)
        rb, rn, rw = K.REDUCE_BLOCK
        K.dyt_reduce_kernel[(triton.cdiv(n, rn) + 1,)](part, da, dg, db, programs, n,
                                                       col_blocks, 1, BLOCK_P=rb,
                                                       BLOCK_N=rn, num_warps=rw)
        return da, dg, db

    # checks: each candidate form against the library kernels at the library's configuration
    fwd(*lib_fwd)()
    y_ref = y.clone()
    run, part, programs, col_blocks = bwd(*lib_bwd, 4)
    run()
    dx_ref, g_ref = dx.clone(), grads(part, programs, col_blocks)
    for form in (0,) + tanh_forms:
        # a bf16 rounding apart at most (an absolute 1e-5 where y cancels to near 0); the
        # approximate tanh: its 2^-11 relative error on top
        fwd(*lib_fwd, form=form)()
        T.check(f"forward TANH={form}", y, y_ref, atol=1e-5 if form != 2 else 4e-3,
                rtol=2 ** -7)
        run, part, programs, col_blocks = bwd(*lib_bwd, 4, form=form)
        run()
        T.check(f"backward TANH={form} dx", dx, dx_ref, atol=1e-2 if form == 2 else 1e-6,
                rtol=2 ** -7)
        # fp32 sums in another order; with tanh.approx, per-element errors of about 1e-3
        # in 1 - t^2 that add up over the rows (dalpha: over every element)
        T.check(f"backward TANH={form} dalpha, dgamma, dbeta", grads(part, programs, col_blocks),
                g_ref, atol=1e-3 * m ** 0.5, rtol=2e-2 if form == 2 else 1e-4)
    if cpu:
        return

    print(f"-- forward, library kernel (library: BLOCK_N, ROWS, warps = {lib_fwd})", flush=True)
    best = None
    for block, rows, warps in ((256, 16, 4), (512, 8, 4), (1024, 4, 4), (1024, 4, 8),
                               (1024, 8, 8), (2048, 2, 8), (2048, 4, 8), (4096, 1, 8),
                               (4096, 2, 16), (1024, 16, 16)):
        if args.quick and (block, rows, warps) not in ((1024, 4, 4), (2048, 2, 8)):
            continue
        ms = T.timed(f"fwd BLOCK_N={block:4d} ROWS={rows:2d} warps={warps:2d}",
                     fwd(block, rows, warps), fwd_bytes)
        if ms is not None and (best is None or ms < best[0]):
            best = (ms, (block, rows, warps))
    print(f"-- forward, tanh forms at the best configuration {best[1]}", flush=True)
    for form in (0,) + tanh_forms:
        T.timed(f"fwd TANH={form} {best[1]}", fwd(*best[1], form=form), fwd_bytes)

    print(f"-- backward kernel (library: BLOCK_N, ROWS, warps = {lib_bwd}, 4 programs / SM)",
          flush=True)
    best = None
    cfgs = ((256, 16, 8), (1024, 4, 8), (1024, 4, 4), (1024, 8, 8), (2048, 2, 8),
            (2048, 4, 16), (4096, 1, 8), (4096, 2, 16))
    for block, rows, warps in cfgs[1:3] if args.quick else cfgs:
        for per_sm in (2, 4, 8):
            ms = T.timed(f"bwd BLOCK_N={block:4d} ROWS={rows:2d} warps={warps:2d} "
                         f"per_sm={per_sm}", bwd(block, rows, warps, per_sm)[0], bwd_bytes)
            if ms is not None and (best is None or ms < best[0]):
                best = (ms, (block, rows, warps, per_sm))
    print(f"-- backward, forms at the best configuration {best[1]}", flush=True)
    for form in (0,) + tanh_forms:
        T.timed(f"bwd TANH={form} (vector partials) {best[1]}", bwd(*best[1], form=form)[0],
                bwd_bytes)
    run, part, programs, col_blocks = bwd(*best[1])
    T.timed(f"parameter-gradient reduction ({programs} partial rows)",
            lambda: grads(part, programs, col_blocks), part.numel() * 4)


if __name__ == "__main__":
    main()
