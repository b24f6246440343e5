"""Sweep the group_norm kernels with Triton's JIT (tuning only; the library uses the AOT
variants in triton_src/group_norm.py): tile (BLOCK_C, BLOCK_HW, warps), the persistent
grid's programs (the launcher caps the groups in flight by a 32 MB L2 budget) and
num_stages, forward and backward, and candidate forms of the second pass over each group
(walked in reverse, so the tiles read last in pass 1 are re-read first while they are
still in L2; with or without the eviction hints). Prints the median time and the fraction
of the measured copy bandwidth at one shape, forward (x read, y written) and backward
(x, dy read, dx written; the dweight / dbias reduction timed apart) separately.

    python benchmarks/tune_group_norm.py [--shape 32,512,4096] [--groups 32] [--quick]
    TRITON_INTERPRET=1 python benchmarks/tune_group_norm.py --device cpu --shape 3,12,37 \
        --groups 2
"""
import argparse

import torch
import triton
import triton.language as tl

import _tune as T
import group_norm as K  # noqa: E402 (triton_src on the path through _tune)


@triton.jit
def _tile(k, nh, nt, REVERSE: tl.constexpr):
    """(channel tile, position tile) of step k of nt over a (.., nh) tile grid."""
    kk = nt - 1 - k if REVERSE else k
    return kk // nh, kk % nh


