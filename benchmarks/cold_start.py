"""Time to the first result in a fresh process: rms_norm forward+backward (Llama-3-8B shape).

Each provider runs in its own new Python process with empty compiler caches (Triton's and
Inductor's cache directories point at new temporary folders), so the number includes
everything a user waits for on a first call: kernel loading for fk, JIT compilation and
autotuning for Liger and torch.compile. The CUDA context, the input tensors and torch's
symbolic-shape module (which torch's first backward with an explicit gradient imports, about
2 s for any op) are set up before the clock starts; `import fk` is timed separately.

    python benchmarks/cold_start.py [--providers fk,torch.compile,liger] [--tokens 8192]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t_import0 = time.perf_counter()
import torch
provider, tokens, hidden = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.cuda.init()
# torch's first backward with an explicit gradient imports its symbolic-shape module
# (sympy), about 2 s, whichever op runs; import it before the clock for every provider.
import torch.fx.experimental.symbolic_shapes  # noqa: F401
x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn_like(x)
torch.cuda.synchronize()
t0 = time.perf_counter()
if provider == "fk":
    import fk
    t_import = time.perf_counter() - t0
    fn = lambda x, w: fk.rms_norm(x, w, 1e-5)
elif provider == "torch.compile":
    t_import = 0.0
    def ref(x, w):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
        return w * y.to(x.dtype)
    fn = torch.compile(ref)
elif provider == "liger":
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    t_import = time.perf_counter() - t0
    fn = lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-5, 0.0, "llama")
t1 = time.perf_counter()
y = fn(x, w)
torch.cuda.synchronize()
t_fwd = time.perf_counter() - t1
y.backward(dy)
torch.cuda.synchronize()
t2 = time.perf_counter()
x.grad = w.grad = None
t3 = time.perf_counter()
fn(x, w).backward(dy)
torch.cuda.synchronize()
t_second = time.perf_counter() - t3
print(json.dumps({"provider": provider, "import_s": t_import, "first_call_s": t2 - t1,
                  "first_forward_s": t_fwd, "second_call_s": t_second,
                  "total_s": t2 - t0, "triton_imported": "triton" in sys.modules}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", default="fk,torch.compile,liger")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--out", default=None, help="write the rows as JSON lines here")
    args = ap.parse_args()
    rows = []
    for provider in args.providers.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(cache, "triton"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
            p = subprocess.run([sys.executable, "-c", CHILD, provider, str(args.tokens),
                                str(args.hidden)], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{provider}: failed: {p.stderr.strip().splitlines()[-1] if p.stderr else p.returncode}")
            continue
        row = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{provider:>14}: import {row['import_s']:.3f} s, first fwd+bwd {row['first_call_s']:.3f} s, "
              f"(forward {row['first_forward_s']:.3f} s), second fwd+bwd {row['second_call_s']:.4f} s, "
              f"total {row['total_s']:.3f} s, triton imported: {row['triton_imported']}")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
