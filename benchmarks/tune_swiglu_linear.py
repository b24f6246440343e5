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
fit (shared memory, registers) or fails to compile is reported and skipped. `--interpret`
runs the whole sweep under Triton's interpreter on the CPU at a tiny shape (a smoke test of
this script; its times mean nothing).
"""
import argparse
import os
import statistics
import sys
import time

if "--interpret" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is first imported

import torch  # noqa: E402
import triton
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402

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

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def bench(fn):
    """Median ms of fn(): CUDA events (do_bench) on the GPU, a wall clock when interpreted."""
    if not INTERPRET:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def sync():
    if not INTERPRET:
        torch.cuda.synchronize()


def cublas_times(x, wg, wu, flops):
    """torch.matmul (cuBLAS) on the products of each kernel, with the weights stacked, and on
    8192^3 for scale; printed, and returned per kernel in ms."""
    wcat = torch.cat([wg, wu])
    ab = torch.empty(x.shape[0], wcat.shape[0], device=x.device, dtype=x.dtype)
    dab = torch.randn_like(ab)
    dxo, dwo = torch.empty_like(x), torch.empty_like(wcat)
    times = {
        "fwd": bench(lambda: torch.matmul(x, wcat.T, out=ab)),
        "dx": bench(lambda: torch.matmul(dab, wcat, out=dxo)),
        "dw": bench(lambda: torch.matmul(dab.T, x, out=dwo)),
    }
    if not INTERPRET:
        sq = torch.randn(8192, 8192, device=x.device, dtype=x.dtype)
        sq_out = torch.empty_like(sq)
        sq_ms = bench(lambda: torch.matmul(sq, sq, out=sq_out))
        print(f"cuBLAS 8192^3: {sq_ms:.3f} ms {tflops(2 * 8192 ** 3, sq_ms):6.1f} TFLOP/s")
    for which, ms in times.items():
        print(f"cuBLAS {which} (stacked weights): {ms:.3f} ms {tflops(flops, ms):6.1f} TFLOP/s")
    return times


class Problem:
    """The operands at one shape, the outputs the kernels write, and torch's results."""

    def __init__(self, m, n, k, dtype, device):
        self.m, self.n, self.k = m, n, k
        self.flops = 4.0 * m * n * k
        self.tol = 2e-2 if dtype != torch.float32 else 1e-4
        self.x = torch.randn(m, k, device=device, dtype=dtype)
        self.wg = torch.randn(n, k, device=device, dtype=dtype) * k ** -0.5
        self.wu = torch.randn(n, k, device=device, dtype=dtype) * k ** -0.5
        self.dz = torch.randn(m, n, device=device, dtype=dtype)
        x, wg, wu = self.x.float(), self.wg.float(), self.wu.float()
        a, b = x @ wg.T, x @ wu.T
        sig = torch.sigmoid(a)
        self.z_ref = (a * sig * b).to(dtype)
        self.s_ref = (a * sig).to(dtype)
        self.t_ref = (b * (sig + a * sig * (1 - sig))).to(dtype)
        del a, b, sig
        da = (self.dz.float() * self.t_ref.float()).to(dtype).float()
        db = (self.dz.float() * self.s_ref.float()).to(dtype).float()
        self.dx_ref = (da @ wg + db @ wu).to(dtype)
        self.dwg_ref = (da.T @ x).to(dtype)
        del da, db, x, wg, wu
        self.z, self.s, self.t = (torch.empty_like(self.dz) for _ in range(3))
        self.dx = torch.empty_like(self.x)
        self.dwg, self.dwu = torch.empty_like(self.wg), torch.empty_like(self.wu)

    def launcher(self, which, fn, cfg, store=(1, 1), extra=None):
        """fn launched on this problem for kernel `which` with tile config cfg."""
        bm, bn, bk, group, warps, stages = cfg
        m, n, k = self.m, self.n, self.k
        cx = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_warps=warps,
                  num_stages=stages, **(extra or {}))
        if which == "fwd":
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            if extra and "NUM_SMS" in extra:
                grid = (min(extra["NUM_SMS"], grid[0]),)
            return lambda: fn[grid](self.x, self.wg, self.wu, self.z, self.s, self.t, m, n, k,
                                    store[0], store[1], **cx)
        if which == "dx":
            grid = (triton.cdiv(m, bm) * triton.cdiv(k, bk),)
            return lambda: fn[grid](self.dz, self.s_ref, self.t_ref, self.wg, self.wu, self.dx,
                                    m, n, k, **cx)
        grid = (triton.cdiv(n, bn) * triton.cdiv(k, bk),)
        return lambda: fn[grid](self.dz, self.s_ref, self.t_ref, self.x, self.dwg, self.dwu,
                                m, n, k, **cx)

    def error(self, which):
        if which == "fwd":
            return max(rel(self.z, self.z_ref), rel(self.s, self.s_ref), rel(self.t, self.t_ref))
        return rel(self.dx, self.dx_ref) if which == "dx" else rel(self.dwg, self.dwg_ref)


