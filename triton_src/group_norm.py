"""GroupNorm: x viewed as (B, C, HW) with C split into G groups of Cg = C / G channels; per
(batch, group) row of L = Cg * HW contiguous elements,
    y = (x - mean) * rstd * w[c] + b[c],  rstd = 1 / sqrt(var + eps)  (biased variance),
all in fp32, y rounded once. weight / bias are read as float32 (the CUDA launcher converts
other parameter dtypes first); either may be absent (``has_w`` / ``has_b`` = 0: 1 and 0).

Backward per group, with xhat = (x - mean) * rstd, S_c = sum_hw dy * xhat, D_c = sum_hw dy:
    A = sum_c w_c S_c,  Bs = sum_c w_c D_c,
    dx = rstd * (w_c dy - (xhat * A + Bs) / L);   dw_c = sum_b S_c,  db_c = sum_b D_c.

Design (bytes at x (32, 512, 4096) bf16, 32 groups: a group is 16 x 4096 = 65536 elements,
128 KB; 1024 groups). The minimum traffic is 2 bytes read + 2 written per element forward
and 4 read + 2 written backward. A group does not fit one program's registers at useful
occupancy, and splitting it over several programs needs either a second launch (the group
read twice from DRAM: 1.5x the forward's minimum) or an inter-program barrier. So each
program owns whole groups and makes two passes over each: the first (statistics forward,
S_c / D_c backward) reads from DRAM with an evict-last hint, the second (normalize / dx)
re-reads the same group from L2 with an evict-first hint. The grid is persistent and sized
by the launcher so that the groups in flight (programs x group bytes) stay within a fixed L2
budget, which keeps DRAM traffic at the minimum; per-group outputs are 8 bytes (mean, rstd)
and 8 bytes per (batch, channel) of fp32 partial sums for the parameter gradients, which a
small kernel sums over the batch.

Tiles are 2-D, (BLOCK_C channels, BLOCK_HW positions), so the channel of every element is
its tile row: no per-element division, one weight / bias load per channel. The statistics
use shifted sums (x minus the group's first element) to avoid the cancellation of
E[x^2] - E[x]^2 when |mean| >> std. Offsets inside a group are int32 (a group holds fewer
than 2^31 elements); the group's base offset is int64.

On sm_90 and newer, a group of 2-8 tiles of CLUSTER_TILE elements whose positions fill
one tile row exactly (HW a power of two from 64 to CLUSTER_TILE, Cg a multiple of the tile's
channels) is instead held in registers by a thread-block cluster of that many programs, one
tile each: x (and dy) are read once, and the cluster's two partial sums (forward: sum and
sum of squares; backward: A and Bs) meet in distributed shared memory (cluster_sums). At
(32, 512, 4096) bf16 on an H100, fwd + bwd with L2 flushed before each step, that moves the
minimum bytes at 80 % of copy bandwidth, where the two-pass kernels reach 75 %
(benchmarks/NOTES.md v24).

Kernels:
  group_norm_fwd_cluster_kernel, group_norm_bwd_cluster_kernel
                            one tile of one group per program, a group per cluster.
  group_norm_fwd_kernel     persistent over groups: statistics pass, then normalize pass.
  group_norm_bwd_kernel     persistent over groups: S_c / D_c pass (stored per (b, c)),
                            then dx pass (skipped when ``want_dx`` is 0); with PREFETCH
                            each pass loads its next tile before using the current one.
  group_norm_reduce_kernel  dw / db = sums over the batch of the (B, C) partials.
"""
import triton
import triton.language as tl

from _common import (CLUSTER_MAX, DTYPES, FLAG_ALIGNED, Variant, aligned_args, cluster_arrive,
                     cluster_sums)


