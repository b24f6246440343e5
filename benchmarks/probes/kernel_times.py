"""GPU time per kernel of one forward+backward, from torch.profiler, next to the wall time
per iteration: shows whether an op's benchmark time is GPU work or launch overhead.

    python benchmarks/probes/kernel_times.py layer_norm cross_entropy softmax
"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import fk

N = 8192
CASES = {
    "layer_norm": lambda: ((torch.randn(N, 4096), torch.randn(4096), torch.randn(4096)),
                           lambda x, w, b: fk.layer_norm(x, w, b),
                           lambda x, w, b: F.layer_norm(x, (4096,), w, b)),
    "softmax": lambda: ((torch.randn(N, 32768),), lambda x: fk.softmax(x, -1),
                        lambda x: torch.softmax(x, -1)),
    "cross_entropy": lambda: ((torch.randn(N, 128256), torch.randint(0, 128256, (N,))),
                              lambda x, t: fk.cross_entropy(x, t),
                              lambda x, t: F.cross_entropy(x.float(), t)),
}


def run(name, provider, fn, make):
    def inputs():
        return [a.cuda().to(torch.bfloat16).requires_grad_() if a.is_floating_point()
                else a.cuda() for a in make()]

    def step(args):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*args)
        g = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
        out.backward(g)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    for _ in range(3):
        step(inputs())
    args = inputs()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = step(args)
    rows = [(e.key, e.device_time_total, e.count) for e in prof.key_averages()
            if e.device_time_total > 0]
    total = sum(r[1] for r in rows)
    print(f"{name} {provider}: kernels {total:.1f} us, wall {wall * 1e6:.1f} us")
    for key, us, count in sorted(rows, key=lambda r: -r[1]):
        print(f"   {us:9.1f} us  x{count}  {key[:90]}")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        inputs, fk_fn, ref_fn = CASES[name]()
        make = lambda inputs=inputs: [a.clone() for a in inputs]  # noqa: E731
        run(name, "fk", fk_fn, make)
        run(name, "torch", ref_fn, make)
