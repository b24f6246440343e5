"""Why group_norm's prefetching backward was 10 % faster under the JIT and not as a library
variant (benchmarks/NOTES.md v21): the same kernels timed in three contexts.

The JIT probe (tune_group_norm.py) timed each kernel alone with triton.testing.do_bench,
which clears L2 before every launch; the library's benchmark times the forward and the
backward back to back. Compiled for sm_90 both ways the prefetching kernel's code is the
same (NOTES v21), so this probe keeps the code fixed and changes the context:

  alone, L2 cleared   do_bench of the backward kernel (the tune script's number);
  alone, back to back the backward launched 20 times in a row, CUDA events around them;
  after the forward   20 (forward, backward) pairs minus 20 forwards: the backward's share
                      of the benchmark's sequence;
  library op          the same pairs through torch.ops.fk (the AOT variants: the library's
                      two-pass backward), for comparison with the JIT's two-pass kernel.

for the library's two-pass backward (JIT) and the prefetching form, at the launcher's tile
and grid. Both are checked equal first. ``--device cpu`` under TRITON_INTERPRET=1 runs the
check only, at a small shape with partial tiles.

    python benchmarks/probes/group_norm_context.py [--shape 32,512,4096] [--groups 32]
    TRITON_INTERPRET=1 python benchmarks/probes/group_norm_context.py --device cpu \
        --shape 3,12,37 --groups 2
"""
import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import _tune as T  # noqa: E402
import group_norm as K  # noqa: E402 (triton_src on the path through _tune)
from tune_group_norm import library_tile  # noqa: E402