@triton.jit
def group_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, groups, G, Cg, HW,
                          eps, has_w, has_b, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    ci = tl.arange(0, BLOCK_C)
    hi = tl.arange(0, BLOCK_HW)
    n = Cg * HW
    n64 = n.to(tl.int64)
    inv_n = 1.0 / n.to(tl.float32)
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
                x = tl.load(xg + rows + hh[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_last").to(tl.float32)
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
        for c0 in range(0, Cg, BLOCK_C):
            cc = c0 + ci
            cmask = cc < Cg
            w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0), other=1.0).to(tl.float32)
            b = tl.load(b_ptr + ch0 + cc, mask=cmask & (has_b != 0), other=0.0).to(tl.float32)
            scale = w * rstd
            rows = cc[:, None] * HW
            for h0 in range(0, HW, BLOCK_HW):
                hh = h0 + hi
                mask = cmask[:, None] & (hh < HW)[None, :]
                offs = rows + hh[None, :]
                x = tl.load(xg + offs, mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                # (x - mean) first: a group of equal values (one element, say) gives
                # exactly b under any contraction of the multiply-add into an FMA.
                y = (x - mean) * scale[:, None] + b[:, None]
                tl.store(yg + offs, y.to(dtype), mask=mask)


@triton.jit
def block_sums(acc_s, acc_d, pg, plane, cc, cmask, w_ptr, ch0, has_w):
    """Stores a channel block's S_c / D_c partials (from its [BLOCK_C, BLOCK_HW] fp32
    accumulators) and returns its shares of A and Bs."""
    sc = tl.sum(acc_s, axis=1)
    dc = tl.sum(acc_d, axis=1)
    tl.store(pg + cc, sc, mask=cmask)
    tl.store(pg + plane + cc, dc, mask=cmask)
    w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0), other=1.0).to(tl.float32)
    w = tl.where(cmask, w, 0.0)
    return tl.sum(w * sc), tl.sum(w * dc)


@triton.jit
def two_pass_sums(xg, dyg, mean, rstd, pg, plane, w_ptr, ch0, has_w, Cg, HW, ci, hi,
                  BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """The S_c / D_c pass over one group, a channel block at a time; returns the group's A and
    Bs."""
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
        da, db = block_sums(acc_s, acc_d, pg, plane, cc, cmask, w_ptr, ch0, has_w)
        a += da
        bs += db
    return a, bs


@triton.jit
def _two_pass_dx(xg, dyg, dxg, mean, rstd, ka, kb, w_ptr, ch0, has_w, Cg, HW, ci, hi,
                 BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """The dx pass over one group, a channel block at a time."""
    dtype = dxg.dtype.element_ty
    for c0 in range(0, Cg, BLOCK_C):
        cc = c0 + ci
        cmask = cc < Cg
        w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0), other=1.0).to(tl.float32)
        rows = cc[:, None] * HW
        for h0 in range(0, HW, BLOCK_HW):
            hh = h0 + hi
            mask = cmask[:, None] & (hh < HW)[None, :]
            offs = rows + hh[None, :]
            x = tl.load(xg + offs, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dyg + offs, mask=mask, other=0.0,
                         eviction_policy="evict_first").to(tl.float32)
            xhat = (x - mean) * rstd
            dx = rstd * (dy * w[:, None] - (xhat * ka + kb))
            tl.store(dxg + offs, dx.to(dtype), mask=mask)


@triton.jit
def _all_rows(BLOCK_C: tl.constexpr):
    """The channel mask of a tile where Cg is a multiple of BLOCK_C: every row, as a
    constant, so each tile's loads and stores share one predicate."""
    return tl.full((BLOCK_C,), 1, tl.int1)


