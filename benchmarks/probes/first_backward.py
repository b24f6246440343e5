"""Where the time of the first backward in a fresh process goes.

    python benchmarks/probes/first_backward.py fk|torch|trace
fk:    fk.rms_norm's first forward+backward, then a plain torch op's.
torch: a plain torch op's first, then fk's.
trace: the Python stack of the first module imported during a fresh CUDA backward.
"""
import builtins
import sys
import threading
import time
import traceback

import torch

import fk


def timed(label, fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    print(f"{label:>40}: {1e3 * (time.perf_counter() - t):9.2f} ms")
    return out


mode = sys.argv[1] if len(sys.argv) > 1 else "fk"
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn_like(x)
torch.cuda.synchronize()

if mode == "trace":
    orig, seen = builtins.__import__, []

    def hook(name, *args, **kwargs):
        if name not in sys.modules and not seen:
            seen.append((name, threading.current_thread().name,
                         "".join(traceback.format_stack(limit=14))))
        return orig(name, *args, **kwargs)

    builtins.__import__ = hook
    t = time.perf_counter()
    (x * 3).sum().backward()
    torch.cuda.synchronize()
    builtins.__import__ = orig
    print(f"first backward: {time.perf_counter() - t:.3f} s")
    for name, thread, stack in seen:
        print(f"first import during it: {name} (thread {thread})\n{stack}")
    sys.exit(0)

before = set(sys.modules)
if mode == "torch":
    a = timed("torch mul fwd (first)", lambda: x * 2)
    timed("torch mul backward (first)", lambda: a.backward(dy))
a = timed("fk autograd fwd (first)", lambda: fk.rms_norm(x, w, 1e-5))
timed("fk autograd backward (first)", lambda: a.backward(dy))
a = timed("torch mul fwd", lambda: x * 2)
timed("torch mul backward", lambda: a.backward(dy))
new = sorted(set(sys.modules) - before)
print(f"modules imported during the backward calls: {len(new)}: {new[:15]}")
