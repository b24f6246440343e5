"""Sweep launch configurations and forms of the fp8_quantize kernel with Triton's JIT (tuning
only; the library uses the AOT variants in triton_src/fp8_quantize.py). Prints the median
time of each at one shape, and the fraction of copy bandwidth of the bytes it must move.

    python benchmarks/tune_fp8_quantize.py [--rows 8192] [--cols 4096]

Bytes: read x once; write each float8 copy asked for (1 byte an element) and its scales.
Copy bandwidth is measured here (a clone of a 1 GiB tensor: read + write).
Forms:
  whole: the library's kernel, one 128 x 128 tile held in registers per program.
  forms (--forms): where the column-wise copy is transposed, and a per-block reciprocal.
  chunked: one program per 128 x 128 tile read in column chunks of CH: each chunk's
    column-wise blocks are complete (128 rows), so it is quantized and stored at once; the
    row amax accumulates over the chunks, and a second loop re-reads the tile (from L1 / L2)
    to quantize the rows.
  packed (--packed): the library kernel's PACKED path (the tile read as four slabs of
    interleaved rows 4i + j; the column-wise copy's float8 bytes of rows 4i .. 4i + 3
    combined into one 32-bit word, so the transposed store moves a quarter as many
    elements) against its plain path, for 1 x 128 blocks (both copies, the column-wise
    one) and 128 x 128 blocks (both copies, the row-wise one; PACKED=2): checked bit for
    bit, then timed over warps.
  rowwise (--rowwise): the row-wise copy of 1 x 128 blocks alone (plain path) over tile
    rows and warps.
  persistent (--persistent): the library kernel's PERSISTENT path (the packed path over a
    persistent grid whose programs walk the tiles row-major with a stride of the grid, each
    loading its next tile's four slabs before it quantizes and stores the current one),
    checked bit for bit against the packed path one tile a program (both copies and the
    column-wise one), then timed over programs per multiprocessor and warps.
    ``--device cpu`` under TRITON_INTERPRET=1 runs the checks only, at a small shape with
    partial tiles.
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))
import fp8_quantize as K  # noqa: E402
from fp8_quantize import _quantize, _scale  # noqa: E402


@triton.jit
def chunked_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, want_row, want_col, pow2,
                   CH: tl.constexpr):
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    rows = rb.to(tl.int64) * 128 + tl.arange(0, 128)
    rmask = rows < M
    amax_r = tl.zeros((128,), tl.float32)
    for c in tl.static_range(0, 128, CH):
        cols = cb.to(tl.int64) * 128 + c + tl.arange(0, CH)
        cmask = cols < K
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        a = tl.abs(x)
        a = tl.where(a == a, a, float("inf"))
        amax_r = tl.maximum(amax_r, tl.max(a, axis=1))
        if want_col != 0:
            s_c = _scale(tl.max(a, axis=0), pow2)
            qt = _quantize(x, s_c[None, :])
            qt_offs = cols[:, None] * M + rows[None, :]
            tl.store(qt_ptr + qt_offs, tl.trans(qt).to(qt_ptr.dtype.element_ty),
                     mask=cmask[:, None] & rmask[None, :])
            tl.store(st_ptr + rb * K + cols, s_c, mask=cmask)
    if want_row != 0:
        s_r = _scale(amax_r, pow2)
        tl.store(s_ptr + cb * M + rows, s_r, mask=rmask)
        for c in tl.static_range(0, 128, CH):
            cols = cb.to(tl.int64) * 128 + c + tl.arange(0, CH)
            cmask = cols < K
            mask = rmask[:, None] & cmask[None, :]
            x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
            q = _quantize(x.to(tl.float32), s_r[:, None])
            tl.store(q_ptr + rows[:, None] * K + cols[None, :], q.to(q_ptr.dtype.element_ty),
                     mask=mask)


@triton.jit
def _scale_recip(amax, pow2):
    """(s, 1 / s): the candidate that multiplies by a per-block reciprocal."""
    s = _scale(amax, pow2)
    return s, tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)


@triton.jit
def _q(x, s, r, RECIP: tl.constexpr):
    if RECIP:
        q = x * r
        return tl.where(q > 448.0, 448.0, tl.where(q < -448.0, -448.0, q))
    return _quantize(x, s)


@triton.jit
def forms_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, want_row, want_col, pow2,
                 TILE_M: tl.constexpr, TILE_K: tl.constexpr, TRANS: tl.constexpr,
                 RECIP: tl.constexpr):
    """Candidates for the column-wise copy: TRANS 0 transposes the float32 quotients (the
    library), 1 the float8 values, 2 the input tile (16-bit) before anything else; RECIP
    multiplies by a per-block reciprocal instead of dividing each element."""
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    rows = rb.to(tl.int64) * TILE_M + tl.arange(0, TILE_M)
    cols = cb.to(tl.int64) * TILE_K + tl.arange(0, TILE_K)
    rmask = rows < M
    cmask = cols < K
    mask = rmask[:, None] & cmask[None, :]
    xr = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
    mask_t = cmask[:, None] & rmask[None, :]
    qt_offs = cols[:, None] * M + rows[None, :]
    if want_row != 0:
        x = xr.to(tl.float32)
        a = tl.abs(x)
        a = tl.where(a == a, a, float("inf"))
        s_r, r_r = _scale_recip(tl.max(a, axis=1), pow2)
        q = _q(x, s_r[:, None], r_r[:, None], RECIP)
        tl.store(q_ptr + rows[:, None] * K + cols[None, :], q.to(q_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(s_ptr + cb * M + rows, s_r, mask=rmask)
    if want_col != 0:
        if TRANS == 2:
            xt = tl.trans(xr).to(tl.float32)  # (TILE_K, TILE_M)
            a = tl.abs(xt)
            a = tl.where(a == a, a, float("inf"))
            s_c, r_c = _scale_recip(tl.max(a, axis=1), pow2)
            qt = _q(xt, s_c[:, None], r_c[:, None], RECIP)
            tl.store(qt_ptr + qt_offs, qt.to(qt_ptr.dtype.element_ty), mask=mask_t)
        else:
            x = xr.to(tl.float32)
            a = tl.abs(x)
            a = tl.where(a == a, a, float("inf"))
            s_c, r_c = _scale_recip(tl.max(a, axis=0), pow2)
            qt = _q(x, s_c[None, :], r_c[None, :], RECIP)
            if TRANS == 1:
                tl.store(qt_ptr + qt_offs, tl.trans(qt.to(qt_ptr.dtype.element_ty)), mask=mask_t)
            else:
                tl.store(qt_ptr + qt_offs, tl.trans(qt).to(qt_ptr.dtype.element_ty), mask=mask_t)
        tl.store(st_ptr + rb * K + cols, s_c, mask=cmask)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--forms", action="store_true", help="the candidate forms only")
    ap.add_argument("--packed", action="store_true", help="the packed form and the AOT tiles")
    ap.add_argument("--rowwise", action="store_true",
                    help="the row-wise copy of 1 x 128 blocks alone, over tiles and warps")
    ap.add_argument("--persistent", action="store_true",
                    help="the packed path over a persistent grid (PERSISTENT)")
    ap.add_argument("--device", default="cuda",
                    help="cpu (under TRITON_INTERPRET=1): the persistent path's checks only")
    args = ap.parse_args()
    m, k = args.rows, args.cols
    if args.device != "cuda":
        return persistent(None, 272, 200, None, None, cpu=True)
    big = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16)
    copy_ms = bench(lambda: big.clone())
    copy_bw = 2 * big.numel() * 2 / copy_ms / 1e9  # TB/s
    print(f"copy bandwidth (clone of 1 GiB): {copy_bw:.2f} TB/s")
    del big
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    f8 = torch.float8_e4m3fn
    q = torch.empty(m, k, device="cuda", dtype=f8)
    qt = torch.empty(k, m, device="cuda", dtype=f8)
    s = torch.empty(triton.cdiv(k, 128), m, device="cuda", dtype=torch.float32)
    st = torch.empty(triton.cdiv(m, 128), k, device="cuda", dtype=torch.float32)
    grid = (triton.cdiv(m, 128), triton.cdiv(k, 128))

    def traffic(row, col):
        return m * k * 2 + (row + col) * (m * k + m * k // 128 * 4)

    def report(name, fn, nbytes):
        try:
            ms = bench(fn)
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile
            print(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
            return
        tbs = nbytes / ms / 1e9
        print(f"{name}: {ms * 1e3:7.1f} us {tbs:5.2f} TB/s {100 * tbs / copy_bw:5.1f} % of copy")

    # the chunked form writes what the library's kernel writes
    outs = []
    for kern, kw in ((K.fp8_quantize_kernel, dict(TILE_M=128, TILE_K=128)),
                     (chunked_kernel, dict(CH=32))):
        bufs = [torch.full_like(b, 7) for b in (q, s, qt, st)]
        if kern is chunked_kernel:
            kern[grid](x, bufs[0], bufs[1], bufs[2], bufs[3], m, k, 1, 1, 0, **kw)
        else:
            kern[grid](x, bufs[0], bufs[1], bufs[2], bufs[3], m, k, 0, 1, 1, 0, **kw)
        outs.append([b.view(torch.uint8) if b.dtype == f8 else b for b in bufs])
    same = all(torch.equal(a, b) for a, b in zip(*outs))
    print(f"chunked form equal to the library's kernel: {same}")
    if args.packed:
        return packed(x, q, s, qt, st, m, k, traffic, report)
    if args.rowwise:
        for tm in (8, 16, 32, 64, 128):
            for warps in (1, 2, 4, 8):
                g = (triton.cdiv(m, tm), triton.cdiv(k, 128))
                report(f"rowwise TILE_M={tm:3d} warps={warps}",
                       lambda: K.fp8_quantize_kernel[g](x, q, s, qt, st, m, k, 0, 1, 0, 0,
                                                        TILE_M=tm, TILE_K=128,
                                                        num_warps=warps), traffic(1, 0))
        return
    if args.persistent:
        return persistent(x, m, k, traffic, report)
    if args.forms:
        for layout, row, col in (("both", 1, 1), ("rowwise", 1, 0), ("columnwise", 0, 1)):
            for trans in ((0,) if not col else (0, 1, 2)):
                for recip in (0, 1):
                    for warps in (4, 8, 16):
                        tiles = [(128, 128)]
                        if not col:
                            tiles = [(16, 128), (32, 128)]
                        elif not row:
                            tiles += [(128, 32), (128, 64)]
                        for tm, tk in tiles:
                            g = (triton.cdiv(m, tm), triton.cdiv(k, tk))
                            report(f"{layout:10s} forms TILE={tm}x{tk} TRANS={trans} "
                                   f"RECIP={recip} warps={warps:2d}",
                                   lambda: forms_kernel[g](x, q, s, qt, st, m, k, row, col, 0,
                                                           TILE_M=tm, TILE_K=tk, TRANS=trans,
                                                           RECIP=recip, num_warps=warps),
                                   traffic(row, col))
        return
    for layout, row, col in (("both", 1, 1), ("rowwise", 1, 0), ("columnwise", 0, 1)):
        for warps in (4, 8, 16):
            for stages in (1, 2):
                report(f"{layout:10s} whole   warps={warps:2d} stages={stages}",
                       lambda: K.fp8_quantize_kernel[grid](
                           x, q, s, qt, st, m, k, 0, row, col, 0, TILE_M=128, TILE_K=128,
                           num_warps=warps, num_stages=stages), traffic(row, col))
            for ch in (16, 32, 64):
                report(f"{layout:10s} chunked CH={ch:2d} warps={warps:2d}",
                       lambda: chunked_kernel[grid](x, q, s, qt, st, m, k, row, col, 0, CH=ch,
                                                    num_warps=warps), traffic(row, col))
        if layout == "rowwise":
            for tm in (16, 32, 64):
                for warps in (2, 4, 8):
                    g = (triton.cdiv(m, tm), triton.cdiv(k, 128))
                    report(f"{layout:10s} whole TILE_M={tm} warps={warps:2d}",
                           lambda: K.fp8_quantize_kernel[g](
                               x, q, s, qt, st, m, k, 0, 1, 0, 0, TILE_M=tm, TILE_K=128,
                               num_warps=warps), traffic(1, 0))
    sw = torch.empty(triton.cdiv(m, 128), triton.cdiv(k, 128), device="cuda",
                     dtype=torch.float32)
    for warps in (4, 8, 16):
        report(f"weight 128x128 rowwise warps={warps:2d}",
               lambda: K.fp8_quantize_kernel[grid](
                   x, q, sw, qt, sw, m, k, 1, 1, 0, 0, TILE_M=128, TILE_K=128,
                   num_warps=warps), m * k * 3)


def packed(x, q, s, qt, st, m, k, traffic, report):
    """The library kernel's PACKED path (the column-wise copy in 32-bit words; PACKED=2 for
    128 x 128 blocks) against its plain path, at each form's tile: equal outputs, then times
    over warps."""
    f8 = torch.float8_e4m3fn
    tiles = {flag: (tm, tk) for flag, tm, tk, _ in K.FORMS}
    sw = torch.empty(triton.cdiv(m, 128), triton.cdiv(k, 128), device="cuda")
    swt = torch.empty(triton.cdiv(k, 128), triton.cdiv(m, 128), device="cuda")
    for layout, row, col, flag, tk in (("both", 1, 1, 0, 128),
                                       ("columnwise", 0, 1, K.FLAG_COLS, 32),
                                       ("columnwise", 0, 1, K.FLAG_COLS, 64),
                                       ("weight both", 1, 1, K.FLAG_WEIGHT, 128),
                                       ("weight rows", 1, 0, K.FLAG_WEIGHT, 128)):
        tm = tiles[flag][0]
        g = (triton.cdiv(m, tm), triton.cdiv(k, tk))
        weight = int(flag == K.FLAG_WEIGHT)
        pks = (0, 2) if weight else (0, 1)
        ss, sst = (sw, swt) if weight else (s, st)
        outs = []
        for pk in pks:
            bufs = [torch.full_like(b, 7) for b in (q, ss, qt, sst)]
            K.fp8_quantize_kernel[g](x, *bufs, m, k, weight, row, col, 0, TILE_M=tm, TILE_K=tk,
                                     PACKED=pk)
            outs.append([b.view(torch.uint8) if b.dtype == f8 else b for b in bufs])
        same = all(torch.equal(a, b) for a, b in zip(*outs))
        print(f"{layout:11s} packed equal to plain: {same}")
        nbytes = m * k * 3 if weight and not col else m * k * 4 if weight else traffic(row, 1)
        for pk in pks:
            for w in (2, 4, 8, 16):
                ck = K.fp8_quantize_kernel[g](x, q, ss, qt, sst, m, k, weight, row, col, 0,
                                              TILE_M=tm, TILE_K=tk, PACKED=pk, num_warps=w)
                report(f"{layout:11s} TILE={tm}x{tk} PACKED={pk} warps={w:2d} "
                       f"regs={ck.n_regs} spills={ck.n_spills}",
                       lambda: K.fp8_quantize_kernel[g](x, q, ss, qt, sst, m, k, weight, row,
                                                        col, 0, TILE_M=tm, TILE_K=tk,
                                                        PACKED=pk, num_warps=w),
                       nbytes)


def persistent(x, m, k, traffic, report, cpu=False):
    """The PERSISTENT path against the packed path at each form's tile: equal outputs (every
    byte, including the partial tiles of the CPU shape), then times."""
    dev = "cpu" if cpu else "cuda"
    if cpu:
        torch.manual_seed(0)
        x = (torch.randn(m, k) * 3).to(torch.bfloat16)
        x[5, 7] = 0.0
        x[16:20, :] = 0.0  # all-zero column-wise blocks' rows
    f8 = torch.float8_e4m3fn
    tiles = {flag: (tm, tk) for flag, (tm, tk, _) in K.PACKED_FORMS.items()}
    sms = 4 if cpu else torch.cuda.get_device_properties(0).multi_processor_count
    for layout, row, flag in (("both", 1, 0), ("columnwise", 0, K.FLAG_COLS)):
        tm, tk = tiles[flag]
        ntiles = triton.cdiv(m, tm) * triton.cdiv(k, tk)

        def bufs():
            return [torch.full((m, k), 7, dtype=torch.uint8, device=dev).view(f8),
                    torch.full((triton.cdiv(k, 128), m), 7.0, device=dev),
                    torch.full((k, m), 7, dtype=torch.uint8, device=dev).view(f8),
                    torch.full((triton.cdiv(m, 128), k), 7.0, device=dev)]

        ref = bufs()
        K.fp8_quantize_kernel[(triton.cdiv(m, tm), triton.cdiv(k, tk))](
            x, *ref, m, k, 0, row, 1, 0, TILE_M=tm, TILE_K=tk, PACKED=1)
        for progs in ((3, ntiles) if cpu else (sms, 2 * sms, 3 * sms, 4 * sms)):
            got = bufs()
            K.fp8_quantize_kernel[(progs,)](x, *got, m, k, 0, row, 1, 0, TILE_M=tm, TILE_K=tk,
                                            PACKED=1, PERSISTENT=1)
            same = all(torch.equal(a.view(torch.uint8) if a.dtype == f8 else a,
                                   b.view(torch.uint8) if b.dtype == f8 else b)
                       for a, b in zip(ref, got))
            print(f"{layout:10s} persistent {progs} programs equal to the packed path: {same}",
                  flush=True)
            if not same:
                raise SystemExit("persistent path WRONG")
        if cpu:
            continue
        q, s, qt, st = bufs()
        g = (triton.cdiv(m, tm), triton.cdiv(k, tk))
        report(f"{layout:10s} packed TILE={tm}x{tk} one tile a program",
               lambda: K.fp8_quantize_kernel[g](x, q, s, qt, st, m, k, 0, row, 1, 0, TILE_M=tm,
                                                TILE_K=tk, PACKED=1,
                                                num_warps=K.PACKED_FORMS[flag][2]),
               traffic(row, 1))
        for per_sm in (1, 2, 3, 4, 6):
            for w in (2, 4, 8, 16):
                report(f"{layout:10s} persistent {per_sm}/SM warps={w:2d}",
                       lambda: K.fp8_quantize_kernel[(min(ntiles, per_sm * sms),)](
                           x, q, s, qt, st, m, k, 0, row, 1, 0, TILE_M=tm, TILE_K=tk,
                           PACKED=1, PERSISTENT=1, num_warps=w), traffic(row, 1))


if __name__ == "__main__":
    main()