@triton.jit
def _load_tile(g_ptr, k, valid, nh, HW, ci, hi, BLOCK_C: tl.constexpr,
               BLOCK_HW: tl.constexpr, POLICY: tl.constexpr):
    """Tile k of a group (channel-major: nh position tiles per channel block; Cg a multiple
    of BLOCK_C, so no channel is masked) in its stored dtype; 0 past HW and where ``valid``
    is false (no memory is read then)."""
    cc = (k // nh) * BLOCK_C + ci
    hh = (k % nh) * BLOCK_HW + hi
    mask = _all_rows(BLOCK_C)[:, None] & (hh < HW)[None, :] & valid
    return tl.load(g_ptr + cc[:, None] * HW + hh[None, :], mask=mask, other=0.0,
                   eviction_policy=POLICY)


@triton.jit
def _prefetch_step(xg, dyg, k, nt, nh, HW, ci, hi, BLOCK_C: tl.constexpr,
                   BLOCK_HW: tl.constexpr, POLICY: tl.constexpr):
    """Tile k + 1 of x and dy (nothing read past the group's last tile), and tile k's channels,
    channel mask, positions and element mask."""
    nx = _load_tile(xg, k + 1, k + 1 < nt, nh, HW, ci, hi, BLOCK_C, BLOCK_HW, POLICY)
    ndy = _load_tile(dyg, k + 1, k + 1 < nt, nh, HW, ci, hi, BLOCK_C, BLOCK_HW, POLICY)
    cc = (k // nh) * BLOCK_C + ci
    cmask = _all_rows(BLOCK_C)
    hh = (k % nh) * BLOCK_HW + hi
    mask = cmask[:, None] & (hh < HW)[None, :]
    return nx, ndy, cc, cmask, hh, mask


@triton.jit
def _prefetch_sums(xg, dyg, mean, rstd, pg, plane, w_ptr, ch0, has_w, Cg, HW, ci, hi,
                   BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """The S_c / D_c pass over one group's tiles in one loop (Cg a multiple of BLOCK_C), tile
    k + 1 of x and dy loaded before tile k is summed; returns the group's A and Bs."""
    nh = tl.cdiv(HW, BLOCK_HW)
    nt = tl.cdiv(Cg, BLOCK_C) * nh
    a = 0.0
    bs = 0.0
    acc_s = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
    acc_d = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
    nx = _load_tile(xg, 0, True, nh, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_last")
    ndy = _load_tile(dyg, 0, True, nh, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_last")
    for k in range(0, nt):
        cx = nx
        cdy = ndy
        nx, ndy, cc, cmask, hh, mask = _prefetch_step(xg, dyg, k, nt, nh, HW, ci, hi, BLOCK_C,
                                                      BLOCK_HW, "evict_last")
        d = cdy.to(tl.float32)
        acc_s += d * tl.where(mask, (cx.to(tl.float32) - mean) * rstd, 0.0)
        acc_d += d
        if k % nh == nh - 1:  # the channel block's last tile: its sums are complete
            da, db = block_sums(acc_s, acc_d, pg, plane, cc, cmask, w_ptr, ch0, has_w)
            a += da
            bs += db
            acc_s = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
            acc_d = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
    return a, bs


@triton.jit
def _prefetch_dx(xg, dyg, dxg, mean, rstd, ka, kb, w_ptr, ch0, has_w, Cg, HW, ci, hi,
                 BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """The dx pass over one group's tiles in one loop (Cg a multiple of BLOCK_C), tile k + 1
    loaded before tile k's dx is computed and stored."""
    dtype = dxg.dtype.element_ty
    nh = tl.cdiv(HW, BLOCK_HW)
    nt = tl.cdiv(Cg, BLOCK_C) * nh
    nx = _load_tile(xg, 0, True, nh, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_first")
    ndy = _load_tile(dyg, 0, True, nh, HW, ci, hi, BLOCK_C, BLOCK_HW, "evict_first")
    for k in range(0, nt):
        cx = nx
        cdy = ndy
        nx, ndy, cc, cmask, hh, mask = _prefetch_step(xg, dyg, k, nt, nh, HW, ci, hi, BLOCK_C,
                                                      BLOCK_HW, "evict_first")
        w = tl.load(w_ptr + ch0 + cc, mask=cmask & (has_w != 0), other=1.0).to(tl.float32)
        xhat = (cx.to(tl.float32) - mean) * rstd
        dx = rstd * (cdy.to(tl.float32) * w[:, None] - (xhat * ka + kb))
        tl.store(dxg + cc[:, None] * HW + hh[None, :], dx.to(dtype), mask=mask)


@triton.jit
def group_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr, groups,
                          G, Cg, HW, has_w, want_dx, BLOCK_C: tl.constexpr,
                          BLOCK_HW: tl.constexpr, PREFETCH: tl.constexpr = 0):
    """partial: fp32 (2, B * C): S_c then D_c per (batch, channel), written for every group.

    PREFETCH = 1 (only where Cg is a multiple of BLOCK_C: FLAG_EVEN_C) walks each pass's
    tiles in one loop and loads the next tile of x and dy before using the current one, so a
    program's next loads are in flight while it sums or writes (Triton does not pipeline
    these loads; num_stages changes nothing). It pays only where each tile's channel mask is
    uniform: at (32, 512, 4096) bf16 on an H100, 171 us against the two-pass form's 190 with
    Cg hinted divisible by 16, 194 us with a mask per channel row (benchmarks/NOTES.md
    v23); without a channel mask at all, as here, for any Cg that BLOCK_C divides."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    ci = tl.arange(0, BLOCK_C)
    hi = tl.arange(0, BLOCK_HW)
    n = Cg * HW
    n64 = n.to(tl.int64)
    inv_n = 1.0 / n.to(tl.float32)
    plane = groups.to(tl.int64) * Cg
    for grp in range(pid, groups, step):
        base = grp * n64
        xg = x_ptr + base
        dyg = dy_ptr + base
        dxg = dx_ptr + base
        mean = tl.load(mean_ptr + grp)
        rstd = tl.load(rstd_ptr + grp)
        ch0 = (grp % G) * Cg
        pg = partial_ptr + grp * Cg.to(tl.int64)
        if PREFETCH:
            a, bs = _prefetch_sums(xg, dyg, mean, rstd, pg, plane, w_ptr, ch0, has_w, Cg, HW,
                                   ci, hi, BLOCK_C, BLOCK_HW)
        else:
            a, bs = two_pass_sums(xg, dyg, mean, rstd, pg, plane, w_ptr, ch0, has_w, Cg, HW,
                                  ci, hi, BLOCK_C, BLOCK_HW)
        if want_dx != 0:
            ka = a * inv_n
            kb = bs * inv_n
            if PREFETCH:
                _prefetch_dx(xg, dyg, dxg, mean, rstd, ka, kb, w_ptr, ch0, has_w, Cg, HW, ci,
                             hi, BLOCK_C, BLOCK_HW)
            else:
                _two_pass_dx(xg, dyg, dxg, mean, rstd, ka, kb, w_ptr, ch0, has_w, Cg, HW, ci,
                             hi, BLOCK_C, BLOCK_HW)


@triton.jit
def _cluster_param(p_ptr, pf_ptr, idx, has, other):
    """A parameter's values at idx in fp32, read in x's dtype (``has == 1``, through p_ptr) or
    in float32 (``has == 2``, through pf_ptr); ``other`` without one (``has == 0``)."""
    v = tl.load(p_ptr + idx, mask=has == 1, other=other).to(tl.float32)
    vf = tl.load(pf_ptr + idx, mask=has == 2, other=other)
    return tl.where(has == 2, vf, v)


@triton.jit
def _cluster_tile(pid, cl, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """This program's group, rank in its cluster of cl, channels of the group and offsets
    within the group (a (BLOCK_C, BLOCK_HW) tile; HW == BLOCK_HW, Cg == cl * BLOCK_C)."""
    rank = cluster_arrive((pid % cl).to(tl.int32))
    grp = pid // cl
    cc = rank * BLOCK_C + tl.arange(0, BLOCK_C)
    offs = cc[:, None] * BLOCK_HW + tl.arange(0, BLOCK_HW)[None, :]
    return grp, rank, cc, offs


@triton.jit
def group_norm_fwd_cluster_kernel(x_ptr, w_ptr, wf_ptr, b_ptr, bf_ptr, y_ptr, mean_ptr,
                                  rstd_ptr, G, cl, eps, has_w, has_b, BLOCK_C: tl.constexpr,
                                  BLOCK_HW: tl.constexpr):
    """The forward of one (BLOCK_C, BLOCK_HW) tile of a group per program, the group's cl
    programs one thread-block cluster (grid: groups * cl); weight and bias as
    _cluster_param reads them."""
    grp, rank, cc, offs = _cluster_tile(tl.program_id(0), cl, BLOCK_C, BLOCK_HW)
    Cg = cl * BLOCK_C
    n = Cg * BLOCK_HW
    base = grp.to(tl.int64) * n
    x = tl.load(x_ptr + base + offs).to(tl.float32)
    # shifted sums, as the two-pass kernel (the group's first element)
    shift = tl.load(x_ptr + base).to(tl.float32)
    d = x - shift
    s1, s2 = cluster_sums(tl.sum(d), tl.sum(d * d), grp, rank, cl)
    inv_n = 1.0 / n.to(tl.float32)
    m1 = s1 * inv_n
    var = tl.maximum(s2 * inv_n - m1 * m1, 0.0)
    mean = shift + m1
    rstd = 1.0 / tl.sqrt(var + eps)
    if rank == 0:
        tl.store(mean_ptr + grp, mean)
        tl.store(rstd_ptr + grp, rstd)
    ch = (grp % G) * Cg + cc
    w = _cluster_param(w_ptr, wf_ptr, ch, has_w, 1.0)
    b = _cluster_param(b_ptr, bf_ptr, ch, has_b, 0.0)
    y = (x - mean) * (w * rstd)[:, None] + b[:, None]
    tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty))


@triton.jit
def group_norm_bwd_cluster_kernel(dy_ptr, x_ptr, w_ptr, wf_ptr, mean_ptr, rstd_ptr, dx_ptr,
                                  partial_ptr, groups, G, cl, has_w, want_dx,
                                  BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """The backward of one tile of a group per program, as group_norm_fwd_cluster_kernel:
    S_c / D_c of the tile's channels into partial (group_norm_bwd_kernel's layout), the
    group's A and Bs from the cluster, dx from the tile held in registers."""
    grp, rank, cc, offs = _cluster_tile(tl.program_id(0), cl, BLOCK_C, BLOCK_HW)
    Cg = cl * BLOCK_C
    n = Cg * BLOCK_HW
    base = grp.to(tl.int64) * n
    x = tl.load(x_ptr + base + offs).to(tl.float32)
    dy = tl.load(dy_ptr + base + offs).to(tl.float32)
    mean = tl.load(mean_ptr + grp)
    rstd = tl.load(rstd_ptr + grp)
    xhat = (x - mean) * rstd
    sc = tl.sum(dy * xhat, axis=1)
    dc = tl.sum(dy, axis=1)
    pg = partial_ptr + grp * Cg.to(tl.int64)
    tl.store(pg + cc, sc)
    tl.store(pg + groups.to(tl.int64) * Cg + cc, dc)
    w = _cluster_param(w_ptr, wf_ptr, (grp % G) * Cg + cc, has_w, 1.0)
    a, bs = cluster_sums(tl.sum(w * sc), tl.sum(w * dc), grp, rank, cl)
    if want_dx != 0:
        inv_n = 1.0 / n.to(tl.float32)
        ka = a * inv_n
        kb = bs * inv_n
        dx = rstd * (dy * w[:, None] - (xhat * ka + kb))
        tl.store(dx_ptr + base + offs, dx.to(dx_ptr.dtype.element_ty))


@triton.jit
def group_norm_reduce_kernel(partial_ptr, dw_ptr, db_ptr, B, C, want_dw, want_db,
                             BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr):
    """dw[c] = sum_b partial[0, b, c], db[c] = sum_b partial[1, b, c]; fp32 sums, one
    program per BLOCK_C channels."""
    out_dtype = dw_ptr.dtype.element_ty
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    plane = B.to(tl.int64) * C
    acc_w = tl.zeros((BLOCK_B, BLOCK_C), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_B, BLOCK_C), dtype=tl.float32)
    for start in range(0, B, BLOCK_B):
        rows = start + tl.arange(0, BLOCK_B)
        mask = (rows < B)[:, None] & cmask[None, :]
        offs = rows[:, None].to(tl.int64) * C + cols[None, :]
        acc_w += tl.load(partial_ptr + offs, mask=mask, other=0.0)
        acc_b += tl.load(partial_ptr + plane + offs, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, tl.sum(acc_w, axis=0).to(out_dtype), mask=cmask & (want_dw != 0))
    tl.store(db_ptr + cols, tl.sum(acc_b, axis=0).to(out_dtype), mask=cmask & (want_db != 0))


# (tile elements, warps) and the BLOCK_HW buckets per tile; BLOCK_C = tile / BLOCK_HW. The
# launcher picks the tile and BLOCK_HW that waste the fewest masked lanes (HW rounded up to
# a multiple of BLOCK_HW, Cg to a multiple of BLOCK_C). Variants are keyed by
# block = BLOCK_HW * KEY + BLOCK_C. Aligned variants (HW a multiple of 16, 16-byte aligned
# tensors) only where a tile row is long enough to use vector loads.
TILES = ((1024, 4), (8192, 16))
HW_BUCKETS = (1, 8, 64, 512, 4096)
ALIGNED_MIN_HW = 64
KEY = 1 << 16
# With FLAG_ALIGNED: Cg is a multiple of BLOCK_C (the backward's prefetching variants).
FLAG_EVEN_C = 2
# The dweight / dbias reduction: (BLOCK_B rows, BLOCK_C channels) a step, warps. 32 channels a
# program spreads C = 512 over 16 programs (4 at 128 before): fwd + bwd at (32, 512, 4096)
# bf16 0.3217 -> 0.3188 ms of GPU time on an H100 (benchmarks/NOTES.md v20).
REDUCE_B, REDUCE_C, REDUCE_WARPS = 32, 32, 2
# The cluster forms (sm_90 and newer): tiles of CLUSTER_TILE elements at CLUSTER_WARPS, one
# variant per BLOCK_HW in CLUSTER_HW (BLOCK_C = CLUSTER_TILE / BLOCK_HW), keyed by BLOCK_HW.
# (2, 4096) tiles: against tiles of up to 32768 elements, fwd + bwd 268 us at (32, 512, 4096)
# bf16 on an H100 in the JIT probe's back-to-back pairs at 8 warps (benchmarks/NOTES.md v24).
# 4 warps (benchmarks/tune_group_norm.py, same shape): fwd 112.5 -> 106.0 us, bwd 170.0 ->
# 145.7 on an H100; 96.0 -> 88.6 and 144.5 -> 118.1 on an H200 (NOTES v25).
CLUSTER_TILE, CLUSTER_WARPS = 8192, 4
CLUSTER_HW = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
CLUSTER_MIN_ARCH = 90

_FWD_ARGS = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "mean_ptr", "rstd_ptr", "groups", "G", "Cg",
             "HW", "eps", "has_w", "has_b")
_BWD_ARGS = ("dy_ptr", "x_ptr", "w_ptr", "mean_ptr", "rstd_ptr", "dx_ptr", "partial_ptr",
             "groups", "G", "Cg", "HW", "has_w", "want_dx")
_REDUCE_ARGS = ("partial_ptr", "dw_ptr", "db_ptr", "B", "C", "want_dw", "want_db")
_FWD_CLUSTER_ARGS = ("x_ptr", "w_ptr", "wf_ptr", "b_ptr", "bf_ptr", "y_ptr", "mean_ptr",
                     "rstd_ptr", "G", "cl", "eps", "has_w", "has_b")
_BWD_CLUSTER_ARGS = ("dy_ptr", "x_ptr", "w_ptr", "wf_ptr", "mean_ptr", "rstd_ptr", "dx_ptr",
                     "partial_ptr", "groups", "G", "cl", "has_w", "want_dx")
_FP32 = ("w_ptr", "b_ptr", "mean_ptr", "rstd_ptr", "partial_ptr")
# The cluster kernels read weight and bias in x's dtype or float32 (has_w / has_b 1 or 2).
_FP32_CLUSTER = ("wf_ptr", "bf_ptr", "mean_ptr", "rstd_ptr", "partial_ptr")
_SCALARS = {"groups": "i32", "G": "i32", "Cg": "i32", "HW": "i32", "eps": "fp32",
            "has_w": "i32", "has_b": "i32", "want_dx": "i32", "B": "i32", "C": "i32",
            "want_dw": "i32", "want_db": "i32", "cl": "i32"}


def _signature(args, dt, constexprs, fp32_ptrs=_FP32):
    sig = {}
    for a in args:
        if a in _SCALARS:
            sig[a] = _SCALARS[a]
        else:
            sig[a] = "*fp32" if a in fp32_ptrs else f"*{dt}"
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def tile_shapes():
    """(BLOCK_HW, BLOCK_C, warps) of every built tile shape."""
    out = []
    for tile, warps in TILES:
        for hw in HW_BUCKETS:
            if hw <= tile:
                out.append((hw, tile // hw, warps))
    return out


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        for hw, c, warps in tile_shapes():
            for aligned in ((0, FLAG_ALIGNED, FLAG_ALIGNED | FLAG_EVEN_C)
                            if hw >= ALIGNED_MIN_HW else (0,)):
                for family, kernel, args in (
                        ("group_norm_fwd", "group_norm_fwd_kernel", _FWD_ARGS),
                        ("group_norm_bwd", "group_norm_bwd_kernel", _BWD_ARGS)):
                    constexprs = {"BLOCK_C": c, "BLOCK_HW": hw}
                    if family == "group_norm_bwd":
                        # Cg a multiple of BLOCK_C: the prefetching backward (the forward
                        # has no such form).
                        constexprs["PREFETCH"] = int(bool(aligned & FLAG_EVEN_C))
                    elif aligned & FLAG_EVEN_C:
                        continue
                    sig = _signature(args, dt, constexprs)
                    # Weight and bias may sit anywhere: no alignment hint on them.
                    hinted = tuple(a for a in aligned_args(sig, aligned, ("HW",))
                                   if a not in ("w_ptr", "b_ptr"))
                    out.append(Variant(family=family, kernel=kernel, dtype=dt,
                                       block=hw * KEY + c, signature=sig,
                                       constexprs=constexprs, num_warps=warps, flags=aligned,
                                       divisible_by_16=hinted))
        if arch >= CLUSTER_MIN_ARCH:
            for hw in CLUSTER_HW:
                constexprs = {"BLOCK_C": CLUSTER_TILE // hw, "BLOCK_HW": hw}
                for family, args in (("group_norm_fwd_cluster", _FWD_CLUSTER_ARGS),
                                     ("group_norm_bwd_cluster", _BWD_CLUSTER_ARGS)):
                    sig = _signature(args, dt, constexprs, fp32_ptrs=_FP32_CLUSTER)
                    hinted = tuple(a for a in aligned_args(sig, FLAG_ALIGNED)
                                   if a not in ("w_ptr", "wf_ptr", "b_ptr", "bf_ptr"))
                    out.append(Variant(family=family, kernel=family + "_kernel", dtype=dt,
                                       block=hw, signature=sig, constexprs=constexprs,
                                       num_warps=CLUSTER_WARPS, flags=FLAG_ALIGNED,
                                       divisible_by_16=hinted))
        # The reduction is keyed by the parameters' dtype (its outputs).
        sig = _signature(_REDUCE_ARGS, dt, ("BLOCK_B", "BLOCK_C"), fp32_ptrs=("partial_ptr",))
        out.append(Variant(family="group_norm_reduce", kernel="group_norm_reduce_kernel",
                           dtype=dt, block=REDUCE_C, signature=sig,
                           constexprs={"BLOCK_B": REDUCE_B, "BLOCK_C": REDUCE_C},
                           num_warps=REDUCE_WARPS))
    return out