def measure(p, which, label, run, cublas_ms):
    """Run once, check against torch, time; print one line. TFLOP/s, or None on failure."""
    try:
        for out in (p.z, p.s, p.t, p.dx, p.dwg):
            out.fill_(float("nan"))
        run()
        sync()
        err = p.error(which)
        ms = bench(run)
    except Exception as e:  # noqa: BLE001 - report the config and go on
        print(f"{label}: failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}")
        sync()
        return None
    ok = err < p.tol
    tf = tflops(p.flops, ms)
    print(f"{label}: {ms:7.3f} ms {tf:6.1f} TFLOP/s {100 * cublas_ms / ms:5.1f} % of cuBLAS  "
          f"{'ok' if ok else f'WRONG (rel err {err:.2e})'}")
    return tf if ok else None


def sweep(p, which, styles, quick, cublas_ms, best):
    for style in styles:
        fn = getattr(K, K.kernel_name(which, style, K.FLAG_ALIGNED))
        for cfg in candidates(which, style, quick):
            label = (f"{which} {style:6s} BM={cfg[0]:3d} BN={cfg[1]:3d} BK={cfg[2]:3d} "
                     f"G={cfg[3]:2d} warps={cfg[4]} stages={cfg[5]}")
            tf = measure(p, which, label, p.launcher(which, fn, cfg), cublas_ms)
            if tf and tf > best.get((which, style), (0.0, None))[0]:
                best[(which, style)] = (tf, cfg)


def forward_extras(p, styles, best, cublas_ms, sms, quick):
    """The store modes of the best forward config per style, and the persistent candidate."""
    for style in styles:
        if ("fwd", style) not in best:
            continue
        cfg = best[("fwd", style)][1]
        fn = getattr(K, K.kernel_name("fwd", style, K.FLAG_ALIGNED))
        for store, name in (((1, 0), "z only (no grad)"), ((0, 1), "s, t (recompute)"),
                            ((1, 1), "z, s, t (training)")):
            ms = bench(p.launcher("fwd", fn, cfg, store))
            print(f"fwd {style} {cfg} writing {name}: {ms:.3f} ms "
                  f"{tflops(p.flops, ms):6.1f} TFLOP/s")
    if "tma" not in styles:
        return
    cfgs = ((128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 64, 64, 8, 4, 4))
    for ws in (False, True):
        for cfg in cfgs[:1] if quick else cfgs:
            run = p.launcher("fwd", fwd_persistent_tma_kernel, cfg,
                             extra={"NUM_SMS": sms, "WARP_SPECIALIZE": ws})
            measure(p, "fwd", f"fwd persistent-tma ws={ws} {cfg}", run, cublas_ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096, help="K: input width")
    ap.add_argument("--inter", type=int, default=14336, help="N: gate / up width")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--quick", action="store_true", help="three configs per kernel and style")
    ap.add_argument("--kernels", default="fwd,dx,dw", help="which kernels to sweep")
    ap.add_argument("--styles", default="ptr,tma,tma_ws", help="which kernel styles to sweep")
    ap.add_argument("--interpret", action="store_true",
                    help="smoke test on the CPU under Triton's interpreter, tiny shape")
    args = ap.parse_args()
    if INTERPRET:
        args.tokens, args.hidden, args.inter, args.quick = 96, 64, 128, True
        device, sms, name = "cpu", 4, "Triton interpreter (CPU)"
    else:
        device = "cuda"
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        name = f"{torch.cuda.get_device_name(0)} ({sms} SMs)"
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                      device=device))
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    p = Problem(args.tokens, args.inter, args.hidden, dtype, device)
    print(f"swiglu_linear tune: M={p.m} tokens, K={p.k}, N={p.n}, {args.dtype}, {name}, "
          f"triton {triton.__version__}, torch {torch.__version__}; "
          f"{p.flops / 1e12:.2f} TFLOP per kernel")
    cublas = cublas_times(p.x, p.wg, p.wu, p.flops)
    # TMA kernels are used for 16-bit dtypes only (triton_src/swiglu_linear.py).
    styles = [st for st in args.styles.split(",") if dtype != torch.float32 or st == "ptr"]
    best = {}
    for which in args.kernels.split(","):
        print(f"\n[{which}] cuBLAS {tflops(p.flops, cublas[which]):.1f} TFLOP/s")
        sweep(p, which, styles, args.quick, cublas[which], best)
        if which == "fwd":
            forward_extras(p, styles, best, cublas["fwd"], sms, args.quick)
    print("\nbest per kernel and style (the form of triton_src/swiglu_linear.py's _SM90):")
    for (which, style), (tf, cfg) in sorted(best.items()):
        print(f'  "{which}": ("{style}", {", ".join(map(str, cfg))}),   # {tf:.1f} TFLOP/s, '
              f"{100 * tf / tflops(p.flops, cublas[which]):.1f} % of cuBLAS")


if __name__ == "__main__":
    main()
