"""swiglu_linear's persistent sm_90 forward with its epilogue overlapped with the next tile's
main loop, with Triton's JIT, against the library kernel and cuBLAS on the stacked weights
(Llama-3-8B MLP at 8192 tokens, bf16). Variants of the library's tile loop:

  flatten     tl.range(..., flatten=True) on the tile loop: the software pipeline runs
              across tiles, so the next tile's first loads are in flight during this
              tile's epilogue instead of the pipeline draining and refilling per tile
  tma_store   the outputs stored through TMA descriptors (asynchronous bulk stores from
              shared memory) instead of masked pointer stores
  subtile     the epilogue in two column halves (less register pressure, half the
              staging buffer for the TMA stores)

The store switches are constexprs here (a run-time switch around a TMA store does not
compile in a flattened loop with Triton 3.6). Each variant is checked against torch, then
all are timed in turn (five rounds, CUDA events, median; the order rotates each round so no
variant always follows cuBLAS). Results: benchmarks/NOTES.md v7 (none beyond the noise;
the library kernel is unchanged).

    python benchmarks/probes/swiglu_linear_overlap.py [--tokens 8192] [--flatten]
"""
import argparse
import os
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _swiglu_linear_probe as P  # noqa: E402
from _swiglu_linear_probe import K  # noqa: E402


@triton.jit
def _store(desc, ptr, val, row0, col0, M, N, ON: tl.constexpr, TMA_STORE: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if ON:
        if TMA_STORE:
            desc.store([row0, col0], val)
        else:
            rm = tl.arange(0, BLOCK_M)
            rn = tl.arange(0, BLOCK_N)
            off = row0.to(tl.int64) * N + col0 + (rm[:, None] * N + rn[None, :])
            mask = (rm < M - row0)[:, None] & (rn < N - col0)[None, :]
            tl.store(ptr + off, val, mask=mask)


@triton.jit
def _epilogue_part(acc_g, acc_u, z_desc, s_desc, t_desc, z_ptr, s_ptr, t_ptr, row0, col0, M, N,
                   STORE_Z: tl.constexpr, STORE_SAVED: tl.constexpr, dtype,
                   TMA_STORE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    z, s, t = K._silu_factors(acc_g, acc_u)
    _store(z_desc, z_ptr, z.to(dtype), row0, col0, M, N, STORE_Z, TMA_STORE, BLOCK_M, BLOCK_N)
    _store(s_desc, s_ptr, s.to(dtype), row0, col0, M, N, STORE_SAVED, TMA_STORE, BLOCK_M,
           BLOCK_N)
    _store(t_desc, t_ptr, t.to(dtype), row0, col0, M, N, STORE_SAVED, TMA_STORE, BLOCK_M,
           BLOCK_N)


@triton.jit
def fwd_overlap_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K_,
                       STORE_Z: tl.constexpr, STORE_SAVED: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, TMA_STORE: tl.constexpr,
                       SUBTILE: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    SUB_N: tl.constexpr = BLOCK_N // 2 if SUBTILE else BLOCK_N
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K_], [K_, 1], [BLOCK_M, BLOCK_K])
    wg_desc = tl.make_tensor_descriptor(wg_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    wu_desc = tl.make_tensor_descriptor(wu_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    z_desc = tl.make_tensor_descriptor(z_ptr, [M, N], [N, 1], [BLOCK_M, SUB_N])
    s_desc = tl.make_tensor_descriptor(s_ptr, [M, N], [N, 1], [BLOCK_M, SUB_N])
    t_desc = tl.make_tensor_descriptor(t_ptr, [M, N], [N, 1], [BLOCK_M, SUB_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = K._grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K_, BLOCK_K)):
            xt = x_desc.load([row0, k * BLOCK_K])
            acc_g = K._dot(xt, wg_desc.load([col0, k * BLOCK_K]).T, acc_g)
            acc_u = K._dot(xt, wu_desc.load([col0, k * BLOCK_K]).T, acc_u)
        if SUBTILE:
            g0, g1 = tl.split(tl.permute(tl.reshape(acc_g, (BLOCK_M, 2, SUB_N)), (0, 2, 1)))
            u0, u1 = tl.split(tl.permute(tl.reshape(acc_u, (BLOCK_M, 2, SUB_N)), (0, 2, 1)))
            _epilogue_part(g0, u0, z_desc, s_desc, t_desc, z_ptr, s_ptr, t_ptr, row0, col0, M,
                           N, STORE_Z, STORE_SAVED, dtype, TMA_STORE, BLOCK_M, SUB_N)
            _epilogue_part(g1, u1, z_desc, s_desc, t_desc, z_ptr, s_ptr, t_ptr, row0,
                           col0 + SUB_N, M, N, STORE_Z, STORE_SAVED, dtype, TMA_STORE,
                           BLOCK_M, SUB_N)
        else:
            _epilogue_part(acc_g, acc_u, z_desc, s_desc, t_desc, z_ptr, s_ptr, t_ptr, row0,
                           col0, M, N, STORE_Z, STORE_SAVED, dtype, TMA_STORE, BLOCK_M,
                           BLOCK_N)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    P.add_args(ap)
    ap.add_argument("--flatten", action="store_true", help="also the flattened tile loops")
    args = ap.parse_args()
    p = P.Problem(args, width=28)
    m, n, k = p.m, p.n, p.k
    grid = (min(triton.cdiv(m, 128) * triton.cdiv(n, 128), p.sms),)

    def probe(store, flatten, tma_store, subtile, stages=3):
        return lambda: fwd_overlap_kernel[grid](
            p.x, p.wg, p.wu, *p.outs, m, n, k, STORE_Z=store[0], STORE_SAVED=store[1],
            BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=32, FLATTEN=flatten,
            TMA_STORE=tma_store, SUBTILE=subtile, num_warps=8, num_stages=stages)

    runs = {P.CUBLAS: p.cublas()}
    # (flatten, tma_store, subtile, stages); flatten measured 0.78-0.85 of cuBLAS on the
    # H200 (results/h200_probe_swiglu_linear_overlap.log), so only --flatten sweeps it.
    shapes = [(0, 0, 0, 3), (0, 0, 1, 3), (0, 1, 0, 3), (0, 1, 1, 3), (0, 1, 1, 4)]
    if args.flatten:
        shapes += [(1, ts, sub, 3) for ts in (0, 1) for sub in (0, 1)] + [(1, 1, 1, 4)]
    for store, sname in (((1, 1), "zst"), ((1, 0), "z")):
        runs[f"library {sname}"] = p.library(store)
        for fl, ts, sub, st in shapes:
            runs[f"flat{fl} tma{ts} sub{sub} st{st} {sname}"] = probe(store, fl, ts, sub, st)
    p.time(runs, p.check(runs, p.fused_outputs))


if __name__ == "__main__":
    main()
