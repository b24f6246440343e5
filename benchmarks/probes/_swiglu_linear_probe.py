"""What the swiglu_linear forward probes share: the Llama-3-8B MLP problem in bf16 (x, the
two weights and their stack, torch's z, s, t in float32 math as the reference), the
library's persistent TMA forward at its sm_90 config, and a check-then-time loop over named
callables, timed against cuBLAS's GEMM on the stacked weights."""
import os
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "triton_src"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import swiglu_linear as K  # noqa: E402
from _harness import rotations  # noqa: E402

CUBLAS = "cublas stacked"


def add_args(ap):
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--rounds", type=int, default=5)


def rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


class Problem:
    """x (M, K), Wg and Wu (N, K), their stack (2N, K); outputs z, s, t (outs) and the
    stacked product (ab), all bf16 on the GPU."""

    def __init__(self, args, width=30):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cuda"))
        self.m, self.n, self.k = m, n, k = args.tokens, args.inter, args.hidden
        self.rounds, self.width = args.rounds, width
        dev, dt = "cuda", torch.bfloat16
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.flops = 4.0 * m * n * k
        torch.manual_seed(0)
        self.x = torch.randn(m, k, device=dev, dtype=dt)
        self.wg = torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5
        self.wu = torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5
        self.wcat = torch.cat([self.wg, self.wu])
        a, b = self.x.float() @ self.wg.float().T, self.x.float() @ self.wu.float().T
        sig = torch.sigmoid(a)
        self.refs = ((a * sig * b).to(dt), (a * sig).to(dt),
                     (b * (sig + a * sig * (1 - sig))).to(dt))
        del a, b, sig
        self.outs = [torch.empty(m, n, device=dev, dtype=dt) for _ in range(3)]
        self.ab = torch.empty(m, 2 * n, device=dev, dtype=dt)

    def cublas(self):
        return lambda: torch.matmul(self.x, self.wcat.T, out=self.ab)

    def library(self, store):
        """The library's sm_90 16-bit forward (persistent TMA kernel) writing z (store[0])
        and s, t (store[1])."""
        style, bm, bn, bk, group, warps, stages = K.configs(90)[2]
        assert style == "persistent"
        tiles = triton.cdiv(self.m, bm) * triton.cdiv(self.n, bn)
        return lambda: K.swiglu_linear_fwd_tma_kernel[(min(tiles, self.sms),)](
            self.x, self.wg, self.wu, *self.outs, self.m, self.n, self.k, *store, 1.0, 1.0,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, PER_SM=1, SCALED=0,
            num_warps=warps, num_stages=stages)

    def fused_outputs(self, name):
        """(got, want) of a fused form: z, s, t for a name ending in "zst", else z."""
        n_out = 3 if name.endswith("zst") else 1
        return self.outs[:n_out], self.refs[:n_out]

    def check(self, runs, outputs):
        """Runs each callable of runs ({name: fn}; cuBLAS unchecked) once with its outputs
        filled with NaN first, compares outputs(name) = (got, want) and prints one line;
        the names that ran and matched."""
        ok = []
        for name, fn in runs.items():
            if name == CUBLAS:
                ok.append(name)
                continue
            try:
                for o in self.outs + [self.ab]:
                    o.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                got, want = outputs(name)
                nans = sum(int(g.isnan().sum()) for g in got)
                err = max(rel(g, w) for g, w in zip(got, want))
                good = nans == 0 and err < 2e-2
                print(f"{name:{self.width}s} rel err {err:.2e} nan {nans} "
                      f"{'ok' if good else 'WRONG'}", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{name:{self.width}s} failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:150]}")
                torch.cuda.synchronize()
                good = False
            if good:
                ok.append(name)
        return ok

    def time(self, runs, names):
        """Times runs[name] for each of names in self.rounds rounds, the order rotated each
        round (do_bench, median), and prints each one's rounds, median, TFLOP/s of the gated
        projection and fraction of cuBLAS's rate; returns {name: median ms}."""
        times = {nm: [] for nm in names}
        for nm in rotations(names, self.rounds):
            times[nm].append(do_bench(runs[nm], warmup=25, rep=100, return_mode="median"))

        def median(ts):
            return sorted(ts)[len(ts) // 2]

        ref = median(times[CUBLAS])
        for nm in names:
            med = median(times[nm])
            print(f"{nm:{self.width}s} " + " ".join(f"{t:.3f}" for t in times[nm])
                  + f"  median {med:.3f} ms {self.flops / med / 1e9:6.1f} TFLOP/s "
                  f"{ref / med:.3f} of cuBLAS")
        return {nm: median(times[nm]) for nm in names}
