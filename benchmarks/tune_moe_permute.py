"""Sweep the data kernels of moe_permute / moe_unpermute with Triton's JIT (tuning only; the
library uses the AOT variants in triton_src/moe_permute.py): BLOCK_H (hidden columns per
step) and warps of the scatter kernel (moe_permute's forward: each token's row written to
its expert rows, the probs alongside; with the dot, moe_unpermute's backward) and of the
gather kernel (moe_unpermute's forward:
each token's rows summed, weighted by the probs; also moe_permute's backward). Prints the
median time and the fraction of the measured copy bandwidth of the bytes each must move.

    python benchmarks/tune_moe_permute.py [--tokens 8192] [--hidden 2048] [--experts 256]
        [--topk 8]
    TRITON_INTERPRET=1 python benchmarks/tune_moe_permute.py --device cpu --tokens 40 \
        --hidden 96 --experts 16 --topk 4 --quick

The row map comes from fk.moe_permute (the installed library), so each configuration runs on
the library's own layout; every output is checked against the library's before it is timed.

--part map: the three kernels that build the row map instead (count, scan, map), each swept
over its blocks and warps with the other two at the library's config; GPU time of the kernel
alone (torch.profiler), every configuration's row map, padded counts and row sources checked
against the library's first. The scan works in place and the map reads its result, so each
timed call starts from a copy of the table it would see in the library (not timed).
"""
import argparse

import torch
import triton

import _harness as H
import _tune as T
import moe_permute as K  # noqa: E402 (triton_src on the path through _tune)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--pad-to", type=int, default=16)
    ap.add_argument("--part", default="data", choices=["data", "map"])
    T.add_device_args(ap)
    args = ap.parse_args()
    T.setup(args.device)
    import fk

    t, h, e, k, dev = args.tokens, args.hidden, args.experts, args.topk, T.DEVICE
    dt = torch.bfloat16
    torch.manual_seed(0)
    idx = torch.randn(t, e, device=dev).topk(k, dim=1).indices
    rmap = torch.zeros(t, e, dtype=torch.bool, device=dev)
    rmap.scatter_(1, idx, True)
    probs = torch.softmax(torch.randn(t, e, device=dev), dim=1)
    x = torch.randn(t, h, device=dev, dtype=dt)
    permuted, pperm, row_map, tpe = fk.moe_permute(x, rmap, probs, pad_to=args.pad_to, topk=k)
    n = permuted.shape[0]
    src = torch.full((n,), -1, dtype=torch.int32, device=dev)
    routed = row_map >= 0
    src[row_map[routed].long()] = torch.arange(t, device=dev, dtype=torch.int32)[
        :, None].expand(t, e)[routed]
    if args.part == "map":
        sweep_map(rmap, args.pad_to, n, (row_map, tpe, src), args.quick)
        return
    want_unperm = fk.moe_unpermute(permuted, row_map, probs)
    elem = x.element_size()
    print(f"tokens {t}, hidden {h}, {e} experts top {k}, {n} permuted rows (pad_to "
          f"{args.pad_to}), bf16; library KB {K.KB}, BE {K.BE}, BLOCK_H {K.BLOCK_H['bf16']}",
          flush=True)

    blocks = (512, 2048) if args.quick else (256, 512, 1024, 2048)
    warps = (2, 4) if args.quick else (1, 2, 4, 8)

    def sweep(name, launch, outs, wants, nbytes, rtol):
        """Every (BLOCK_H, warps): outputs pre-filled with NaN, checked, then timed."""
        for bh in blocks:
            for w in warps:
                def run():
                    launch(bh, w)
                for o in outs:
                    o.fill_(float("nan"))
                run()
                T.check(f"{name} BLOCK_H={bh} warps={w}", outs, wants, 0.0, rtol=rtol)
                T.timed(f"{name:11s} BLOCK_H={bh:5d} warps={w:2d}", run, nbytes)

    # scatter: read x (t x h), write the t * k routed rows and zero the padding rows
    out = torch.empty_like(permuted)
    pout = torch.empty_like(pperm)
    sweep("scatter", lambda bh, w: K.moe_permute_scatter_kernel[(t + triton.cdiv(n, K.ZR),)](
        x, row_map, probs, out, probs, pout, out, probs, src, t, h, e, n, 0, 1, 0,
        KB=K.KB, BE=K.BE, BLOCK_H=bh, ZR=K.ZR, num_warps=w),
        [out, pout], [permuted, pperm], (t + n) * h * elem, 0.0)

    # scatter with the dot (moe_unpermute's backward): d permuted[row] = dy[t] * p[t, e] and
    # d p[t, e] = dy[t] . permuted[row]: read dy, write the routed rows, read them in permuted
    dy = torch.randn_like(x)
    yp = permuted.detach().clone().requires_grad_()
    pr = probs.detach().clone().requires_grad_()
    fk.moe_unpermute(yp, row_map, pr).backward(dy)
    dperm, dprobs = torch.empty_like(permuted), torch.empty_like(probs)
    sweep("scatter+dot", lambda bh, w: K.moe_permute_scatter_kernel[
        (t + triton.cdiv(n, K.ZR),)](
        dy, row_map, probs, dperm, probs, probs, permuted, dprobs, src, t, h, e, n, 1, 0, 1,
        KB=K.KB, BE=K.BE, BLOCK_H=bh, ZR=K.ZR, num_warps=w),
        [dperm, dprobs], [yp.grad, pr.grad], (t + n + t * k) * h * elem, 8e-3)

    # gather: read the t * k routed rows, write t x h (probs-weighted fp32 sums)
    un = torch.empty_like(x)
    sweep("gather", lambda bh, w: K.moe_unpermute_gather_kernel[(t,)](
        permuted, row_map, probs, un, probs, probs, t, h, e, n, 1, 0,
        KB=K.KB, BE=K.BE, BLOCK_H=bh, num_warps=w),
        [un], [want_unperm], (t * k + t) * h * elem, 8e-3)


