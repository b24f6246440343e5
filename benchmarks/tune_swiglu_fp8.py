"""Sweep the forward tile kernel of swiglu_fp8 / moe_swiglu_fp8 with Triton's JIT (tuning
only; the library uses the AOT variants in triton_src/swiglu_fp8.py): the aligned forms'
128-row tiles read as slabs (PACKED 1 plain, 2 MoE) over warps, for both copies and the
column-wise copy alone (that one also in 128 x 64 tiles); with --pass bwd the quantized
backward's tile, its plain and slab (PACKED 1) paths. Prints the median
time and the fraction of the measured copy bandwidth of the bytes each must move (read x,
write each float8 copy and its scales).

    python benchmarks/tune_swiglu_fp8.py [--tokens 8192] [--n 14336]
    python benchmarks/tune_swiglu_fp8.py --form moe [--tokens 8192] [--n 1408] [--experts 256]
    python benchmarks/tune_swiglu_fp8.py --pass bwd --warps 8,16  # the quantized backward
    TRITON_INTERPRET=1 python benchmarks/tune_swiglu_fp8.py --device cpu --form moe \
        --tokens 64 --n 256 --experts 4 --topk 2 --quick

The MoE form splits the tokens * topk rows evenly over the experts (benchmark_swiglu_fp8.py's
default). Every configuration's outputs must equal the library's (fk.swiglu_fp8 /
fk.moe_swiglu_fp8 of the installed wheel) before it is timed; under the interpreter (its own
bf16 and float8 casts) the first configuration's scales must be near the library's and every
other configuration's outputs equal to the first's.
"""
import argparse
import itertools

import torch
import triton

import _tune as T
import swiglu_fp8 as K  # noqa: E402 (triton_src on the path through _tune)


def _check_and_time(name, run, outs, wants, first, nbytes, scales_rtol=None):
    """Runs one configuration into ``outs`` (poisoned first) and times it. On the GPU its
    outputs must equal the library's (``wants``); under the interpreter (its own bf16 and
    float8 casts) the first configuration's scales must be near the library's (within
    ``scales_rtol``, when given) and every later one's outputs equal to the first's, which it
    returns."""
    for t in outs:
        t.fill_(float("nan")) if t.dtype == torch.float32 else t.view(torch.uint8).fill_(0x7F)
    run()
    got = [t.float() for t in outs]
    if T.DEVICE == "cuda":
        T.check(name, got, [t.float() for t in wants], 0.0)
    elif first is None:
        if scales_rtol is not None:
            T.check(name + " scales", [t for t in outs if t.dtype == torch.float32],
                    [t for t in wants if t.dtype == torch.float32], 0.0, rtol=scales_rtol)
    else:
        T.check(name, got, first, 0.0)
    T.timed(name, run, nbytes)
    return first or [g.clone() for g in got]


def sweep_bwd(x, m, n, dev, args):
    """The quantized backward's tile (dx of the plain form quantized in 1 x 128 blocks along
    2n, both copies or the column-wise one): its plain path and its slab path (PACKED 1)
    over warps, every output equal to the library's (fk.swiglu_fp8_backward)."""
    dh = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    for layout in ("both", "columnwise"):
        want = [t for t in torch.ops.fk.swiglu_fp8_backward(dh, x, layout, False)[1:]
                if t is not None]
        outs = [torch.empty_like(t) for t in want]
        row = layout == "both"
        q, s, qt, st = outs if row else (outs[0], outs[1], *outs)
        nbytes = 2 * (dh.numel() + x.numel()) + sum(t.numel() * t.element_size() for t in want)
        first = None
        for packed, warps in itertools.product((0, 1), [int(w) for w in args.warps.split(",")]):
            def run():
                K.swiglu_fp8_bwd_q_kernel[(triton.cdiv(m, 128), n // 128)](
                    dh, x, q, s, qt, st, m, n, int(row), 1, 0, TILE_M=128, TILE_N=128,
                    PACKED=packed, num_warps=warps)

            first = _check_and_time(f"bwd {layout:10s} PACKED {packed} warps {warps:2d}", run,
                                    outs, want, first, nbytes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--form", default="plain", choices=["plain", "moe"])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--n", type=int, default=None, help="intermediate size (14336 plain, "
                    "1408 MoE)")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"],
                    help="bwd: the quantized backward (plain form), PACKED 0 / 1 over warps")
    T.add_device_args(ap)
    args = ap.parse_args()
    T.setup(args.device)
    import fk

    moe = args.form == "moe"
    n = args.n or (1408 if moe else 14336)
    m = args.tokens * (args.topk if moe else 1)
    dev = T.DEVICE
    torch.manual_seed(0)
    x = torch.randn(m, 2 * n, device=dev, dtype=torch.bfloat16)
    if moe:
        e = args.experts
        probs = torch.rand(m, device=dev, dtype=torch.float32)
        tpe = torch.full((e,), m // e, device=dev, dtype=torch.int64)
        tpe[-1] += m - tpe.sum()
        blocks = T.segment_blocks(tpe, m, (m + 127 * e) // 128)
    else:
        e, probs, blocks = 0, x, x
    print(f"{args.form}: {m} x 2 x {n} bf16" + (f", {e} experts" if moe else "")
          + f"; library MoE warps {K.MOE_PACKED_WARPS}", flush=True)

    if args.which == "bwd":
        return sweep_bwd(x, m, n, dev, args)

    def library(layout):
        if moe:
            return torch.ops.fk.moe_swiglu_fp8(x, probs, tpe, layout, False, False)[:4]
        return torch.ops.fk.swiglu_fp8(x, layout, False, False)[:4]

    for layout in ("both", "columnwise"):
        want = library(layout)
        q, s, qt, st = (torch.empty_like(t) if t is not None else None for t in want)
        row = layout == "both"
        outs = [t for t in (q, s, qt, st) if t is not None]
        wants = [t for t in want if t is not None]
        nbytes = 2 * x.numel() + sum(t.numel() * t.element_size() for t in wants)
        tiles = (128, 64) if not row else (128,)
        configs = list(itertools.product(tiles, [int(w) for w in args.warps.split(",")]))
        if not row:
            configs.append((64, 2))
        if args.quick:
            configs = configs[:3]
        first = None
        for tn, warps in configs:
            rows = st.shape[0]

            def run():
                K.swiglu_fp8_fwd_kernel[(rows, triton.cdiv(n, tn))](
                    x, probs, blocks, q if row else qt, s if row else st, qt, st, x, m, n, e,
                    int(moe), int(row), 1, 0, 0, TILE_M=128, TILE_N=tn,
                    PACKED=2 if moe else 1, num_warps=warps)

            first = _check_and_time(f"{layout:10s} TILE_N {tn:3d} warps {warps}", run, outs,
                                    wants, first, nbytes, scales_rtol=0.02)


if __name__ == "__main__":
    main()
