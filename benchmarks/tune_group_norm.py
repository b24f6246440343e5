"""Sweep the group_norm kernels with Triton's JIT (tuning only; the library uses the AOT
variants in triton_src/group_norm.py): tile (BLOCK_C, BLOCK_HW, warps), the persistent
grid's programs (the launcher caps the groups in flight by a 32 MB L2 budget) and
num_stages, forward and backward, and candidate forms of the second pass over each group
(walked in reverse, so the tiles read last in pass 1 are re-read first while they are
still in L2; with or without the eviction hints). Prints the median time and the fraction
of the measured copy bandwidth at one shape, forward (x read, y written) and backward
(x, dy read, dx written; the dweight / dbias reduction timed apart) separately.

Last, a one-pass form of the backward (group_norm_bwd_cluster_kernel): each group split
over a thread-block cluster of CL = 2, 4 or 8 programs, each holding its share of the
group's x and dy in registers while the cluster exchanges two sums per program through
distributed shared memory, so x and dy are read from DRAM once (floor: 3 x 2 bytes an
element at copy bandwidth: 403 MB, 134 us at (32, 512, 4096) bf16 on a 3.0 TB/s H100).
Swept over CL x the split of the cluster into channel x position ranges (which sets the
per-program tile) x warps x the grid (1, 2, 4 programs per SM, or one cluster per group), each
configuration first checked against the library kernel and a float64 torch reference, and
printed next to the library kernel's time; its reduction over CL_HW times the rows is timed
apart. --cluster-only runs the checks and this part only. Under the interpreter the
cluster exchange is emulated (_tune.ClusterExchangeEmulation) and the form's numbers are
checked at the given shape for several splits (uneven and empty ranges among them).

    python benchmarks/tune_group_norm.py [--shape 32,512,4096] [--groups 32] [--quick]
                                         [--cluster-only]
    TRITON_INTERPRET=1 python benchmarks/tune_group_norm.py --device cpu --shape 3,12,37 \
        --groups 2
"""
import argparse

import torch
import triton
import triton.language as tl

import _tune as T
import group_norm as K  # noqa: E402 (triton_src on the path through _tune)
from cross_entropy import _cluster_arrive, _cluster_exchange  # noqa: E402, F401


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
        a, bs = K.two_pass_sums(xg, dyg, mean, rstd, pg, plane, w_ptr, ch0, has_w, Cg, HW, ci,
                                hi, BLOCK_C, BLOCK_HW)
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


