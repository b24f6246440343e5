"""swiglu_linear's sm_90 forward under Triton's warp specialization for Hopper, with Triton's
JIT, against the library kernel and cuBLAS (Llama-3-8B MLP at 8192 tokens, bf16).

Triton 3.6 applies its Hopper warp specialization to a loop marked ``tl.range(...,
warp_specialize=True)`` only in a kernel of 4 warps: it then runs one producer warp group
(TMA loads) and two consumer warp groups (each half of the tile's rows), 12 warps in all,
with ``setmaxnreg`` moving registers to the consumers. With 8 warps the mark is ignored.
Variants:

  gemm ws       one accumulator of BLOCK_M x 2 BLOCK_N on the stacked weights (a plain GEMM:
                is the specialized pipeline as fast as cuBLAS here?)
  fused ws      the library's two accumulators (gate, up) fed by one x tile, one tile per
                program, the k loop specialized
  fused ws pers the same on a persistent grid (one program per SM walking the tiles)

Each variant is checked against torch (outputs first filled with NaN) and then timed with
the others in rounds, the order rotated each round.

    python benchmarks/probes/swiglu_linear_ws.py [--tokens 8192] [--rounds 5]
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _swiglu_linear_probe as P  # noqa: E402
from _swiglu_linear_probe import K  # noqa: E402


@triton.jit
def gemm_ws_kernel(x_ptr, w_ptr, c_ptr, M, N, K_, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WS: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K_], [K_, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    pid_m, pid_n = K._grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K_, BLOCK_K), warp_specialize=WS):
        acc = tl.dot(x_desc.load([row0, k * BLOCK_K]), w_desc.load([col0, k * BLOCK_K]).T, acc)
    c_desc.store([row0, col0], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def fused_ws_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K_, store_z, store_saved,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, WS: tl.constexpr, PERSISTENT: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K_], [K_, 1], [BLOCK_M, BLOCK_K])
    wg_desc = tl.make_tensor_descriptor(wg_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    wu_desc = tl.make_tensor_descriptor(wu_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    step = tl.num_programs(0) if PERSISTENT else tiles
    for tile in range(tl.program_id(0), tiles, step):
        pid_m, pid_n = K._grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(K_, BLOCK_K), warp_specialize=WS):
            xt = x_desc.load([row0, k * BLOCK_K])
            acc_g = tl.dot(xt, wg_desc.load([col0, k * BLOCK_K]).T, acc_g)
            acc_u = tl.dot(xt, wu_desc.load([col0, k * BLOCK_K]).T, acc_u)
        K._fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z,
                        store_saved, 1.0, 1.0, dtype, BLOCK_M, BLOCK_N, False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    P.add_args(ap)
    p = P.Problem(ap.parse_args())
    m, n, k = p.m, p.n, p.k
    ab_ref = torch.matmul(p.x, p.wcat.T)

    def gemm(bn, stages, ws=True, warps=4):
        grid = (triton.cdiv(m, 128) * triton.cdiv(2 * n, bn),)
        return lambda: gemm_ws_kernel[grid](p.x, p.wcat, p.ab, m, 2 * n, k, BLOCK_M=128,
                                            BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, WS=ws,
                                            num_warps=warps, num_stages=stages)

    def fused(store, bn, stages, persistent, group=8):
        tiles = triton.cdiv(m, 128) * triton.cdiv(n, bn)
        grid = (min(tiles, p.sms) if persistent else tiles,)
        return lambda: fused_ws_kernel[grid](
            p.x, p.wg, p.wu, *p.outs, m, n, k, *store, BLOCK_M=128, BLOCK_N=bn, BLOCK_K=64,
            GROUP_M=group, WS=True, PERSISTENT=persistent, num_warps=4, num_stages=stages)

    runs = {P.CUBLAS: p.cublas()}
    for bn, st in ((256, 3), (256, 4), (128, 4)):
        runs[f"gemm ws bn{bn} st{st}"] = gemm(bn, st)
    runs["gemm nows bn256 st3 w8"] = gemm(256, 3, ws=False, warps=8)
    for store, sname in (((1, 1), "zst"), ((1, 0), "z")):
        runs[f"library {sname}"] = p.library(store)
        for bn, st in ((128, 3), (128, 4), (64, 4)):
            runs[f"fused ws bn{bn} st{st} {sname}"] = fused(store, bn, st, False)
        runs[f"fused ws pers bn128 st3 {sname}"] = fused(store, 128, 3, True, 32)

    def outputs(name):
        return ([p.ab], [ab_ref]) if name.startswith("gemm") else p.fused_outputs(name)

    p.time(runs, p.check(runs, outputs))


if __name__ == "__main__":
    main()
