"""Cross entropy forward with the gradient at 8192 x 128256 bf16 (Llama-3 vocabulary): the
library's two-pass kernel (pass 2 re-reads the row) against a team kernel (each row split
over programs that keep their block in registers and combine their partial sums through
global memory, so the logits are read once), with Triton's JIT, in place as
fk.cross_entropy runs by default. The team kernel lives here, not in the library: on the
H200 it measured 2.2-4.8 ms against the two-pass kernel's 1.46 ms (benchmarks/NOTES.md,
v6), and its ablations show why.

    python benchmarks/probes/ce_team.py [--rows 8192] [--vocab 128256]

Prints each configuration's time (L2 flushed before each call), its bandwidth for the
4.2 GB floor (read the logits once, write the gradient once) and its largest difference
from the two-pass kernel's losses and gradient.
"""
import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ce_probe import Problem  # noqa: E402  (puts triton_src on the path)
import triton.language as tl  # noqa: E402
from cross_entropy import LOG2E  # noqa: E402


@triton.jit
def _block_stats(x):
    """(max, sum of exp(x - max)) of one fp32 block whose masked lanes hold -inf; a block of
    -inf only gives (-inf, 0)."""
    m = tl.max(x, axis=0)
    m_ref = tl.where(m == -float("inf"), 0.0, m)
    return m, tl.sum(tl.exp2((x - m_ref) * LOG2E), axis=0)


@triton.jit
def cross_entropy_team_kernel(x_ptr, grad_ptr, target_ptr, den_ptr, loss_ptr, z_ptr, part_ptr,
                              count_ptr, x_stride, grad_stride, M, V, ignore_index,
                              lse_square_scale, reduction, spin_limit, BLOCK: tl.constexpr,
                              TEAM: tl.constexpr):
    """The plain forward with the gradient, each row split over a team of T = cdiv(V, BLOCK)
    programs that each hold one block of the row in registers, so the logits are read once.
    Program pid is member c = pid % T of team pid // T; the P / T teams walk the rows
    (team, team + P / T, ...). Each member publishes its block's (max, sum of exp) in part
    (per row: TEAM maxes, then TEAM sums) and counts itself in count[row] (zeros before the
    launch); once all T have counted, every member combines the T pairs in the same order
    (one lse for the whole row) and writes its block's gradient from its registers.

    A member waits for its team at most spin_limit polls; past that (a team not resident at
    once, or the interpreter, which runs programs one after another) it recomputes every
    block's pair from memory with the same code instead of waiting for ever. (In place,
    that fallback can read blocks a peer has already overwritten with its gradient; a
    library version would need a different escape.)"""
    gdtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    team = tl.cdiv(V, BLOCK)
    first = pid // team
    c = pid - first * team
    teams = tl.num_programs(0) // team
    lanes = tl.arange(0, BLOCK)
    cols = c * BLOCK + lanes
    mask = cols < V
    j = tl.arange(0, TEAM)
    inv_dw = tl.full((), 1.0, tl.float32)
    inv_dn = tl.full((), 1.0, tl.float32)
    if reduction == 1:
        inv_dw = 1.0 / tl.load(den_ptr)
        inv_dn = 1.0 / tl.load(den_ptr + 1)
    for row in range(first, M, teams):
        x_row = x_ptr + row * x_stride
        g_row = grad_ptr + row * grad_stride
        y = tl.load(target_ptr + row)
        if y == ignore_index:
            tl.store(g_row + cols, tl.zeros((BLOCK,), dtype=gdtype), mask=mask)
            if c == 0:
                tl.store(loss_ptr + row, 0.0 * inv_dw)
                tl.store(z_ptr + row, 0.0 * inv_dn)
        else:
            x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
            valid = (y >= 0) & (y < V)
            # The target's logit before the team meets: past that its owner may overwrite it.
            x_y = tl.load(x_row + tl.where(valid, y, 0), mask=c == 0, other=0.0).to(tl.float32)
            m_c, d_c = _block_stats(x)
            part = part_ptr + row * (2 * TEAM)
            tl.store(part + c, m_c)
            tl.store(part + TEAM + c, d_c)
            n = tl.atomic_add(count_ptr + row, 1, sem="release") + 1
            spins = 0
            while (n < team) & (spins < spin_limit):
                n = tl.atomic_add(count_ptr + row, 0, sem="acquire")
                spins += 1
            if n >= team:
                pm = tl.load(part + j, mask=j < team, other=-float("inf"), volatile=True)
                pd = tl.load(part + TEAM + j, mask=j < team, other=0.0, volatile=True)
            else:
                pm = tl.full((TEAM,), -float("inf"), tl.float32)
                pd = tl.zeros((TEAM,), tl.float32)
                for k in range(0, team):
                    ck = k * BLOCK + lanes
                    xk = tl.load(x_row + ck, mask=ck < V, other=-float("inf")).to(tl.float32)
                    m_k, d_k = _block_stats(xk)
                    pm = tl.where(j == k, m_k, pm)
                    pd = tl.where(j == k, d_k, pd)
            mx = tl.max(pm, axis=0)
            mx_ref = tl.where(mx == -float("inf"), 0.0, mx)
            lse = mx + tl.log(tl.sum(pd * tl.exp2((pm - mx_ref) * LOG2E), axis=0))

            c_y = tl.where(valid, 1.0, float("nan")) * inv_dw
            a = c_y + 2.0 * lse_square_scale * lse * inv_dn
            if c == 0:
                z = lse_square_scale * lse * lse
                tl.store(loss_ptr + row, (lse - tl.where(valid, x_y, float("nan"))) * inv_dw
                         + z * inv_dn)
                tl.store(z_ptr + row, z * inv_dn)
            g = tl.exp2((x - lse) * LOG2E) * a - tl.where(cols == y, c_y, 0.0)
            tl.store(g_row + cols, g.to(gdtype), mask=mask)