@triton.jit
def group_norm_bwd_cluster_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
                                  groups, G, Cg, HW, has_w, want_dx, BLOCK_C: tl.constexpr,
                                  BLOCK_HW: tl.constexpr, CL: tl.constexpr,
                                  CL_HW: tl.constexpr):
    """Candidate: the backward in one pass over x and dy. Each group is split over the CL
    programs of one thread-block cluster (launched with the cluster attribute; the grid a
    multiple of CL, each cluster walking groups pid // CL, + grid / CL, ...; at most
    `groups` clusters, so that every program's _cluster_arrive is matched by the wait of
    its first exchange): CL_HW position ranges of hs = cdiv(HW, 16 CL_HW) * 16 positions
    (a multiple of 16, so the loads stay vectorizable; the last ranges may be short or
    empty) times CL / CL_HW channel ranges of cs = cdiv(Cg, CL / CL_HW) channels; cluster
    rank r holds channel range r // CL_HW and position range r % CL_HW as one
    (BLOCK_C >= cs, BLOCK_HW >= min(hs, HW)) tile of x and one of dy, loaded once and kept
    in registers. Each program sums w_c S_c and w_c D_c
    over its tile, the cluster exchanges these two floats through distributed shared memory
    (cross_entropy's _cluster_exchange: one hardware cluster barrier per group), each
    program adds the CL pairs in rank order (so every program of the cluster gets the same
    A and Bs) and writes dx of its tile from the values it holds.

    partial: fp32 (2, B * CL_HW, C): row b * CL_HW + r % CL_HW holds the sums S_c / D_c of
    batch b over position range r % CL_HW only, so group_norm_reduce_kernel run with
    B * CL_HW rows gives dweight / dbias (CL_HW = 1: the library's (2, B * C) layout). The
    sums are the library's up to the order of the fp32 additions."""
    dtype = dx_ptr.dtype.element_ty
    pid = tl.program_id(0)
    rank = _cluster_arrive(pid % CL)
    ci = tl.arange(0, BLOCK_C)
    hi = tl.arange(0, BLOCK_HW)
    inv_n = 1.0 / (Cg * HW).to(tl.float32)
    C = G * Cg
    plane = (groups // G).to(tl.int64) * CL_HW * C
    rh = rank % CL_HW
    cs = tl.cdiv(Cg, CL // CL_HW)
    hs = tl.cdiv(HW, 16 * CL_HW) * 16
    cc = (rank // CL_HW) * cs + ci
    hh = rh * hs + hi
    cmask = (ci < cs) & (cc < Cg)
    mask = cmask[:, None] & ((hi < hs) & (hh < HW))[None, :]
    offs = cc[:, None] * HW + hh[None, :]
    exchanges = 0
    for grp in range(pid // CL, groups, tl.num_programs(0) // CL):
        base = grp * (Cg * HW).to(tl.int64)
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_ptr + base + offs, mask=mask, other=0.0,
                     eviction_policy="evict_first").to(tl.float32)
        mean = tl.load(mean_ptr + grp)
        rstd = tl.load(rstd_ptr + grp)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        sc = tl.sum(dy * xhat, axis=1)
        dc = tl.sum(dy, axis=1)
        g = grp % G
        pg = partial_ptr + ((grp // G).to(tl.int64) * CL_HW + rh) * C + g * Cg
        tl.store(pg + cc, sc, mask=cmask)
        tl.store(pg + plane + cc, dc, mask=cmask)
        w = tl.load(w_ptr + g * Cg + cc, mask=cmask & (has_w != 0), other=1.0).to(tl.float32)
        w = tl.where(cmask, w, 0.0)
        sums = _cluster_exchange(grp, rank, tl.sum(w * sc), tl.sum(w * dc), 0.0, 0.0,
                                 exchanges % 2, (exchanges == 0).to(tl.int32), CL, False)
        exchanges += 1
        a = sums[0]
        bs = sums[CL]
        for j in tl.static_range(1, CL):
            a += sums[j]
            bs += sums[CL + j]
        if want_dx != 0:
            dx = rstd * (dy * w[:, None] - (xhat * (a * inv_n) + bs * inv_n))
            tl.store(dx_ptr + base + offs, dx.to(dtype), mask=mask)


def cluster_tile(cg, hw, cl, cl_hw):
    """The smallest (BLOCK_C, BLOCK_HW) holding one cluster rank's share of a group (see
    group_norm_bwd_cluster_kernel)."""
    cs = triton.cdiv(cg, cl // cl_hw)
    hs = triton.cdiv(hw, 16 * cl_hw) * 16
    return triton.next_power_of_2(cs), triton.next_power_of_2(min(hs, hw))


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


# (BLOCK_B, BLOCK_C, warps) of the dweight / dbias reduction, timed after the backward; the
# first is the library's before v20.
REDUCE_CONFIGS = ((16, 128, 4), (16, 16, 1), (32, 16, 1), (32, 32, 1), (32, 32, 2), (64, 16, 2),
                  (32, 64, 2), (64, 32, 4), (16, 64, 1))


def reference_backward(x, dy, w, groups, eps=1e-5):
    """(dx, dweight, dbias) of torch's group_norm in float64 (autograd), and the scales
    the checks read their absolute tolerances from: max |dx|, and per-channel sums of
    |dy * xhat| and |dy| (bounds of the fp32 sums' rounding)."""
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    b64 = torch.zeros_like(w64, requires_grad=True)
    y = torch.nn.functional.group_norm(x64, groups, w64, b64, eps)
    dx, dw, db = torch.autograd.grad(y, (x64, w64, b64), dy.double())
    with torch.no_grad():
        xg = x64.view(x.shape[0], groups, -1)
        xhat = (xg - xg.mean(-1, keepdim=True)) / torch.sqrt(
            xg.var(-1, unbiased=False, keepdim=True) + eps)
        ady = dy.double().abs()
        scales = (dx.abs().max().item(), (ady * xhat.view(x.shape).abs()).sum((0, 2)).max().item(),
                  ady.sum((0, 2)).max().item())
    return (dx, dw, db), scales


def check_reference(name, dx, grads, ref):
    """dx (bf16) and (dweight, dbias) against reference_backward's: dx within one bf16 ulp
    (2^-7 relative: the interpreter's conversion truncates, the GPU's rounds to nearest)
    plus 1e-5 of max |dx| for the fp32 arithmetic (mean and rstd are the forward's fp32
    ones); the sums within 1e-5 of the sums of the terms' magnitudes."""
    (dx_ref, dw_ref, db_ref), (dx_max, sw_max, sb_max) = ref
    T.check(f"{name} dx against float64 torch", dx, dx_ref, atol=1e-5 * dx_max, rtol=2 ** -7)
    T.check(f"{name} dweight against float64 torch", grads[0], dw_ref, atol=1e-5 * sw_max)
    T.check(f"{name} dbias against float64 torch", grads[1], db_ref, atol=1e-5 * sb_max)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="32,512,4096", help="batch, channels, positions")
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--cluster-only", action="store_true",
                    help="only the one-pass cluster form of the backward (and the library's)")
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

    def reduce(part=partial, rows=bsz, bb=K.REDUCE_B, bc=K.REDUCE_C, warps=K.REDUCE_WARPS):
        dw, db = torch.empty(c, device=dev), torch.empty(c, device=dev)
        K.group_norm_reduce_kernel[(triton.cdiv(c, bc),)](
            part, dw, db, rows, c, 1, 1, BLOCK_B=bb, BLOCK_C=bc, num_warps=warps)
        return dw, db

    def bwd_cluster(cl, cl_hw, warps, clusters, stages=1):
        """The one-pass cluster form on `clusters` clusters of cl programs: (run, its
        (2, bsz * cl_hw * c) partial sums, (registers, spills)). On the GPU the kernel is
        compiled for one CTA a program and launched through Triton's compiled-kernel
        launcher with the cluster size set to cl (the launch attribute), as
        benchmarks/probes/_ce_probe.py does. Under the interpreter the exchange is emulated
        (_tune.ClusterExchangeEmulation) and each run launches twice."""
        assert 1 <= clusters <= groups, "every cluster must meet at least once"
        bc, bh = cluster_tile(cg, hw, cl, cl_hw)
        part = torch.full((2, bsz * cl_hw * c), float("nan"), device=dev)
        args_ = (dy, x, w, mean, rstd, dx, part, groups, g, cg, hw, 1, 1)
        const = {"BLOCK_C": bc, "BLOCK_HW": bh, "CL": cl, "CL_HW": cl_hw}
        kernel = group_norm_bwd_cluster_kernel
        if cpu:
            def run():
                emulation = T.ClusterExchangeEmulation()
                globals()["_cluster_exchange"] = emulation
                globals()["_cluster_arrive"] = emulation.arrive
                for _ in range(2):
                    kernel[(clusters * cl,)](*args_, **const)
            return run, part, None
        k = kernel.warmup(*args_, grid=(clusters * cl,), num_warps=warps, num_stages=stages,
                          **const)
        k._init_handles()
        # The launcher sizes global scratch by the grid it is given (clusters): none wanted.
        if k.metadata.global_scratch_size:
            raise RuntimeError("the cluster form uses global scratch")
        k.packed_metadata = (k.metadata.num_warps, cl, k.metadata.shared)
        return (lambda: k[(clusters, 1, 1)](*args_, *const.values())), part, (k.n_regs,
                                                                              k.n_spills)

    def check_cluster(cl, cl_hw, warps, clusters, ref):
        """Run the cluster form once on poisoned outputs and check dx, dweight and dbias
        against the library kernel's (dx_ref, g_ref: up to a bf16 rounding of dx, and for
        the sums, whose fp32 additions come in another order, the tolerance of
        check_reference) and against the float64 reference. Returns (registers, spills)
        (None under the interpreter)."""
        name = f"backward cluster CL={cl} CL_HW={cl_hw} warps={warps} {clusters} clusters"
        run, part, regs = bwd_cluster(cl, cl_hw, warps, clusters)
        dx.fill_(float("nan"))
        run()
        grads = reduce(part, bsz * cl_hw)
        T.check(f"{name} dx", dx, dx_ref, atol=1e-6, rtol=2 ** -7)
        _, (_, sw_max, sb_max) = ref
        T.check(f"{name} dweight", grads[0], g_ref[0], atol=1e-5 * sw_max)
        T.check(f"{name} dbias", grads[1], g_ref[1], atol=1e-5 * sb_max)
        check_reference(name, dx, grads, ref)
        return regs

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
    ref = reference_backward(x, dy, w, g)
    check_reference("backward library", dx_ref, g_ref, ref)
    for bb, bc, warps in REDUCE_CONFIGS:  # the same fp32 sums, grouped differently
        T.check(f"reduction BLOCK_B={bb} BLOCK_C={bc} warps={warps}",
                reduce(bb=bb, bc=bc, warps=warps), g_ref,
                atol=1e-6 * max(t.abs().max().item() for t in g_ref))

    def cluster_sweep():
        """The one-pass cluster form: x and dy read once (floor: bwd_bytes at the copy
        bandwidth). Per (CL, split of the cluster into channel x position ranges, warps):
        one check against the library and the reference, then the grid: 1, 2 or 4 programs
        per SM (clusters walking groups), or one cluster per group."""
        print(f"-- backward, one pass: each group over a cluster of CL programs holding x and "
              f"dy in registers (floor {bwd_bytes / T.COPY_BW / 1e3:.1f} us at the measured "
              f"copy bandwidth)", flush=True)
        T.timed(f"bwd library {lib}, {lib_bwd_p} programs (for comparison)",
                bwd(*lib, lib_bwd_p), bwd_bytes)
        wrong = []
        for cl in ((4, 8) if args.quick else (2, 4, 8)):
            for cl_hw in [k for k in (1, 2, 4, 8) if k <= cl and cl // k <= cg]:
                if args.quick and cl_hw != cl:
                    continue
                tile = cluster_tile(cg, hw, cl, cl_hw)
                for warps in ((8, 16) if args.quick else (4, 8, 16, 32)):
                    if tile[0] * tile[1] > 64 * 32 * warps:  # > 64 elements of each a thread
                        continue
                    label = (f"bwd cluster CL={cl} split {cl // cl_hw}x{cl_hw} tile={tile} "
                             f"warps={warps:2d}")
                    try:
                        regs = check_cluster(cl, cl_hw, warps,
                                             max(1, min(groups, 2 * sms // cl)), ref)
                    except AssertionError as e:
                        print(f"{label}: WRONG ({e})", flush=True)
                        wrong.append(label)
                        continue
                    except Exception as e:  # noqa: BLE001 - does not compile / launch
                        print(f"{label}: failed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:100]})", flush=True)
                        continue
                    for per_sm in ((1, 2) if args.quick else (1, 2, 4, 0)):
                        clusters = groups if per_sm == 0 else max(
                            1, min(groups, per_sm * sms // cl))
                        run, _, _ = bwd_cluster(cl, cl_hw, warps, clusters)
                        T.timed(f"{label} ({regs[0]} regs, {regs[1]} spills) "
                                f"{f'{per_sm}/SM' if per_sm else 'group/cluster'} "
                                f"({clusters} clusters)", run, bwd_bytes)
        for cl_hw in (2, 4, 8):  # the partial sums of position ranges: cl_hw times the rows
            part = torch.zeros(2, bsz * cl_hw * c, device=dev)
            T.timed(f"dweight / dbias reduction over {bsz * cl_hw} rows (CL_HW={cl_hw})",
                    lambda p=part, r=bsz * cl_hw: reduce(p, r), part.numel() * 4)
        if wrong:
            raise SystemExit(f"cluster form WRONG in: {'; '.join(wrong)}")

    if cpu:
        # the cluster form: uneven position ranges (HW not a multiple of 16 CL_HW), empty
        # ranks (positions or channels), channel splits, clusters walking several groups
        for cl, cl_hw, clusters in ((2, 2, groups), (4, 4, 2), (4, 2, 3), (8, 2, 1),
                                    (8, 1, groups), (2, 1, groups)):
            check_cluster(cl, cl_hw, 4, max(1, min(groups, clusters)), ref)
        return
    if args.cluster_only:
        cluster_sweep()
        return

    print(f"-- forward (library: BLOCK_C, BLOCK_HW, warps = {lib}, {lib_fwd_p} programs)",
          flush=True)
    tiles = [lib] if args.quick else [lib, (1, 4096, 8), (2, 2048, 8), (4, 1024, 8),
                                      (2, 4096, 32), (1, 8192, 16)]
    tiles = [t for t in tiles if t[0] <= cg and t[1] <= triton.next_power_of_2(hw)]

    def best_of(name, make, nbytes, bytes_per_group):
        """(tile, programs) of the fastest of `name` over the tiles and the programs the
        launcher would run for 1, 2 or 4 per multiprocessor and an L2 budget of 16, 32 or
        48 MB (each distinct count timed once)."""
        best = None
        for t in tiles:
            seen = set()
            for per_sm in (1, 2, 4):
                for budget_mb in (16, 32, 48):
                    p = programs(per_sm, bytes_per_group, budget_mb << 20)
                    if p in seen:
                        continue
                    seen.add(p)
                    ms = T.timed(f"{name} tile={t} per_sm={per_sm} L2 budget {budget_mb} MB "
                                 f"({p} programs)", make(*t, p), nbytes)
                    if ms is not None and (best is None or ms < best[0]):
                        best = (ms, t, p)
        return best[1:]

    t, p = best_of("fwd", fwd, fwd_bytes, group_bytes)
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
    t, p = best_of("bwd", bwd, bwd_bytes, 2 * group_bytes)
    print(f"-- backward forms at the best ({t}, {p} programs)", flush=True)
    for stages in (1, 2, 3):
        T.timed(f"bwd num_stages={stages}", bwd(*t, p, stages=stages), bwd_bytes)
    for rev in (0, 1):
        T.timed(f"bwd REVERSE={rev}", bwd(*t, p, reverse=rev), bwd_bytes)
    T.timed("dweight / dbias reduction", reduce, partial.numel() * 4)
    for bb, bc, warps in REDUCE_CONFIGS:
        T.timed(f"dweight / dbias reduction BLOCK_B={bb} BLOCK_C={bc} warps={warps} "
                f"({triton.cdiv(c, bc)} programs)",
                lambda a=(bb, bc, warps): reduce(bb=a[0], bc=a[1], warps=a[2]),
                partial.numel() * 4)
    cluster_sweep()


if __name__ == "__main__":
    main()