@triton.jit
def group_norm_fwd_form_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, groups, G, Cg,
                               HW, eps, has_w, has_b, BLOCK_C: tl.constexpr,
                               BLOCK_HW: tl.constexpr, REVERSE: tl.constexpr,
                               HINTS: tl.constexpr):
    """Candidate: group_norm_fwd_kernel with the normalize pass walking the group's tiles in
    reverse (REVERSE) and the evict-last / evict-first hints on or off (HINTS). The same
    arithmetic as the library kernel: results equal to it."""
    dtype = y_ptr.dtype.element_ty
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    ci = tl.arange(0, BLOCK_C)
    hi = tl.arange(0, BLOCK_HW)
    n = Cg * HW
    n64 = n.to(tl.int64)
    inv_n = 1.0 / n.to(tl.float32)
    nh = tl.cdiv(HW, BLOCK_HW)
    nt = tl.cdiv(Cg, BLOCK_C) * nh
    for grp in range(pid, groups, step):
        base = grp * n64
        xg = x_ptr + base
        yg = y_ptr + base
        shift = tl.load(xg).to(tl.float32)
        s1 = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
        s2 = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
        for c0 in range(0, Cg, BLOCK_C):
            cc = c0 + ci
            rows = cc[:, None] * HW
            for h0 in range(0, HW, BLOCK_HW):
                hh = h0 + hi
                mask = (cc < Cg)[:, None] & (hh < HW)[None, :]
                if HINTS:
                    x = tl.load(xg + rows + hh[None, :], mask=mask, other=0.0,
                                eviction_policy="evict_last").to(tl.float32)
                else:
                    x = tl.load(xg + rows + hh[None, :], mask=mask, other=0.0).to(tl.float32)
                d = tl.where(mask, x - shift, 0.0)
                s1 += d
                s2 += d * d
        m1 = tl.sum(s1) * inv_n
        var = tl.maximum(tl.sum(s2) * inv_n - m1 * m1, 0.0)
        mean = shift + m1
        rstd = 1.0 / tl.sqrt(var + eps)
        tl.store(mean_ptr + grp, mean)
        tl.store(rstd_ptr + grp, rstd)
        ch0 = (grp % G) * Cg
        for k in range(0, nt):
            tc, th = _tile(k, nh, nt, REVERSE)
            cc = tc * BLOCK_C + ci
            cmask = cc < Cg
            w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0), other=1.0).to(tl.float32)
            b = tl.load(b_ptr + ch0 + cc, mask=cmask & (has_b != 0), other=0.0).to(tl.float32)
            scale = w * rstd
            shift_c = b - mean * scale
            hh = th * BLOCK_HW + hi
            mask = cmask[:, None] & (hh < HW)[None, :]
            offs = cc[:, None] * HW + hh[None, :]
            if HINTS:
                x = tl.load(xg + offs, mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
            else:
                x = tl.load(xg + offs, mask=mask, other=0.0).to(tl.float32)
            y = x * scale[:, None] + shift_c[:, None]
            tl.store(yg + offs, y.to(dtype), mask=mask)


@triton.jit
def group_norm_bwd_form_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
                               groups, G, Cg, HW, has_w, want_dx, BLOCK_C: tl.constexpr,
                               BLOCK_HW: tl.constexpr, REVERSE: tl.constexpr):
    """Candidate: group_norm_bwd_kernel with the dx pass walking the group's tiles in
    reverse (REVERSE). The same arithmetic as the library kernel: results equal to it."""
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
        dxg = dx_ptr + base
        mean = tl.load(mean_ptr + grp)
        rstd = tl.load(rstd_ptr + grp)
        ch0 = (grp % G) * Cg
        pg = partial_ptr + grp * Cg.to(tl.int64)
        a = 0.0
        bs = 0.0
        for c0 in range(0, Cg, BLOCK_C):
            cc = c0 + ci
            cmask = cc < Cg
            rows = cc[:, None] * HW
            acc_s = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
            acc_d = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
            for h0 in range(0, HW, BLOCK_HW):
                hh = h0 + hi
                mask = cmask[:, None] & (hh < HW)[None, :]
                offs = rows + hh[None, :]
                x = tl.load(xg + offs, mask=mask, other=0.0,
                            eviction_policy="evict_last").to(tl.float32)
                dy = tl.load(dyg + offs, mask=mask, other=0.0,
                             eviction_policy="evict_last").to(tl.float32)
                acc_s += dy * tl.where(mask, (x - mean) * rstd, 0.0)
                acc_d += dy
            sc = tl.sum(acc_s, axis=1)
            dc = tl.sum(acc_d, axis=1)
            tl.store(pg + cc, sc, mask=cmask)
            tl.store(pg + plane + cc, dc, mask=cmask)
            w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0), other=1.0).to(tl.float32)
            w = tl.where(cmask, w, 0.0)
            a += tl.sum(w * sc)
            bs += tl.sum(w * dc)
        if want_dx != 0:
            ka = a * inv_n
            kb = bs * inv_n
            for k in range(0, nt):
                tc, th = _tile(k, nh, nt, REVERSE)
                cc = tc * BLOCK_C + ci
                cmask = cc < Cg
                w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0),
                            other=1.0).to(tl.float32)
                hh = th * BLOCK_HW + hi
                mask = cmask[:, None] & (hh < HW)[None, :]
                offs = cc[:, None] * HW + hh[None, :]
                x = tl.load(xg + offs, mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                dy = tl.load(dyg + offs, mask=mask, other=0.0,
                             eviction_policy="evict_first").to(tl.float32)
                xhat = (x - mean) * rstd
                dx = rstd * (dy * w[:, None] - (xhat * ka + kb))
                tl.store(dxg + offs, dx.to(dtype), mask=mask)


# The launcher's tiles (csrc/ops/group_norm/group_norm_cuda.cpp, kTiles): (elements, most
# programs per multiprocessor); the warps per tile from triton_src/group_norm.py.
LAUNCHER_TILES = ((1024, 8), (8192, 2))


def library_tile(cg, hw):
    """The launcher's choice: the (BLOCK_C, BLOCK_HW, warps) wasting the fewest masked lanes
    (ties: the later, larger one), and its most programs per multiprocessor."""
    warps = dict(K.TILES)
    best, best_lanes = None, None
    for elems, most in LAUNCHER_TILES:
        for h in K.HW_BUCKETS:
            if h > elems:
                continue
            c = elems // h
            lanes = triton.cdiv(hw, h) * h * triton.cdiv(cg, c) * c
            if best is None or lanes <= best_lanes:
                best, best_lanes = ((c, h, warps[elems]), most), lanes
    return best


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
    dt, esz = torch.bfloat16, 2
    x = torch.randn(bsz, c, hw, device=dev, dtype=dt) * 2 + 0.5
    w = 1 + 0.1 * torch.randn(c, device=dev)
    b = 0.1 * torch.randn(c, device=dev)
    dy = torch.randn_like(x)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    mean = torch.empty(groups, device=dev)
    rstd = torch.empty(groups, device=dev)
    partial = torch.empty(2, bsz * c, device=dev)
    group_bytes = cg * hw * esz
    fwd_bytes = 2 * x.numel() * esz
    bwd_bytes = 3 * x.numel() * esz
    print(f"group_norm x ({bsz}, {c}, {hw}) bf16, {g} groups: {groups} groups of "
          f"{group_bytes} bytes", flush=True)
    if not cpu:
        T.timed("torch copy of x", lambda: y.copy_(x), fwd_bytes)

    def programs(per_sm, nbytes, budget=32 << 20):
        """The launcher's grid: as many programs as the L2 budget holds groups, clamped to
        [sms, per_sm * sms] and to the number of groups."""
        return min(groups, max(sms, min(budget // max(nbytes, 1), per_sm * sms)))

    def fwd(bc, bh, warps, progs, stages=None, form=None):
        kw = {"BLOCK_C": bc, "BLOCK_HW": bh, "num_warps": warps}
        if stages is not None:
            kw["num_stages"] = stages
        args_ = (x, w, b, y, mean, rstd, groups, g, cg, hw, 1e-5, 1, 1)
        if form is None:
            return lambda: K.group_norm_fwd_kernel[(progs,)](*args_, **kw)
        return lambda: group_norm_fwd_form_kernel[(progs,)](*args_, REVERSE=form[0],
                                                            HINTS=form[1], **kw)

    def bwd(bc, bh, warps, progs, stages=None, reverse=None):
        kw = {"BLOCK_C": bc, "BLOCK_HW": bh, "num_warps": warps}
        if stages is not None:
            kw["num_stages"] = stages
        args_ = (dy, x, w, mean, rstd, dx, partial, groups, g, cg, hw, 1, 1)
        if reverse is None:
            return lambda: K.group_norm_bwd_kernel[(progs,)](*args_, **kw)
        return lambda: group_norm_bwd_form_kernel[(progs,)](*args_, REVERSE=reverse, **kw)

    def reduce():
        dw, db = torch.empty(c, device=dev), torch.empty(c, device=dev)
        K.group_norm_reduce_kernel[(triton.cdiv(c, K.REDUCE_C),)](
            partial, dw, db, bsz, c, 1, 1, BLOCK_B=K.REDUCE_B, BLOCK_C=K.REDUCE_C, num_warps=4)
        return dw, db

    if cpu:
        lib, most = (4, 8, 4), 2  # small tiles crossing channel and position edges
    else:
        lib, most = library_tile(cg, hw)
    lib_fwd_p = programs(most, group_bytes)
    lib_bwd_p = programs(max(1, most // 2), 2 * group_bytes)

    # checks: every candidate form equals the library kernel (the same arithmetic)
    fwd(*lib, lib_fwd_p)()
    y_ref, mean_ref, rstd_ref = y.clone(), mean.clone(), rstd.clone()
    bwd(*lib, lib_bwd_p)()
    dx_ref, g_ref = dx.clone(), reduce()
    for rev in (0, 1):
        for hints in (0, 1):
            fwd(*lib, lib_fwd_p, form=(rev, hints))()
            # equal expected; a bf16 rounding of y / dx is let through in case the compiler
            # contracts the arithmetic into FMAs differently
            T.check(f"forward REVERSE={rev} HINTS={hints} mean, rstd", [mean, rstd],
                    [mean_ref, rstd_ref], atol=0.0)
            T.check(f"forward REVERSE={rev} HINTS={hints} y", y, y_ref, atol=1e-6,
                    rtol=2 ** -7)
        mean.copy_(mean_ref)
        rstd.copy_(rstd_ref)
        bwd(*lib, lib_bwd_p, reverse=rev)()
        T.check(f"backward REVERSE={rev} dweight, dbias", reduce(), g_ref, atol=0.0)
        T.check(f"backward REVERSE={rev} dx", dx, dx_ref, atol=1e-6, rtol=2 ** -7)
    if cpu:
        return

    print(f"-- forward (library: BLOCK_C, BLOCK_HW, warps = {lib}, {lib_fwd_p} programs)",
          flush=True)
    tiles = [lib] if args.quick else [lib, (1, 4096, 8), (2, 2048, 8), (4, 1024, 8),
                                      (2, 4096, 32), (1, 8192, 16)]
    tiles = [t for t in tiles if t[0] <= cg and t[1] <= triton.next_power_of_2(hw)]
    best = None
    for t in tiles:
        seen = set()
        for per_sm in (1, 2, 4):
            for budget_mb in (16, 32, 48):
                p = programs(per_sm, group_bytes, budget_mb << 20)
                if p in seen:
                    continue
                seen.add(p)
                ms = T.timed(f"fwd tile={t} per_sm={per_sm} L2 budget {budget_mb} MB "
                             f"({p} programs)", fwd(*t, p), fwd_bytes)
                if ms is not None and (best is None or ms < best[0]):
                    best = (ms, t, p)
    _, t, p = best
    print(f"-- forward forms at the best ({t}, {p} programs)", flush=True)
    for stages in (1, 2, 3):
        T.timed(f"fwd num_stages={stages}", fwd(*t, p, stages=stages), fwd_bytes)
    for rev in (0, 1):
        for hints in (0, 1):
            T.timed(f"fwd REVERSE={rev} HINTS={hints}", fwd(*t, p, form=(rev, hints)),
                    fwd_bytes)
    mean.copy_(mean_ref)
    rstd.copy_(rstd_ref)

    print(f"-- backward (library: {lib}, {lib_bwd_p} programs)", flush=True)
    best = None
    for t in tiles:
        seen = set()
        for per_sm in (1, 2, 4):
            for budget_mb in (16, 32, 48):
                p = programs(per_sm, 2 * group_bytes, budget_mb << 20)
                if p in seen:
                    continue
                seen.add(p)
                ms = T.timed(f"bwd tile={t} per_sm={per_sm} L2 budget {budget_mb} MB "
                             f"({p} programs)", bwd(*t, p), bwd_bytes)
                if ms is not None and (best is None or ms < best[0]):
                    best = (ms, t, p)
    _, t, p = best
    print(f"-- backward forms at the best ({t}, {p} programs)", flush=True)
    for stages in (1, 2, 3):
        T.timed(f"bwd num_stages={stages}", bwd(*t, p, stages=stages), bwd_bytes)
    for rev in (0, 1):
        T.timed(f"bwd REVERSE={rev}", bwd(*t, p, reverse=rev), bwd_bytes)
    T.timed("dweight / dbias reduction", reduce, partial.numel() * 4)


if __name__ == "__main__":
    main()
