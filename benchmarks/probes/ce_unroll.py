"""Cross entropy forward with the gradient at 8192 x 128256 bf16, in place, at the library's
sm_90 plain config (rows split over clusters of 8 programs of 4 warps, four 4096-column
blocks a chunk, 64 registers): the element loops unrolled, so that a program has more than
one block's loads in flight. Nsight Compute found the split kernel waiting on memory at half
occupancy (benchmarks/NOTES.md v8); each pass handles one 8 KB block at a time and reduces
it before the next block's loads are issued.

  p1 xU    pass 1 (DRAM reads, online max / sum of exp) as tl.range(..., loop_unroll_factor=U)
  p2 xU    pass 2 (re-read from L2, gradient written) likewise
  regs N   the same under a register cap of N (fewer programs per SM, more registers each)

The forms are built from triton_src/cross_entropy.py's text at run time, checked against the
library kernel's losses and gradient, and timed in rotating order (do_bench, L2 flushed
before each call), with each form's registers and spills.

    python benchmarks/probes/ce_unroll.py [--rounds 3]
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ce_probe import Problem, ce, parser, rotations  # noqa: E402

ROWS = 8192
_PASS1 = ("            for start in range(c0, c1, BLOCK):\n"
          "                cols = start + lanes\n"
          "                mask = cols < c1\n"
          "                x = tl.load(")
_PASS2 = "                for i in range(0, nblk):\n"
# (pass-1 unroll, pass-2 unroll, register cap or None for the library's)
FORMS = {"p1 x2": (2, 1, None), "p1 x4": (4, 1, None), "p2 x2": (1, 2, None),
         "p1 x2 p2 x2": (2, 2, None), "p1 x4 p2 x4": (4, 4, None),
         "p1 x2 regs 72": (2, 1, 72), "p1 x2 regs 80": (2, 1, 80),
         "p1 x2 p2 x2 regs 80": (2, 2, 80), "p1 x4 p2 x2 regs 96": (4, 2, 96)}


def _form(name, src, tmp, u1, u2):
    out = src
    if u1 > 1:
        assert out.count(_PASS1) == 1
        out = out.replace(_PASS1, _PASS1.replace(
            "range(c0, c1, BLOCK)", f"tl.range(c0, c1, BLOCK, loop_unroll_factor={u1})"))
    if u2 > 1:
        assert out.count(_PASS2) == 1
        out = out.replace(_PASS2, _PASS2.replace(
            "range(0, nblk)", f"tl.range(0, nblk, loop_unroll_factor={u2})"))
    return Problem.load_text("ce_unroll_" + name.replace(" ", "_"), out, tmp)


def main():
    args = parser().parse_args()
    p = Problem(ROWS, 128256, width=50)
    src = open(ce.__file__).read()
    forms = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (u1, u2, cap) in FORMS.items():
            mod = _form(name, src, tmp, u1, u2)
            fn = p.forward(p.block, p.warps, p.chunks, p.rows_at_once, cap or p.maxnreg,
                           mod.cross_entropy_fwd_kernel)
            print(f"{name:{p.width}s} registers {p.regs[0]}, spills {p.regs[1]}", flush=True)
            forms.append((name, fn))
        regs, spills = p.library_regs
        print(f"{'library':{p.width}s} registers {regs}, spills {spills}", flush=True)
        p.copy()
        p.reference()
        forms.append(("library (again)", p.library))
        for name, fn in rotations(forms, args.rounds):
            p.check(name, fn)


if __name__ == "__main__":
    main()