@triton.jit
def team_ablation_kernel(x_ptr, target_ptr, loss_ptr, part_ptr, count_ptr, x_stride, M, V,
                         BLOCK: tl.constexpr, TEAM: tl.constexpr, SYNC: tl.constexpr,
                         PREFETCH: tl.constexpr):
    """The team kernel's memory pattern in place (plain, sum reduction), for timing only:
    SYNC=0 skips the team meeting (each block uses its own max and sum: wrong values, the
    cost of load + math + store alone); PREFETCH=1 loads the team's next row before it
    meets on this one (persistent grids)."""
    pid = tl.program_id(0).to(tl.int64)
    team = tl.cdiv(V, BLOCK)
    first = pid // team
    c = pid - first * team
    teams = tl.num_programs(0) // team
    cols = c * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    j = tl.arange(0, TEAM)
    x_next = tl.load(x_ptr + first * x_stride + cols, mask=mask & (first < M),
                     other=-float("inf"))
    for row in range(first, M, teams):
        if PREFETCH:
            x = x_next.to(tl.float32)
            x_next = tl.load(x_ptr + (row + teams) * x_stride + cols,
                             mask=mask & (row + teams < M), other=-float("inf"))
        else:
            x = tl.load(x_ptr + row * x_stride + cols, mask=mask,
                        other=-float("inf")).to(tl.float32)
        y = tl.load(target_ptr + row)
        m_c, d_c = _block_stats(x)
        lse = m_c + tl.log(d_c)
        if SYNC:
            part = part_ptr + row * (2 * TEAM)
            tl.store(part + c, m_c)
            tl.store(part + TEAM + c, d_c)
            n = tl.atomic_add(count_ptr + row, 1, sem="release") + 1
            while n < team:
                n = tl.atomic_add(count_ptr + row, 0, sem="acquire")
            pm = tl.load(part + j, mask=j < team, other=-float("inf"), volatile=True)
            pd = tl.load(part + TEAM + j, mask=j < team, other=0.0, volatile=True)
            mx = tl.max(pm, axis=0)
            lse = mx + tl.log(tl.sum(pd * tl.exp2((pm - mx) * 1.4426950408889634), axis=0))
        if c == 0:
            tl.store(loss_ptr + row, lse)
        g = tl.exp2((x - lse) * 1.4426950408889634) - tl.where(cols == y, 1.0, 0.0)
        tl.store(x_ptr + row * x_stride + cols, g.to(x_ptr.dtype.element_ty), mask=mask)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--spin-limit", type=int, default=1 << 22)
    args = ap.parse_args()
    m, v = args.rows, args.vocab
    p = Problem(m, v, width=40)
    t, den, loss, z, sms = p.t, p.den, p.loss, p.z, p.sms

    def team_fn(block, warps, per_sm):
        team = triton.cdiv(v, block)
        cap = triton.next_power_of_2(team)
        part = torch.empty(m, 2 * cap, device="cuda")
        count = torch.zeros(m, dtype=torch.int32, device="cuda")
        teams = m if per_sm == 0 else max(1, min(m, sms * per_sm // team))

        def fn(x):
            count.zero_()
            cross_entropy_team_kernel[(teams * team,)](
                x, x, t, den, loss, z, part, count, v, v, m, v, -100, 0.0, 1, args.spin_limit,
                BLOCK=block, TEAM=cap, num_warps=warps)
        return fn

    p.copy()
    p.reference()
    for block, warps in ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (32768, 16)):
        for per_sm in (0, 2, 4, 8):
            name = f"team {block} x {warps} w, " + (f"{per_sm}/SM" if per_sm else "grid M*T")
            p.check(name, team_fn(block, warps, per_sm))
    # Ablations: the same memory pattern without the meeting, and with a prefetched row
    # (timing only: without the meeting the values are wrong).
    for block, warps in ((8192, 4), (16384, 8), (32768, 16)):
        team = triton.cdiv(v, block)
        cap = triton.next_power_of_2(team)
        part = torch.empty(m, 2 * cap, device="cuda")
        count = torch.zeros(m, dtype=torch.int32, device="cuda")
        for sync, prefetch, per_sm in ((0, 0, 0), (0, 0, 4), (0, 1, 4), (1, 0, 0), (1, 1, 2),
                                       (1, 1, 4), (1, 1, 8)):
            teams = m if per_sm == 0 else max(1, min(m, sms * per_sm // team))

            def fn(x, block=block, warps=warps, sync=sync, prefetch=prefetch, teams=teams,
                   team=team, cap=cap, part=part, count=count):
                count.zero_()
                team_ablation_kernel[(teams * team,)](x, t, loss, part, count, v, m, v,
                                                      BLOCK=block, TEAM=cap, SYNC=sync,
                                                      PREFETCH=prefetch, num_warps=warps)
            name = (f"abl {block} x {warps} w sync={sync} pf={prefetch} "
                    + (f"{per_sm}/SM" if per_sm else "M*T"))
            try:
                p.report(name, fn)
            except Exception as e:  # a configuration that does not compile or fit
                print(f"{name:40s} failed: {type(e).__name__}: {str(e)[:120]}")


if __name__ == "__main__":
    main()
