"""Cross entropy forward with the gradient at 8192 x 128256, in place, rows split over
clusters of 8 programs (the library's sm_90 plain config): the same kernel compiled as the
probes compile it and as the library does.

Triton's JIT specializes integer arguments equal to 1 into constants and integers
divisible by 16 into aligned values; the ahead-of-time build compiles one signature in
which M, write_grad and the flags are run-time values (only the row lengths and strides
are declared multiples of 16). The "AOT signature" rows pass those arguments through
`do_not_specialize`, so they run what the wheel runs. Each form in bf16 and fp16, rounds in
rotating order (do_bench, L2 flushed before each call); registers and spill slots as ptxas
reports them.

--old PATH also times an earlier kernel source that took a reduction flag (1: "mean")
before write_grad, e.g. v9's first form:
    git show 71c13d8:triton_src/cross_entropy.py > /tmp/ce_v9a.py

    python benchmarks/probes/ce_signature.py [--rounds 3] [--old /tmp/ce_v9a.py]
"""
import os
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ce_probe import Problem, ce, parser, rotations  # noqa: E402

ROWS = 8192
RUNTIME_INTS = ["M", "has_weight", "has_softcap", "reduction", "write_grad", "ignore_index"]


def main():
    args = parser(old="an earlier kernel source taking a reduction flag").parse_args()
    p = Problem(ROWS, 128256, width=44)
    sources = [("library", ce.cross_entropy_fwd_kernel, p.args())]
    if args.old:
        old = Problem.load_source("ce_signature_old", args.old)
        sources.append(("old", old.cross_entropy_fwd_kernel, p.args()[:-1] + (1, 1)))

    def form(kernel, head, dtype, aot):
        keep = [a for a in RUNTIME_INTS if a in kernel.arg_names] if aot else []
        jf = triton.jit(do_not_specialize=keep)(kernel.fn)
        x0 = p.x0.to(dtype)
        fn = p.library_form(jf, head, x0)
        xb = x0.clone()
        return p.regs, lambda: fn(xb)

    forms = []
    for src, kernel, head in sources:
        for dtype in (torch.bfloat16, torch.float16):
            for aot in (False, True):
                name = (f"{src} {str(dtype).split('.')[-1]} "
                        f"{'AOT signature' if aot else 'JIT-specialized'}")
                regs, fn = form(kernel, head, dtype, aot)
                print(f"{name:{p.width}s} {regs[0]} registers, {regs[1]} spill slots")
                forms.append((name, fn))
    p.copy()
    for name, fn in rotations(forms, args.rounds):
        p._line(name, do_bench(fn, warmup=50, rep=300, return_mode="median"))


if __name__ == "__main__":
    main()
