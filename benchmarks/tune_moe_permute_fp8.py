"""Sweep the kernels of moe_permute_fp8 with Triton's JIT (tuning only; the library uses the
AOT variants in triton_src/moe_permute_fp8.py): the scatter kernel's 128-column blocks per
step (NB) and warps (the row-wise copy alone), and the tile kernel's warps and form (plain
or slabs; the column-wise copy, and both), for the column-wise copy alone in slabs also the
tile's width (TILE_K 128, 64 and 32: the library's FLAG_COLS variant, COLS_TILE, against
the 128 columns of the others). Prints the median time and the fraction of the measured copy
bandwidth of the bytes each must move (read the tokens, write each float8 copy of the T * k
routed rows and its scales).

    python benchmarks/tune_moe_permute_fp8.py [--tokens 8192] [--hidden 2048] [--experts 256]
    TRITON_INTERPRET=1 python benchmarks/tune_moe_permute_fp8.py --device cpu --tokens 40 \
        --hidden 256 --experts 16 --topk 4 --quick

The row map comes from fk.moe_permute_fp8 (the installed library), whose outputs every
configuration must reproduce (values; NaN-free inputs) before it is timed.
"""
import argparse

import torch
import triton

import _tune as T
import moe_permute_fp8 as K  # noqa: E402 (triton_src on the path through _tune)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--pad-to", type=int, default=16)
    T.add_device_args(ap)
    args = ap.parse_args()
    T.setup(args.device)
    import fk

    t, h, e, k, dev = args.tokens, args.hidden, args.experts, args.topk, T.DEVICE
    torch.manual_seed(0)
    idx = torch.randn(t, e, device=dev).topk(k, dim=1).indices
    rmap = torch.zeros(t, e, dtype=torch.bool, device=dev)
    rmap.scatter_(1, idx, True)
    probs = torch.softmax(torch.randn(t, e, device=dev), dim=1)
    x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
    q, s, qt, st, pp, row_map, tpe = fk.moe_permute_fp8(x, rmap, probs, pad_to=args.pad_to,
                                                        topk=k, layout="both")
    n = q.shape[0]
    src = torch.full((n,), -1, dtype=torch.int32, device=dev)
    routed = row_map >= 0
    src[row_map[routed].long()] = torch.arange(t, device=dev, dtype=torch.int32)[
        :, None].expand(t, e)[routed]
    rows_t = st.shape[0]
    one = t * k * h + 4 * t * k * triton.cdiv(h, 128)
    print(f"tokens {t}, hidden {h}, {e} experts top {k}, {n} permuted rows (pad_to "
          f"{args.pad_to}), bf16; library NB {K.NB['bf16']}, scatter warps {K.SCATTER_WARPS}, "
          f"tile warps {K.TILE_WARPS}, column-wise alone (TILE_K, warps) {K.COLS_TILE}",
          flush=True)

    def f8(a):
        return a.float()

    # Under the interpreter (--device cpu) the float8 cast itself may land a value just
    # below a power of two one binade low: the data are checked within a factor of 2 there
    # (a logic check), exactly on the GPU.
    rtol = 0.5 if dev == "cpu" else 0.0

    # the row-wise copy alone: the scatter kernel
    q2, s2, pp2 = torch.empty_like(q), torch.empty_like(s), torch.empty_like(pp)
    for nb in ((2, 4) if args.quick else (1, 2, 4, 8)):
        for w in ((1, 2) if args.quick else (1, 2, 4)):
            def run():
                K.moe_permute_fp8_scatter_kernel[(t + triton.cdiv(n, K.ZR),)](
                    x, row_map, q2, s2, probs, pp2, src, t, h, e, n, 1, 0, KB=K.KB, BE=K.BE,
                    NB=nb, ZR=K.ZR, num_warps=w)
            for v in (q2, s2, pp2):  # an element not written shows
                v.fill_(float("nan"))
            run()
            T.check(f"scatter NB={nb} warps={w}", [s2, pp2], [s, pp], 0.0)
            T.check(f"scatter NB={nb} warps={w} data", f8(q2), f8(q), 0.0, rtol)
            T.timed(f"scatter  NB={nb} warps={w}", run, t * h * 2 + one)

    # the column-wise copy, and both: the tile kernel
    q3, s3, qt3, pp3 = (torch.empty_like(v) for v in (q, s, qt, pp))
    st3 = torch.empty((rows_t + 1, h), device=dev)
    blocks = T.segment_blocks(tpe, n, rows_t + 1)
    for want_row in (0, 1):
        for packed in (0, 1):
            # the row-wise copy's 1 x 128 blocks need 128 columns a tile; the column-wise
            # copy alone in slabs (the aligned variant) also narrower tiles
            for tk in ((128, 64, 32) if packed and not want_row else (128,)):
                for w in ((4,) if args.quick else (2, 4, 8)):
                    def run():
                        K.moe_permute_fp8_tile_kernel[(rows_t + 1, triton.cdiv(h, tk))](
                            x, src, blocks, probs, pp3, q3, s3, qt3, st3, t, h, e, n, want_row,
                            1, 0, PACKED=packed, TILE_K=tk, num_warps=w)
                    for v in (q3, s3, qt3, st3, pp3):  # an element not written shows
                        v.fill_(float("nan"))
                    run()
                    name = f"tile row={want_row} packed={packed} TILE_K={tk} warps={w}"
                    T.check(name, [st3[:rows_t], pp3] + ([s3] if want_row else []),
                            [st, pp] + ([s] if want_row else []), 0.0)
                    T.check(name + " data", [f8(qt3)] + ([f8(q3)] if want_row else []),
                            [f8(qt)] + ([f8(q)] if want_row else []), 0.0, rtol)
                    T.timed(f"tile {'both' if want_row else 'col '} packed={packed} "
                            f"TILE_K={tk:3d} warps={w}", run, t * h * 2 + one * (1 + want_row))


if __name__ == "__main__":
    main()
