"""Cross entropy forward with the gradient at 8192 x 128256 bf16, in place: the library kernel
with each row split into CHUNKS chunks, one program each, the programs of a row launched as
one thread-block cluster. Each program runs the two passes over its chunk only; between
them the cluster meets once (a hardware cluster barrier) to combine the chunks' (max, sum
of exp). A chunk is 1-4 blocks, so pass 2 re-reads blocks read a few microseconds before
(L2 hits), where the one-program-per-row kernel re-reads a 250 KB row after 528 rows of
traffic (mostly misses).

The launch goes through Triton's compiled-kernel launcher with its cluster size set to
CHUNKS (the kernel itself is compiled for one CTA per program; program_id is the CTA's).
"k/SM" rows run k programs per SM (k x SMs / CHUNKS rows at once, each cluster walking
rows); "row/cluster" rows one cluster per row. The reference is the library's sm_90 config
(the one-program-per-row form when the sweeps of results/h200_probe_ce_cluster*.log ran,
whose chunks met through a global buffer; they exchange through distributed shared memory
since benchmarks/NOTES.md v9).

    python benchmarks/probes/ce_cluster.py [--rows 8192] [--vocab 128256] [--fine 1|2|3]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ce_probe import Problem  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--fine", type=int, default=0, help="1, 2, 3: the finer sweeps")
    ap.add_argument("--library-only", action="store_true",
                    help="time the copy and the library's config only")
    ap.add_argument("--profile", action="store_true",
                    help="run the library's config and the one-program-per-row form "
                         "(16384 x 16 warps) once each, untimed (for a profiler)")
    args = ap.parse_args()
    m, v = args.rows, args.vocab
    p = Problem(m, v, width=60)

    def clustered(block, warps, chunks, per_sm, maxnreg=None):
        """per_sm: programs per SM (rows at once: per_sm x SMs / chunks); 0: a row each."""
        fn = p.forward(block, warps, chunks,
                       m if per_sm == 0 else min(m, per_sm * p.sms // chunks), maxnreg)
        print(f"  ({p.regs[0]} registers, {p.regs[1]} spills)")
        return fn

    if args.profile:
        x = p.x0.clone()
        p.library(x)
        clustered(16384, 16, 1, 0)(p.x0.clone())
        torch.cuda.synchronize()
        return
    p.copy()
    p.reference()
    if args.library_only:
        return
    if args.fine == 1:  # around the best of the coarse sweep (4 chunks, 8192 x 8 w, 64 regs)
        shapes = [(b, w, r) for b, w in ((4096, 4), (4096, 8), (8192, 8))
                  for r in (40, 48, 56, 64)]
        chunk_list, per_sm_list = (4, 8), (0,)
    elif args.fine == 2:  # around the best of the first fine sweep (8 chunks, 4096 x 4 w)
        shapes = [(4096, 4, r) for r in (64, 72, 80, 96, None)]
        shapes += [(2048, 2, r) for r in (48, 64, 80)] + [(2048, 4, r) for r in (40, 48, 64)]
        chunk_list, per_sm_list = (8,), (0,)
    elif args.fine == 3:  # clusters of 16 (non-portable on sm_90) against the library's 8
        shapes = [(4096, 4, 64), (4096, 4, 56), (2048, 4, 64), (4096, 8, 40)]
        chunk_list, per_sm_list = (8, 16), (0,)
    else:
        shapes = ((16384, 16, None), (16384, 16, 64), (8192, 8, None), (8192, 8, 64),
                  (8192, 16, None), (16384, 32, None))
        chunk_list, per_sm_list = (2, 4, 8), (0, 4)
    for block, warps, maxnreg in shapes:
        for chunks in chunk_list:
            for per_sm in per_sm_list:
                name = (f"{chunks} chunks, {block} x {warps} w"
                        + (f" <= {maxnreg} regs" if maxnreg else "") + ", "
                        + (f"{per_sm}/SM" if per_sm else "row/cluster"))
                try:
                    fn = clustered(block, warps, chunks, per_sm, maxnreg)
                except Exception as e:  # a configuration that does not compile or fit
                    print(f"{name:60s} failed: {type(e).__name__}: {str(e)[:120]}")
                    continue
                p.check(name, fn)

if __name__ == "__main__":
    main()
