"""Sweep the group_norm kernels with Triton's JIT (tuning only; the library uses the AOT
variants in triton_src/group_norm.py): tile (BLOCK_C, BLOCK_HW, warps), the persistent
grid's programs (the launcher caps the groups in flight by a 32 MB L2 budget) and
num_stages, forward and backward, and candidate forms of the second pass over each group
(walked in reverse, so the tiles read last in pass 1 are re-read first while they are
still in L2; with or without the eviction hints). Prints the median time and the fraction
of the measured copy bandwidth at one shape, forward (x read, y written) and backward
(x, dy read, dx written; the dweight / dbias reduction timed apart) separately. Each
candidate form is first checked against the library kernel, and the library kernels
against float64 torch.

Last, the library's cluster kernels (group_norm_fwd_cluster_kernel and
group_norm_bwd_cluster_kernel: one tile of a group per program, a group per thread-block
cluster; sm_90 and newer), where the launcher takes them at the shape (HW a power of two
from 64 to the tile, Cg a multiple of the tile's channels, 2 to 8 tiles a group): tiles of
4096, 8192 or 16384 elements a program, each where those conditions hold for it (the
cluster size follows from the tile), x 4, 8 or 16 warps, forward and backward, each
configuration first checked against float64 torch; the library's (CLUSTER_TILE,
CLUSTER_WARPS) is marked. Under the interpreter
the cluster's exchange (cluster_sums) is emulated, the tiles are 512 times smaller and HW
need not reach 64, so that a small shape has groups of several tiles.

    python benchmarks/tune_group_norm.py [--shape 32,512,4096] [--groups 32] [--quick]
    TRITON_INTERPRET=1 python benchmarks/tune_group_norm.py --device cpu --shape 3,12,37 \
        --groups 2
    TRITON_INTERPRET=1 python benchmarks/tune_group_norm.py --device cpu --shape 2,16,8 \
        --groups 2    # a shape the cluster kernels take
"""
import argparse

import torch
import triton
import triton.language as tl

import _tune as T
import group_norm as K  # noqa: E402 (triton_src on the path through _tune)
from _common import CLUSTER_MAX  # noqa: E402


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


def reference_forward(x, w, b, groups, eps=1e-5):
    """(y, mean, rstd) of torch's group_norm in float64, mean and rstd per (batch, group)
    row, and the largest |x - mean| (the scale of the mean's absolute tolerance)."""
    x64 = x.double()
    y = torch.nn.functional.group_norm(x64, groups, w.double(), b.double(), eps)
    xg = x64.view(x.shape[0] * groups, -1)
    mean = xg.mean(-1)
    rstd = 1.0 / torch.sqrt(xg.var(-1, unbiased=False) + eps)
    return (y, mean, rstd), (xg - mean[:, None]).abs().max().item()


def check_forward_reference(name, y, mean, rstd, ref):
    """y (bf16), mean and rstd (fp32) against reference_forward's: y within one bf16 ulp (as
    check_reference's dx) plus 1e-5 of max |y|; mean within 1e-5 of the largest |x - mean|
    and rstd within 1e-5 relative (the fp32 shifted sums over a group)."""
    (y_ref, mean_ref, rstd_ref), spread = ref
    T.check(f"{name} y against float64 torch", y, y_ref,
            atol=1e-5 * y_ref.abs().max().item(), rtol=2 ** -7)
    T.check(f"{name} mean against float64 torch", mean, mean_ref, atol=1e-5 * spread)
    T.check(f"{name} rstd against float64 torch", rstd, rstd_ref, atol=0.0, rtol=1e-5)


# The cluster kernels' sweep: elements of the tile a program holds, and warps. The cluster
# size follows from the tile: Cg / (tile / HW) programs a group. The library builds
# (K.CLUSTER_TILE, K.CLUSTER_WARPS) only.
CLUSTER_TILES = (4096, 8192, 16384)
CLUSTER_WARPS = (4, 8, 16)
# Under the interpreter the tiles are this many times smaller (and HW may be below
# K.CLUSTER_HW[0]), so that a small shape has groups of several tiles.
INTERPRET_TILE_DIV = 512


