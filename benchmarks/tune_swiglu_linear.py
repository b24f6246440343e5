"""Sweep tile configs of the swiglu_linear kernels with Triton's JIT (tuning only; the library
uses the AOT variants in triton_src/swiglu_linear.py). At one shape (default: Llama-3-8B's
MLP at 8192 tokens, bf16) it times the forward, dx and dW kernels of both styles (pointer
loads, TMA descriptors) over a list of tile configs, checks each result against torch,
and prints TFLOP/s next to cuBLAS (torch.matmul) doing the same products on stacked
weights, then the best config per kernel and style in the form triton_src takes.

    python benchmarks/tune_swiglu_linear.py [--tokens 8192] [--hidden 4096] [--inter 14336]
    python benchmarks/tune_swiglu_linear.py --quick        # three configs per kernel and style
    python benchmarks/tune_swiglu_linear.py --kernels fwd --styles tma,tma_ws

The flops of every kernel are 4 * M * N * K (two M x N x K products). A config that does not
fit (shared memory, registers) or fails to compile is reported and skipped.
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import swiglu_linear as K  # noqa: E402
from swiglu_linear import _dot, _grouped_tile, _silu_factors  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages); the reduction step is BLOCK_K for fwd,
# BLOCK_N for dx and BLOCK_M for dw (see triton_src/swiglu_linear.py). The pointer and TMA
# styles share a list; warp specialization ("tma_ws") takes 4-warp configs, to which Triton
# adds two consumer warp groups (12 warps in all).
CANDIDATES = {
    "fwd": [(128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 128, 32, 8, 8, 4),
            (128, 128, 32, 8, 8, 5), (128, 64, 64, 8, 4, 3), (128, 64, 64, 8, 4, 4),
            (64, 128, 64, 8, 4, 4), (256, 64, 64, 8, 8, 3), (256, 64, 64, 8, 8, 4),
            (128, 128, 64, 16, 8, 3), (128, 128, 64, 4, 8, 3), (128, 64, 128, 8, 4, 3)],
    "dx": [(128, 64, 128, 8, 8, 3), (128, 64, 128, 8, 8, 2), (128, 32, 128, 8, 8, 3),
           (128, 32, 128, 8, 8, 4), (128, 64, 64, 8, 4, 3), (128, 64, 64, 8, 8, 4),
           (256, 32, 64, 8, 8, 3), (128, 128, 64, 8, 8, 2), (128, 64, 128, 16, 8, 3),
           (128, 64, 128, 4, 8, 3)],
    "dw": [(64, 128, 128, 8, 8, 3), (64, 128, 128, 8, 8, 2), (32, 128, 128, 8, 8, 4),
           (32, 128, 128, 8, 8, 5), (64, 128, 64, 8, 8, 4), (32, 256, 64, 8, 8, 4),
           (64, 64, 128, 8, 4, 3), (64, 128, 128, 16, 8, 3), (64, 128, 128, 4, 8, 3)],
}
WS_CANDIDATES = {
    "fwd": [(128, 64, 64, 8, 4, 3), (128, 64, 64, 8, 4, 4), (128, 128, 64, 8, 4, 3),
            (128, 128, 32, 8, 4, 5), (128, 128, 64, 8, 4, 4)],
    "dx": [(128, 64, 64, 8, 4, 3), (128, 32, 128, 8, 4, 4), (128, 32, 128, 8, 4, 3),
           (128, 64, 64, 8, 4, 2)],
    "dw": [(64, 128, 64, 8, 4, 3), (32, 128, 128, 8, 4, 4), (32, 128, 128, 8, 4, 3),
           (64, 128, 128, 8, 4, 2)],
}


def candidates(which, style, quick):
    cands = (WS_CANDIDATES if style == "tma_ws" else CANDIDATES)[which]
    return cands[:3] if quick else cands


# --- experimental candidates (not in the library) ---------------------------------------

@triton.jit
def fwd_persistent_tma_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K, store_z,
                              store_saved, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                              NUM_SMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Candidate: persistent forward (one program per SM walking the tiles), TMA loads, the
    tile loop flattened so that the next tile's loads overlap this tile's epilogue, with or
    without Triton's automatic warp specialization."""
    dtype = x_ptr.dtype.element_ty
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    wg_desc = tl.make_tensor_descriptor(wg_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    wu_desc = tl.make_tensor_descriptor(wu_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, k_tiles):
            xt = x_desc.load([row0, k * BLOCK_K])
            acc_g = _dot(xt, wg_desc.load([col0, k * BLOCK_K]).T, acc_g)
            acc_u = _dot(xt, wu_desc.load([col0, k * BLOCK_K]).T, acc_u)
        z, s, t = _silu_factors(acc_g, acc_u)
        out = row0.to(tl.int64) * N + col0 + (rm[:, None] * N + rn[None, :])
        mask = (rm < M - row0)[:, None] & (rn < N - col0)[None, :]
        # The store switches go into the masks: a branch here breaks the loop flattening.
        tl.store(z_ptr + out, z.to(dtype), mask=mask & (store_z != 0))
        tl.store(s_ptr + out, s.to(dtype), mask=mask & (store_saved != 0))
        tl.store(t_ptr + out, t.to(dtype), mask=mask & (store_saved != 0))


# --- harness ----------------------------------------------------------------------------

def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def kernel_fn(which, style):
    return getattr(K, K.kernel_name(which, style, K.FLAG_ALIGNED))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096, help="K: input width")
    ap.add_argument("--inter", type=int, default=14336, help="N: gate / up width")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--quick", action="store_true", help="three configs per kernel")
    ap.add_argument("--kernels", default="fwd,dx,dw", help="which kernels to sweep")
    ap.add_argument("--styles", default="ptr,tma,tma_ws", help="which kernel styles to sweep")
    args = ap.parse_args()
    m, k, n = args.tokens, args.hidden, args.inter
    dtype = DTYPES[args.dtype]
    dev = "cuda"
    torch.manual_seed(0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                  device=dev))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flops = 4.0 * m * n * k
    print(f"swiglu_linear tune: M={m} tokens, K={k}, N={n}, {args.dtype}, "
          f"{torch.cuda.get_device_name(0)} ({sms} SMs), triton {triton.__version__}, "
          f"torch {torch.__version__}; {flops / 1e12:.2f} TFLOP per kernel")

    x = torch.randn(m, k, device=dev, dtype=dtype)
    wg = torch.randn(n, k, device=dev, dtype=dtype) * k ** -0.5
    wu = torch.randn(n, k, device=dev, dtype=dtype) * k ** -0.5
    wcat = torch.cat([wg, wu])
    dz = torch.randn(m, n, device=dev, dtype=dtype)

    # cuBLAS on the same products with the two weights stacked.
    ab = torch.empty(m, 2 * n, device=dev, dtype=dtype)
    dab = torch.randn(m, 2 * n, device=dev, dtype=dtype)
    dxo = torch.empty(m, k, device=dev, dtype=dtype)
    dwo = torch.empty(2 * n, k, device=dev, dtype=dtype)
    cublas = {
        "fwd": bench(lambda: torch.matmul(x, wcat.T, out=ab)),
        "dx": bench(lambda: torch.matmul(dab, wcat, out=dxo)),
        "dw": bench(lambda: torch.matmul(dab.T, x, out=dwo)),
    }
    sq = torch.randn(8192, 8192, device=dev, dtype=dtype)
    sq_out = torch.empty_like(sq)
    sq_ms = bench(lambda: torch.matmul(sq, sq, out=sq_out))
    print(f"cuBLAS 8192^3: {sq_ms:.3f} ms {tflops(2 * 8192 ** 3, sq_ms):6.1f} TFLOP/s")
    for which, ms in cublas.items():
        print(f"cuBLAS {which} (stacked weights): {ms:.3f} ms {tflops(flops, ms):6.1f} TFLOP/s")
    del sq, sq_out, ab, dab, dxo, dwo

    # Reference results (fp32 products of the same operands).
    a = (x.float() @ wg.float().T)
    b = (x.float() @ wu.float().T)
    sig = torch.sigmoid(a)
    z_ref = (a * sig * b).to(dtype)
    s_ref = (a * sig).to(dtype)
    t_ref = (b * (sig + a * sig * (1 - sig))).to(dtype)
    del a, b, sig
    da = (dz.float() * t_ref.float()).to(dtype)
    db = (dz.float() * s_ref.float()).to(dtype)
    dx_ref = (da.float() @ wg.float() + db.float() @ wu.float()).to(dtype)
    dwg_ref = (da.float().T @ x.float()).to(dtype)
    del da, db

    z, s, t = (torch.empty(m, n, device=dev, dtype=dtype) for _ in range(3))
    dx = torch.empty(m, k, device=dev, dtype=dtype)
    dwg, dwu = torch.empty(n, k, device=dev, dtype=dtype), torch.empty(n, k, device=dev, dtype=dtype)
    tol = 2e-2 if dtype != torch.float32 else 1e-4

    def launch(which, style, cfg, store=(1, 1)):
        bm, bn, bk, group, warps, stages = cfg
        fn = kernel_fn(which, style)
        cx = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_warps=warps,
                  num_stages=stages)
        if which == "fwd":
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            return lambda: fn[grid](x, wg, wu, z, s, t, m, n, k, store[0], store[1], **cx)
        if which == "dx":
            grid = (triton.cdiv(m, bm) * triton.cdiv(k, bk),)
            return lambda: fn[grid](dz, s_ref, t_ref, wg, wu, dx, m, n, k, **cx)
        grid = (triton.cdiv(n, bn) * triton.cdiv(k, bk),)
        return lambda: fn[grid](dz, s_ref, t_ref, x, dwg, dwu, m, n, k, **cx)

    def check(which):
        if which == "fwd":
            return max(rel(z, z_ref), rel(s, s_ref), rel(t, t_ref))
        return rel(dx, dx_ref) if which == "dx" else rel(dwg, dwg_ref)

    best = {}
    # TMA kernels are used for 16-bit dtypes only (triton_src/swiglu_linear.py).
    styles = [st for st in args.styles.split(",") if dtype != torch.float32 or st == "ptr"]
    for which in args.kernels.split(","):
        print(f"\n[{which}] cuBLAS {tflops(flops, cublas[which]):.1f} TFLOP/s")
        for style in styles:
            for cfg in candidates(which, style, args.quick):
                label = f"{which} {style:6s} BM={cfg[0]:3d} BN={cfg[1]:3d} BK={cfg[2]:3d} " \
                        f"G={cfg[3]:2d} warps={cfg[4]} stages={cfg[5]}"
                try:
                    fn = launch(which, style, cfg)
                    fn()
                    torch.cuda.synchronize()
                    err = check(which)
                    ms = bench(fn)
                except Exception as e:  # noqa: BLE001 - report the config and go on
                    print(f"{label}: failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    torch.cuda.synchronize()
                    continue
                ok = "ok" if err < tol else f"WRONG (rel err {err:.2e})"
                tf = tflops(flops, ms)
                print(f"{label}: {ms:7.3f} ms {tf:6.1f} TFLOP/s "
                      f"{100 * cublas[which] / ms:5.1f} % of cuBLAS  {ok}")
                if err < tol and tf > best.get((which, style), (0, None))[0]:
                    best[(which, style)] = (tf, cfg)
        if which == "fwd":
            # The three store modes of the best forward config of each style.
            for style in styles:
                if (which, style) not in best:
                    continue
                cfg = best[(which, style)][1]
                for store, name in (((1, 0), "z only (no grad)"), ((0, 1), "s, t (recompute)"),
                                    ((1, 1), "z, s, t (training)")):
                    ms = bench(launch(which, style, cfg, store))
                    print(f"fwd {style} {cfg} writing {name}: {ms:.3f} ms "
                          f"{tflops(flops, ms):6.1f} TFLOP/s")
            # Experimental: persistent TMA forward, with and without warp specialization.
            for ws in ((False, True) if "tma" in styles else ()):
                for cfg in ((128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 64, 64, 8, 4, 4)):
                    bm, bn, bk, group, warps, stages = cfg
                    label = f"fwd persistent-tma ws={ws} {cfg}"
                    try:
                        grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
                        fn = lambda: fwd_persistent_tma_kernel[grid](  # noqa: E731
                            x, wg, wu, z, s, t, m, n, k, 1, 1, BLOCK_M=bm, BLOCK_N=bn,
                            BLOCK_K=bk, GROUP_M=group, NUM_SMS=sms, WARP_SPECIALIZE=ws,
                            num_warps=warps, num_stages=stages)
                        z.zero_()
                        fn()
                        torch.cuda.synchronize()
                        err = check("fwd")
                        ms = bench(fn)
                    except Exception as e:  # noqa: BLE001
                        print(f"{label}: failed: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:120]}")
                        torch.cuda.synchronize()
                        continue
                    ok = "ok" if err < tol else f"WRONG (rel err {err:.2e})"
                    print(f"{label}: {ms:7.3f} ms {tflops(flops, ms):6.1f} TFLOP/s "
                          f"{100 * cublas['fwd'] / ms:5.1f} % of cuBLAS  {ok}")

    print("\nbest per kernel and style (triton_src/swiglu_linear.py _SM90 entry form):")
    for (which, style), (tf, cfg) in sorted(best.items()):
        print(f'  "{which}": ("{style}", {", ".join(map(str, cfg))}),   # {tf:.1f} TFLOP/s, '
              f"{100 * tf / tflops(flops, cublas[which]):.1f} % of cuBLAS")


if __name__ == "__main__":
    main()
