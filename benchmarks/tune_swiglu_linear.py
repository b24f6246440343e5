"""Sweep the forward tile configs of swiglu_linear and the block of its gate-gradient kernel
with Triton's JIT (tuning only; the library uses the AOT variants in
triton_src/swiglu_linear.py). At one shape (default: Llama-3-8B's MLP at 8192 tokens, bf16)
it times the forward in each style (pointer loads; TMA descriptors, one tile per program or
persistent, one program per SM) over the configs still in question after the H200 sweeps
(benchmarks/results/h200_tune_swiglu_linear.log),
checks each result against torch, and prints TFLOP/s next to cuBLAS (torch.matmul) on the
stacked weights; then the best config per style in each store mode (training: z, s, t;
no grad: z; recompute: s, t) and the gate-gradient kernel's bandwidth per block size.

    python benchmarks/tune_swiglu_linear.py [--tokens 8192] [--hidden 4096] [--inter 14336]
    python benchmarks/tune_swiglu_linear.py --quick        # two configs per style

The forward does 4 * M * N * K flops. A config that does not fit (shared memory,
registers) or fails to compile is reported and skipped. `--interpret` runs the whole sweep
under Triton's interpreter on the CPU at a tiny shape (a smoke test of this script; its
times mean nothing).
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
import triton.testing  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import swiglu_linear as K  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages), the leaders of the first sweep.
CANDIDATES = {
    "ptr": [(128, 128, 32, 8, 8, 5), (128, 128, 64, 8, 8, 3), (128, 128, 32, 8, 8, 4),
            (128, 128, 32, 16, 8, 5)],
    "tma": [(128, 128, 64, 8, 8, 3), (128, 128, 64, 16, 8, 3), (128, 128, 64, 8, 8, 4),
            (128, 128, 32, 8, 8, 5)],
    "persistent": [(128, 128, 64, 32, 8, 3), (128, 128, 64, 64, 8, 3), (128, 128, 64, 16, 8, 3),
                   (128, 128, 64, 8, 8, 3), (128, 128, 64, 128, 8, 3), (128, 128, 64, 32, 8, 4)],
}
# gate-gradient kernel: (BLOCK, warps)
GATE_CANDIDATES = [(1024, 4), (2048, 8), (4096, 8)]


# --- harness ----------------------------------------------------------------------------

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
SMS = 1  # multiprocessors of the GPU, set in main()


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


def cublas_ms(x, wcat, flops):
    """torch.matmul (cuBLAS) on the forward's products with the weights stacked, and on
    8192^3 for scale; printed; the first returned in ms."""
    ab = torch.empty(x.shape[0], wcat.shape[0], device=x.device, dtype=x.dtype)
    if not INTERPRET:
        sq = torch.randn(8192, 8192, device=x.device, dtype=x.dtype)
        sq_out = torch.empty_like(sq)
        sq_ms = bench(lambda: torch.matmul(sq, sq, out=sq_out))
        print(f"cuBLAS 8192^3: {sq_ms:.3f} ms {tflops(2 * 8192 ** 3, sq_ms):6.1f} TFLOP/s")
    ms = bench(lambda: torch.matmul(x, wcat.T, out=ab))
    print(f"cuBLAS fwd (stacked weights): {ms:.3f} ms {tflops(flops, ms):6.1f} TFLOP/s")
    return ms


class Problem:
    """The operands at one shape, the outputs the kernels write, and torch's results."""

    def __init__(self, m, n, k, dtype, device):
        self.m, self.n, self.k = m, n, k
        self.flops = 4.0 * m * n * k
        self.tol = 2e-2 if dtype != torch.float32 else 1e-4
        self.x = torch.randn(m, k, device=device, dtype=dtype)
        self.wg = torch.randn(n, k, device=device, dtype=dtype) * k ** -0.5
        self.wu = torch.randn(n, k, device=device, dtype=dtype) * k ** -0.5
        x, wg, wu = self.x.float(), self.wg.float(), self.wu.float()
        a, b = x @ wg.T, x @ wu.T
        sig = torch.sigmoid(a)
        self.z_ref = (a * sig * b).to(dtype)
        self.s_ref = (a * sig).to(dtype)
        self.t_ref = (b * (sig + a * sig * (1 - sig))).to(dtype)
        del a, b, sig, x, wg, wu
        self.z, self.s, self.t = (torch.empty_like(self.z_ref) for _ in range(3))

    def launcher(self, style, cfg, store=(1, 1)):
        """The aligned forward kernel of `style` launched on this problem with tile config
        cfg, on the grid the C++ launcher gives it."""
        bm, bn, bk, group, warps, stages = cfg
        m, n, k = self.m, self.n, self.k
        name = K.kernel_name(style, K.FLAG_ALIGNED)
        fn = getattr(K, name)
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        # A persistent grid: one program per SM (3 under the interpreter, so each program
        # walks several tiles).
        per_sm = K.programs_per_sm(style, name)
        grid = (min(tiles, 3 if INTERPRET else SMS) if per_sm else tiles,)
        return lambda: fn[grid](self.x, self.wg, self.wu, self.z, self.s, self.t, m, n, k,
                                store[0], store[1], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                GROUP_M=group, PER_SM=per_sm, num_warps=warps,
                                num_stages=stages)

    def error(self):
        return max(rel(self.z, self.z_ref), rel(self.s, self.s_ref), rel(self.t, self.t_ref))