def sweep_map(rmap, pad_to, n, wants, quick):
    """The count, scan and map kernels over their blocks and warps (one swept at a time, the
    others at the library's config), each checked, then timed alone."""
    t, e = rmap.shape
    dev = rmap.device
    m8 = rmap.view(torch.int8)
    # the library's (block, block, warps) of each kernel, from its variants' table
    lib = {}
    for part, (first, second) in (("count", ("BT", "BE")), ("scan", ("NBB", "BE")),
                                  ("map", ("BT", "BE"))):
        _, _, cx, warps = K._MAP_KERNELS[f"moe_permute_{part}"]
        lib[part] = (cx[first], cx[second], warps)
    print(f"tokens {t}, {e} experts, {n} rows (pad_to {pad_to}); library (blocks, warps): "
          + ", ".join(f"{p} {b0} x {b1}, {w}" for p, (b0, b1, w) in lib.items()), flush=True)

    def pipeline(count, scan, mapk):
        """The three launches at these (block, block, warps); returns the three kernels as
        callables, each restoring (untimed) the table it reads."""
        (bt, bec, wc), (nbb, bes, ws), (btm, bem, wm) = count, scan, mapk
        nb = triton.cdiv(t, bt)
        blk = torch.empty(nb, e, dtype=torch.int32, device=dev)
        tpe = torch.empty(e, dtype=torch.int32, device=dev)
        row_map = torch.full((t, e), -9, dtype=torch.int32, device=dev)
        src = torch.full((n,), -1, dtype=torch.int32, device=dev)
        ok = torch.empty((), dtype=torch.int8, device=dev)

        def fc():
            K.moe_permute_count_kernel[(nb, triton.cdiv(e, bec))](m8, blk, t, e, BT=bt, BE=bec,
                                                                  num_warps=wc)

        def fs():
            K.moe_permute_scan_kernel[(triton.cdiv(e, bes),)](blk, tpe, nb, e, pad_to, NBB=nbb,
                                                               BE=bes, num_warps=ws)

        def fm():
            K.moe_permute_map_kernel[(nb, triton.cdiv(e, bem))](
                m8, blk, tpe, row_map, src, ok, t, e, n, BT=btm, BE=bem, num_warps=wm)
        fc()
        counts = blk.clone()
        fs()
        scanned = blk.clone()
        fm()
        T.check("row map, padded counts, row sources", [row_map, tpe, src], list(wants), 0.0)
        assert int(ok.item()) == 1, "the rows-fit flag"
        return {"count": fc, "scan": lambda: (blk.copy_(counts), fs()),
                "map": lambda: (blk.copy_(scanned), fm())}

    def timed(name, fn):
        if T.DEVICE != "cuda":
            fn()
            return
        us = 1e3 * H.kernel_ms(fn, torch.device("cuda"), iters=15, names=("moe_permute_",))
        print(f"{name}: {us:6.2f} us", flush=True)

    sweeps = {
        "count": [(bt, be, w) for bt in (32, 64, 128) for be in (64, 128, 256) for w in (1, 2, 4)],
        "scan": [(nbb, be, w) for nbb in (64, 128) for be in (16, 32, 64) for w in (1, 2, 4)],
        "map": [(bt, be, w) for bt in (32, 64, 128) for be in (64, 128) for w in (2, 4, 8)],
    }
    if quick:
        sweeps = {"count": [(8, 4, 1)], "scan": [(2, 2, 1)], "map": [(8, 4, 1)]}
    for part, configs in sweeps.items():
        for cfg in configs:
            cfgs = dict(lib, **{part: cfg})
            if part != "scan":  # the count and map kernels share their token blocks
                other = "map" if part == "count" else "count"
                cfgs[other] = (cfg[0], *lib[other][1:])
            fns = pipeline(cfgs["count"], cfgs["scan"], cfgs["map"])
            timed(f"{part:5s} blocks {cfg[0]:3d} x {cfg[1]:3d} warps {cfg[2]}", fns[part])


if __name__ == "__main__":
    main()