def cluster_programs(cg, hw, tile, min_hw):
    """(programs a group, None) of the cluster kernels at tiles of `tile` elements, or
    (0, why not): for tile = CLUSTER_TILE and min_hw = CLUSTER_HW[0] the launcher's
    conditions (csrc/ops/group_norm/group_norm_cuda.cpp, cluster_programs): HW a power of
    two from min_hw up to the tile (the positions fill one tile row), Cg a multiple of the
    tile's tile / HW channels, 2 to CLUSTER_MAX tiles a group. (The launcher also wants
    16-byte aligned tensors, which fresh allocations are.)"""
    if hw < min_hw or hw > tile or hw & (hw - 1):
        return 0, f"HW = {hw} is not a power of two from {min_hw} to {tile}"
    bc = tile // hw
    if cg % bc:
        return 0, f"Cg = {cg} is not a multiple of the tile's {bc} channels"
    cl = cg // bc
    if not 2 <= cl <= CLUSTER_MAX:
        return 0, f"tiles a group: {cl}, not 2 to {CLUSTER_MAX}"
    return cl, None


class ClusterSumsEmulation:
    """Stands in for _common.cluster_sums (set as group_norm's cluster_sums, with ``arrive``
    as its cluster_arrive) under the interpreter, which runs the programs one after
    another, so that a program cannot wait for the rest of its cluster: each call keeps the
    caller's (a, b) under (key, rank) and returns the sums over ranks 0 .. n - 1, added in
    fp32 in rank order from 0.0 as the hardware form adds them, NaN while a rank's pair is
    not kept yet. A kernel launched twice finds every rank's pair in its second launch,
    provided each pair is the same in both launches (else AssertionError)."""

    def __init__(self):
        self.kept = {}

    @staticmethod
    def arrive(rank):
        return rank

    @staticmethod
    def _num(t, kind):
        t = getattr(t, "value", t)  # a constexpr
        return kind(t.handle.data.item()) if hasattr(t, "handle") else kind(t)

    def __call__(self, a, b, key, rank, n):
        where = (self._num(key, int), self._num(rank, int))
        pair = (self._num(a, float), self._num(b, float))
        before = self.kept.setdefault(where, pair)
        assert before == pair or any(v != v for v in before + pair), \
            f"cluster_sums {where}: {pair} differs from the earlier launch's {before}"
        self.kept[where] = pair
        sums = torch.zeros(2)
        for j in range(self._num(n, int)):
            sums += torch.tensor(self.kept.get((where[0], j), (float("nan"),) * 2))
        return tuple(tl.full([], s, tl.float32) for s in sums.tolist())


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

    def reduce(part=partial, rows=bsz, bb=K.REDUCE_B, bc=K.REDUCE_C, warps=K.REDUCE_WARPS):
        dw, db = torch.empty(c, device=dev), torch.empty(c, device=dev)
        K.group_norm_reduce_kernel[(triton.cdiv(c, bc),)](
            part, dw, db, rows, c, 1, 1, BLOCK_B=bb, BLOCK_C=bc, num_warps=warps)
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
    ref = reference_backward(x, dy, w, g)
    check_reference("backward library", dx_ref, g_ref, ref)
    for bb, bc, warps in REDUCE_CONFIGS:  # the same fp32 sums, grouped differently
        T.check(f"reduction BLOCK_B={bb} BLOCK_C={bc} warps={warps}",
                reduce(bb=bb, bc=bc, warps=warps), g_ref,
                atol=1e-6 * max(t.abs().max().item() for t in g_ref))

    fref = reference_forward(x, w, b, g)
    check_forward_reference("forward library", y_ref, mean_ref, rstd_ref, fref)

    def cluster_run(kernel, args_, bc, cl, warps):
        """A launch of one of the library's cluster kernels on groups * cl programs, each
        cl consecutive ones a cluster, at (bc, hw) tiles: (run, (registers, spills)). On the
        GPU the kernel is compiled as the library builds it (one CTA a program, one stage)
        and launched through Triton's compiled-kernel launcher with the cluster size set to
        cl (its cluster launch attribute; the grid it is given counts clusters), as the C++
        launcher launches the AOT variants. Under the interpreter cluster_sums is emulated
        (ClusterSumsEmulation) and a run launches twice; (registers, spills) is None."""
        const = {"BLOCK_C": bc, "BLOCK_HW": hw}
        if cpu:
            def run():
                K.cluster_sums = ClusterSumsEmulation()
                K.cluster_arrive = ClusterSumsEmulation.arrive
                for _ in range(2):
                    kernel[(groups * cl,)](*args_, num_warps=warps, **const)
            return run, None
        k = kernel.warmup(*args_, grid=(groups * cl,), num_warps=warps, num_stages=1, **const)
        k._init_handles()
        # The launcher sizes global scratch by the grid it is given (clusters): none wanted.
        if k.metadata.global_scratch_size:
            raise RuntimeError(f"{kernel.__name__} uses global scratch")
        k.packed_metadata = (k.metadata.num_warps, cl, k.metadata.shared)
        return (lambda: k[(groups, 1, 1)](*args_, *const.values())), (k.n_regs, k.n_spills)

    def check_cluster(name, bc, cl, warps):
        """Build both cluster kernels at (bc, hw) tiles, clusters of cl and `warps`, run each
        once on poisoned outputs and check it against float64 torch: the forward's y, mean
        and rstd (check_forward_reference), the backward's dx, dweight and dbias from the
        library forward's mean and rstd (check_reference). Weight and bias are read in
        float32 (has_w = has_b = 2). Returns ((run, regs) of the forward, of the backward)."""
        run_f = cluster_run(K.group_norm_fwd_cluster_kernel,
                            (x, w, w, b, b, y, mean, rstd, g, cl, 1e-5, 2, 2), bc, cl, warps)
        run_b = cluster_run(K.group_norm_bwd_cluster_kernel,
                            (dy, x, w, w, mean, rstd, dx, partial, groups, g, cl, 2, 1), bc, cl,
                            warps)
        for t in (y, mean, rstd):
            t.fill_(float("nan"))
        run_f[0]()
        check_forward_reference(f"forward {name}", y, mean, rstd, fref)
        mean.copy_(mean_ref)
        rstd.copy_(rstd_ref)
        for t in (dx, partial):
            t.fill_(float("nan"))
        run_b[0]()
        check_reference(f"backward {name}", dx, reduce(), ref)
        return run_f, run_b

    def cluster_sweep():
        """The library's cluster kernels over CLUSTER_TILES x CLUSTER_WARPS where they apply
        at this shape, forward and backward (x, or x and dy, read once: fwd_bytes and
        bwd_bytes), each configuration checked before it is timed."""
        div, min_hw = (INTERPRET_TILE_DIV, 1) if cpu else (1, K.CLUSTER_HW[0])
        if not cpu:
            major, minor = torch.cuda.get_device_capability()
            if 10 * major + minor < K.CLUSTER_MIN_ARCH:
                print(f"-- cluster kernels: none on sm_{major}{minor} (the library runs them on "
                      f"sm_{K.CLUSTER_MIN_ARCH} and newer)", flush=True)
                return
        lib_tile = K.CLUSTER_TILE // div
        lib_cl, why = cluster_programs(cg, hw, lib_tile, min_hw)
        if why:
            print(f"-- cluster kernels: the library does not take them at this shape ({why})",
                  flush=True)
            return
        print(f"-- cluster kernels, a tile of a group per program, a group per cluster "
              f"(library: tile {lib_tile} = ({cg // lib_cl}, {hw}), {K.CLUSTER_WARPS} warps, "
              f"clusters of {lib_cl})", flush=True)
        wrong = []
        for tile in (t // div for t in CLUSTER_TILES):
            cl, why = cluster_programs(cg, hw, tile, min_hw)
            if why:
                print(f"cluster tile={tile}: not run ({why})", flush=True)
                continue
            bc = tile // hw
            for warps in CLUSTER_WARPS:
                mark = " (library)" if (tile, warps) == (lib_tile, K.CLUSTER_WARPS) else ""
                name = f"cluster tile={tile} ({bc}, {hw}) CL={cl} warps={warps:2d}{mark}"
                try:
                    runs = check_cluster(name, bc, cl, warps)
                except AssertionError as e:
                    print(f"{name}: WRONG ({e})", flush=True)
                    wrong.append(name)
                    continue
                except Exception as e:  # noqa: BLE001 - does not compile / launch
                    print(f"{name}: failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:100]})", flush=True)
                    continue
                for direction, (run, regs), nbytes in zip(("fwd", "bwd"), runs,
                                                          (fwd_bytes, bwd_bytes)):
                    regs = f" ({regs[0]} regs, {regs[1]} spills)" if regs else ""
                    T.timed(f"{direction} {name}{regs}", run, nbytes)
        mean.copy_(mean_ref)
        rstd.copy_(rstd_ref)
        if wrong:
            raise SystemExit(f"cluster kernels WRONG in: {'; '.join(wrong)}")

    if cpu:
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
