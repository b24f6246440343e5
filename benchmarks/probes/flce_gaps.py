"""Where fk.fused_linear_cross_entropy's call time exceeds its kernel time: one forward +
backward at Llama-3-8B shapes (x 8192 x 4096, W 128256 x 4096, bf16) under torch.profiler,
printing the wall time, the summed kernel time, the largest idle gaps of the GPU between
kernels (with the CPU op running when each gap started) and the CPU ops by self time.

    python benchmarks/probes/flce_gaps.py [--chunk-size N]
"""
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import fk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--chunk-size", type=int, default=None)
    args = ap.parse_args()
    n, h, v = args.tokens, 4096, 128256
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")

    def step():
        x.grad = None
        w.grad = None
        fk.fused_linear_cross_entropy(x, w, t, chunk_size=args.chunk_size).backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    print(f"wall per fwd+bwd: median {statistics.median(walls):.2f} ms  "
          f"(min {min(walls):.2f}, max {max(walls):.2f})")
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    rows = []
    for _ in range(5):
        x.grad = None
        w.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ev[0].record()
        loss = fk.fused_linear_cross_entropy(x, w, t, chunk_size=args.chunk_size)
        t1 = time.perf_counter()
        ev[1].record()
        loss.backward()
        t2 = time.perf_counter()
        ev[2].record()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        rows.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3,
                     ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2])))
    print("host forward call / backward call / wait, GPU forward / backward (ms):")
    for r in rows:
        print("  " + "  ".join(f"{v:7.2f}" for v in r))
    st = torch.cuda.memory_stats()
    print("allocator: retries", st.get("num_alloc_retries"), "device allocs",
          st.get("num_device_alloc"), "syncs", st.get("num_sync_all_streams"))
    stats0 = torch.cuda.memory_stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    stats1 = torch.cuda.memory_stats()
    print("cudaMalloc calls during the profiled step:",
          stats1.get("num_device_alloc", 0) - stats0.get("num_device_alloc", 0),
          " cudaFree:", stats1.get("num_device_free", 0) - stats0.get("num_device_free", 0))
    events = prof.events()
    kernels = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e3
    span = (kernels[-1].time_range.end - kernels[0].time_range.start) / 1e3
    print(f"kernels: {len(kernels)}, summed {busy:.2f} ms, first start to last end {span:.2f} ms")
    gaps = []
    for a, b in zip(kernels, kernels[1:]):
        gap = b.time_range.start - a.time_range.end
        if gap > 20:
            gaps.append((gap, a.name, b.name))
    gaps.sort(reverse=True)
    print(f"gaps over 20 us: {len(gaps)}, total {sum(g[0] for g in gaps) / 1e3:.2f} ms")
    for gap, a, b in gaps[:12]:
        print(f"  {gap / 1e3:7.3f} ms after {a[:60]} before {b[:60]}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20,
                                    max_name_column_width=60))


if __name__ == "__main__":
    main()