def measure(p, label, run, ref_ms):
    """Run once, check against torch, time; print one line. TFLOP/s, or None on failure."""
    try:
        for out in (p.z, p.s, p.t):
            out.fill_(float("nan"))
        run()
        sync()
        err = p.error()
        ms = bench(run)
    except Exception as e:  # noqa: BLE001 - report the config and go on
        print(f"{label}: failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}")
        sync()
        return None
    ok = err < p.tol
    tf = tflops(p.flops, ms)
    print(f"{label}: {ms:7.3f} ms {tf:6.1f} TFLOP/s {100 * ref_ms / ms:5.1f} % of cuBLAS  "
          f"{'ok' if ok else f'WRONG (rel err {err:.2e})'}")
    return tf if ok else None


def sweep(p, styles, quick, ref_ms):
    """{style: (TFLOP/s, cfg)} of the best correct config per style."""
    best = {}
    for style in styles:
        for cfg in CANDIDATES[style][:2] if quick else CANDIDATES[style]:
            label = (f"fwd {style:10s} BM={cfg[0]:3d} BN={cfg[1]:3d} BK={cfg[2]:3d} "
                     f"G={cfg[3]:2d} warps={cfg[4]} stages={cfg[5]}")
            tf = measure(p, label, p.launcher(style, cfg), ref_ms)
            if tf and tf > best.get(style, (0.0, None))[0]:
                best[style] = (tf, cfg)
    return best


def store_modes(p, best, ref_ms):
    """The best config per style in each store mode, three times each in turn (the first
    sweep's run-to-run spread was about 2 %)."""
    for store, name in (((1, 1), "z, s, t (training)"), ((1, 0), "z only (no grad)"),
                        ((0, 1), "s, t (recompute)")):
        for rep in range(1 if INTERPRET else 3):
            for style, (_, cfg) in best.items():
                ms = bench(p.launcher(style, cfg, store))
                print(f"fwd {style:3s} {cfg} writing {name} #{rep}: {ms:.3f} ms "
                      f"{tflops(p.flops, ms):6.1f} TFLOP/s {100 * ref_ms / ms:5.1f} % of cuBLAS")


def gate_grads(p):
    """The gate-gradient kernel (read dz, t, s; write da, db) per block size, against the
    bytes it must move; and torch doing the same with two multiplications."""
    dz = torch.randn_like(p.s_ref)
    da, db = torch.empty_like(dz), torch.empty_like(dz)
    n = dz.numel()
    nbytes = 5 * n * dz.element_size()
    for block, warps in GATE_CANDIDATES[:1] if INTERPRET else GATE_CANDIDATES:
        grid = (triton.cdiv(n, block),)
        run = lambda: K.swiglu_linear_gate_grads_kernel[grid](  # noqa: E731
            dz, p.t_ref, p.s_ref, da, db, n, BLOCK=block, num_warps=warps)
        run()
        sync()
        err = max(rel(da, dz.float() * p.t_ref.float()), rel(db, dz.float() * p.s_ref.float()))
        ok = err < p.tol
        ms = bench(run)
        print(f"gate grads BLOCK={block} warps={warps}: {ms:.3f} ms "
              f"{nbytes / ms / 1e9:6.0f} GB/s {'ok' if ok else 'WRONG'}")
    ms = bench(lambda: (torch.mul(dz, p.t_ref, out=da), torch.mul(dz, p.s_ref, out=db)))
    print(f"gate grads torch (two muls): {ms:.3f} ms {6 * n * dz.element_size() / ms / 1e9:6.0f}"
          " GB/s (it moves 6 bytes an element where one kernel moves 5)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096, help="K: input width")
    ap.add_argument("--inter", type=int, default=14336, help="N: gate / up width")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--quick", action="store_true", help="two configs per style")
    ap.add_argument("--styles", default="ptr,tma,persistent",
                    help="which kernel styles to sweep")
    ap.add_argument("--interpret", action="store_true",
                    help="smoke test on the CPU under Triton's interpreter, tiny shape")
    args = ap.parse_args()
    if INTERPRET:
        args.tokens, args.hidden, args.inter, args.quick = 96, 64, 128, True
        device, name = "cpu", "Triton interpreter (CPU)"
        for style in CANDIDATES:  # tiles the interpreter gets through quickly
            CANDIDATES[style] = [(32, 32, 32, 2, 4, 2)] * 2
    else:
        device = "cuda"
        global SMS
        sms = SMS = torch.cuda.get_device_properties(0).multi_processor_count
        name = f"{torch.cuda.get_device_name(0)} ({sms} SMs)"
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                      device=device))
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    p = Problem(args.tokens, args.inter, args.hidden, dtype, device)
    print(f"swiglu_linear tune: M={p.m} tokens, K={p.k}, N={p.n}, {args.dtype}, {name}, "
          f"triton {triton.__version__}, torch {torch.__version__}; "
          f"{p.flops / 1e12:.2f} TFLOP per forward")
    ref_ms = cublas_ms(p.x, torch.cat([p.wg, p.wu]), p.flops)
    # TMA kernels are used for 16-bit dtypes only (triton_src/swiglu_linear.py).
    styles = [st for st in args.styles.split(",") if dtype != torch.float32 or st == "ptr"]
    best = sweep(p, styles, args.quick, ref_ms)
    store_modes(p, best, ref_ms)
    gate_grads(p)
    print("\nbest per style (the form of triton_src/swiglu_linear.py's _SM90 entries):")
    for style, (tf, cfg) in sorted(best.items()):
        print(f'  ("{style}", {", ".join(map(str, cfg))}),   # {tf:.1f} TFLOP/s, '
              f"{100 * tf / tflops(p.flops, ref_ms):.1f} % of cuBLAS")


if __name__ == "__main__":
    main()