@triton.jit
def _load_tile(g_ptr, k, valid, nh, Cg, HW, ci, hi, BLOCK_C: tl.constexpr,
               BLOCK_HW: tl.constexpr, POLICY: tl.constexpr):
    """Tile k (channel-major) of a group in its stored dtype; 0 outside the group and where
    ``valid`` is false."""
    cc = (k // nh) * BLOCK_C + ci
    hh = (k % nh) * BLOCK_HW + hi
    mask = (cc < Cg)[:, None] & (hh < HW)[None, :] & valid
    return tl.load(g_ptr + cc[:, None] * HW + hh[None, :], mask=mask, other=0.0,
                   eviction_policy=POLICY)


@triton.jit
def bwd_prefetch_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr, groups,
                        G, Cg, HW, has_w, want_dx, BLOCK_C: tl.constexpr,
                        BLOCK_HW: tl.constexpr):
    """group_norm_bwd_kernel with each pass loading tile k + 1 of x and dy before it uses
    tile k (one loop over a group's tiles); the same arithmetic in the same order."""
    dtype = dx_ptr.dtype.element_ty
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    ci = tl.arange(0, BLOCK_C)
    hi = tl.arange(0, BLOCK_HW)
    n = Cg * HW
    n64 = n.to(tl.int64)
    inv_n = 1.0 / n.to(tl.float32)
    plane = groups.to(tl.int64) * Cg
    nh = tl.cdiv(HW, BLOCK_HW)
    nt = tl.cdiv(Cg, BLOCK_C) * nh
    for grp in range(pid, groups, step):
        base = grp * n64
        xg = x_ptr + base
        dyg = dy_ptr + base
        mean = tl.load(mean_ptr + grp)
        rstd = tl.load(rstd_ptr + grp)
        ch0 = (grp % G) * Cg
        pg = partial_ptr + grp * Cg.to(tl.int64)
        a = 0.0
        bs = 0.0
        acc_s = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
        acc_d = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
        nx = _load_tile(xg, 0, True, nh, Cg, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_last")
        ndy = _load_tile(dyg, 0, True, nh, Cg, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_last")
        for k in range(0, nt):
            cx = nx
            cdy = ndy
            nx = _load_tile(xg, k + 1, k + 1 < nt, nh, Cg, HW, ci, hi, BLOCK_C, BLOCK_HW,
                            "evict_last")
            ndy = _load_tile(dyg, k + 1, k + 1 < nt, nh, Cg, HW, ci, hi, BLOCK_C, BLOCK_HW,
                             "evict_last")
            cc = (k // nh) * BLOCK_C + ci
            cmask = cc < Cg
            hh = (k % nh) * BLOCK_HW + hi
            mask = cmask[:, None] & (hh < HW)[None, :]
            d = cdy.to(tl.float32)
            acc_s += d * tl.where(mask, (cx.to(tl.float32) - mean) * rstd, 0.0)
            acc_d += d
            if k % nh == nh - 1:  # the channel block's sums are complete
                da, db = K.block_sums(acc_s, acc_d, pg, plane, cc, cmask, w_ptr, ch0, has_w)
                a += da
                bs += db
                acc_s = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
                acc_d = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
        if want_dx != 0:
            ka = a * inv_n
            kb = bs * inv_n
            nx = _load_tile(xg, 0, True, nh, Cg, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_first")
            ndy = _load_tile(dyg, 0, True, nh, Cg, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_first")
            for k in range(0, nt):
                cx = nx
                cdy = ndy
                nx = _load_tile(xg, k + 1, k + 1 < nt, nh, Cg, HW, ci, hi, BLOCK_C, BLOCK_HW,
                                "evict_first")
                ndy = _load_tile(dyg, k + 1, k + 1 < nt, nh, Cg, HW, ci, hi, BLOCK_C,
                                 BLOCK_HW, "evict_first")
                cc = (k // nh) * BLOCK_C + ci
                cmask = cc < Cg
                hh = (k % nh) * BLOCK_HW + hi
                mask = cmask[:, None] & (hh < HW)[None, :]
                w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0),
                            other=1.0).to(tl.float32)
                xhat = (cx.to(tl.float32) - mean) * rstd
                dx = rstd * (cdy.to(tl.float32) * w[:, None] - (xhat * ka + kb))
                tl.store(dx_ptr + base + cc[:, None] * HW + hh[None, :], dx.to(dtype),
                         mask=mask)


def events_ms(fn, reps=20, rounds=7):
    """Median over rounds of (CUDA-event time of reps calls of fn) / reps, in ms."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="32,512,4096", help="batch, channels, positions")
    ap.add_argument("--groups", type=int, default=32)
    T.add_device_args(ap)
    args = ap.parse_args()
    dev, cpu = args.device, args.device != "cuda"
    sms = T.setup(dev)
    bsz, c, hw = (int(s) for s in args.shape.split(","))
    g = args.groups
    cg, groups = c // g, bsz * g
    x = torch.randn(bsz, c, hw, device=dev, dtype=torch.bfloat16) * 2 + 0.5
    w = 1 + 0.1 * torch.randn(c, device=dev)
    b = 0.1 * torch.randn(c, device=dev)
    dy = torch.randn_like(x)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    mean = torch.empty(groups, device=dev)
    rstd = torch.empty(groups, device=dev)
    partial = torch.empty(2, bsz * c, device=dev)
    group_bytes = cg * hw * 2
    if cpu:
        (bc, bh, warps), most = (4, 8, 4), 2  # partial tiles across channel and position edges
    else:
        (bc, bh, warps), most = library_tile(cg, hw)
    kw = {"BLOCK_C": bc, "BLOCK_HW": bh, "num_warps": warps}
    fwd_p = min(groups, max(sms, min((32 << 20) // group_bytes, most * sms)))
    bwd_p = min(groups, max(sms, min((32 << 20) // (2 * group_bytes), max(1, most // 2) * sms)))

    def fwd():
        K.group_norm_fwd_kernel[(fwd_p,)](x, w, b, y, mean, rstd, groups, g, cg, hw, 1e-5, 1,
                                          1, **kw)

    def bwd(kernel, progs=bwd_p):
        return lambda: kernel[(progs,)](dy, x, w, mean, rstd, dx, partial, groups, g, cg, hw,
                                        1, 1, **kw)

    fwd()
    bwd(K.group_norm_bwd_kernel)()
    ref = (dx.clone(), partial.clone())
    for progs in sorted({bwd_p, max(1, groups // 3), 4, groups}):  # uneven counts too
        dx.fill_(float("nan"))
        partial.fill_(float("nan"))
        bwd(bwd_prefetch_kernel, progs)()
        same = torch.equal(dx, ref[0]) and torch.equal(partial, ref[1])
        print(f"prefetching backward ({progs} programs) equal to the library kernel: {same}",
              flush=True)
        if not same:
            raise SystemExit("prefetching backward WRONG")
    if cpu:
        return
    nbytes = 3 * x.numel() * 2
    print(f"group_norm x ({bsz}, {c}, {hw}) bf16, {g} groups; tile ({bc}, {bh}) at {warps} "
          f"warps, forward {fwd_p} / backward {bwd_p} programs; backward floor "
          f"{nbytes / T.COPY_BW / 1e3:.1f} us", flush=True)
    fwd_ms = events_ms(fwd)
    import fk  # the library's AOT variants, through the op

    xg = x.clone().requires_grad_()
    wg, bg = w.to(x.dtype).requires_grad_(), b.to(x.dtype).requires_grad_()

    def library_step():
        xg.grad = wg.grad = bg.grad = None  # no accumulation kernels
        fk.group_norm(xg, wg, bg, g).backward(dy)

    lib_ms = events_ms(library_step)
    print(f"forward alone, back to back: {fwd_ms * 1e3:7.1f} us", flush=True)
    print(f"library op forward + backward (AOT two-pass, per step, events): "
          f"{lib_ms * 1e3:7.1f} us", flush=True)
    for name, kernel in (("two-pass (library, JIT)", K.group_norm_bwd_kernel),
                         ("prefetching (JIT)", bwd_prefetch_kernel)):
        run = bwd(kernel)
        alone_flushed = T.bench(run)
        alone = events_ms(run)

        def pair(run=run):
            fwd()
            run()

        after = events_ms(pair) - fwd_ms
        print(f"backward {name:24s} alone, L2 cleared {alone_flushed * 1e3:7.1f} us; alone, "
              f"back to back {alone * 1e3:7.1f} us; after the forward {after * 1e3:7.1f} us "
              f"({100 * nbytes / after / 1e6 / T.COPY_BW:.1f} % of copy)", flush=True)


if __name__ == "__main__":
    main()
