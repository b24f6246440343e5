"""Host time of one call, fwd and fwd+bwd, for fk ops and torch's, at a shape small enough
that the GPU waits on the host: what a call costs in Python, dispatcher, autograd and launch.

    python benchmarks/probes/host_overhead.py [--rows 64] [--hidden 4096] [--profile OP]

OP (for --profile): one of the case names below, e.g. "fk.dyt"; the profile lists self CPU
time per operator over 50 forward + backward calls.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import fk


def per_call_us(fn, iters=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()  # host time only: the GPU is far behind for tiny shapes
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--profile", default="", help="case to profile (CPU)")
    ap.add_argument("--experts", type=int, default=256, help="router_logits' experts")
    a = ap.parse_args()
    dev, dt, n = "cuda", torch.bfloat16, a.hidden
    x = torch.randn(a.rows, n, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(n, device=dev, dtype=dt, requires_grad=True)
    b = torch.randn(n, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(a.rows, n, device=dev, dtype=dt)
    alpha = torch.full((1,), 0.5, device=dev, dtype=dt, requires_grad=True)
    pw = torch.randn(3, device=dev, dtype=dt, requires_grad=True)
    pb = torch.randn(1, device=dev, dtype=dt, requires_grad=True)
    rw = torch.randn(a.experts, n, device=dev, dtype=dt, requires_grad=True)
    grads = {"fk.router_logits": torch.randn(a.rows, a.experts, device=dev)}
    params = (x, w, b, alpha, pw, pb, rw)
    cases = {
        "torch layer_norm": lambda: F.layer_norm(x, (n,), w, b, 1e-5),
        "fk.layer_norm": lambda: fk.layer_norm(x, w, b, 1e-5),
        "torch.ops.fk.layer_norm": lambda: torch.ops.fk.layer_norm(x, w, b, 1e-5),
        "torch rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-5),
        "fk.rms_norm": lambda: fk.rms_norm(x, w, 1e-5),
        "torch add (1 kernel)": lambda: x + w,
        "fk.dyt": lambda: fk.dyt(x, alpha, w, b),
        "torch dyt (3 kernels)": lambda: w * torch.tanh(alpha * x) + b,
        "fk.poly_norm": lambda: fk.poly_norm(x, pw, pb, 1e-6),
        "fk.router_logits": lambda: fk.router_logits(x, rw),
        "torch router (fp32 copies)": lambda: x.float() @ rw.float().t(),
    }
    grads["torch router (fp32 copies)"] = grads["fk.router_logits"]
    print(f"host us per call, {a.rows} x {n} bf16 (GPU idle-bound shapes)")
    print(f"{'case':28s} {'fwd no grad':>12s} {'fwd':>8s} {'fwd+bwd':>8s}")
    for name, f in cases.items():
        with torch.no_grad():
            t_ng = per_call_us(f)
        t_f = per_call_us(f)

        def full(f=f, g=grads.get(name, dy)):
            f().backward(g)
            for t in params:
                t.grad = None
        t_fb = per_call_us(full)
        print(f"{name:28s} {t_ng:12.1f} {t_f:8.1f} {t_fb:8.1f}")
    split = {}
    with torch.no_grad():
        print(f"{'_layer_norm_forward direct':28s} "
              f"{per_call_us(lambda: torch.ops.fk._layer_norm_forward(x, w, b, 1e-5)):12.1f}")
    # One operator below autograd (no dispatch to its Python autograd formula): the same call with CPU tensors (the
    # dispatcher, the stable-ABI boxing and fk's checks, plus a CPU kernel of 64 elements) and
    # with CUDA tensors (plus allocation, device guard, stream, context and launch).
    print(f"\n{'below autograd, 1 x 64 bf16':44s} {'cpu':>8s} {'cuda':>8s}")
    for dev2 in ("cpu", "cuda"):
        xs = torch.randn(1, 64, device=dev2, dtype=dt)
        ws, al = torch.randn(64, device=dev2, dtype=dt), torch.ones(1, device=dev2, dtype=dt)
        x0 = xs[:0]
        small = {
            "torch.ops.aten.tanh.default": lambda: torch.ops.aten.tanh.default(xs),
            "torch.ops.aten.empty_like.default": lambda: torch.ops.aten.empty_like.default(xs),
            "torch.ops.fk.dyt.default, 0 rows (no kernel)": lambda:
                torch.ops.fk.dyt.default(x0, al, ws, ws),
            "torch.ops.fk.dyt.default": lambda: torch.ops.fk.dyt.default(xs, al, ws, ws),
            "torch.ops.fk._dyt_backward.default": lambda: torch.ops.fk._dyt_backward.default(
                xs, xs, al, ws, ws, [True, True, True, True]),
            "torch.ops.fk._rms_norm_forward.default": lambda:
                torch.ops.fk._rms_norm_forward.default(xs, ws, 1e-6, 0.0, "llama"),
        }
        for name, f in small.items():
            with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
                split.setdefault(name, []).append(per_call_us(f, iters=2000))
    for name, (t_cpu, t_cuda) in split.items():
        print(f"{name:44s} {t_cpu:8.1f} {t_cuda:8.1f}")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        f, g = cases[a.profile], grads.get(a.profile, dy)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                f().backward(g)
                for t in params:
                    t.grad = None
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25,
                                        max_name_column_width=60))


if __name__ == "__main__":
    main()
