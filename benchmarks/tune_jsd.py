"""Sweep the jsd forward kernel (loss and gradient in one pass) with Triton's JIT (tuning
only; the library uses the AOT variants in triton_src/jsd.py): its (BLOCK, CHUNK, warps)
and candidate forms with cheaper special functions. Prints the median time and the fraction
of the measured copy bandwidth at one shape, for the training call (loss and gradient:
x, y read, the gradient written; jsd's backward only scales that gradient, nothing for a
grad_output of 1) and for the loss alone (x, y read).

    python benchmarks/tune_jsd.py [--rows 8192] [--vocab 128256] [--dtype bf16] [--quick]
    TRITON_INTERPRET=1 python benchmarks/tune_jsd.py --device cpu   # candidates' logic check

"library" is the kernel's libdevice form (FAST = 0), which fp32 runs; the library's 16-bit
variants run the exp2-asm form (FAST = 1, triton_src/jsd.py's _terms_base2) since this sweep.
Candidates (each checked against the library kernel's loss partials and gradient first,
for beta in (0, 1) and the two KL limits, with ignored rows):
  exp2      log2 / exp2 forms: the inputs scaled by log2(e) once, ln 2 folded into the
            per-program constants beta ln 2 and (1 - beta) ln 2.
  exp2-asm  the same with ex2.approx / lg2.approx written as PTX (GPU only: the
            interpreter has no inline assembly; checked on the GPU before it is timed):
            three MUFU operations an element, the fewest instructions.
  poly      exp2-asm with the logarithm (its argument w_s + w_o e in [min(beta, 1 - beta),
            1]) as a bit split and a polynomial on the FMA pipe: two MUFU operations an
            element (the two ex2).
  poly2     poly with the exponential of min - max also on the FMA pipe
            (_tune.exp2_poly): one MUFU operation an element.
The library kernel already shares one exponential (q and p from 2^s and 2^(min - s)); its
logarithm is libdevice's logf, which uses no MUFU but many FMA-pipe instructions: two MUFU
operations an element. MUFU runs at 16 operations a clock per multiprocessor (sm_90).
--sass (no GPU needed) compiles each form for sm_90 and counts its SASS instructions, all
and MUFU.
"""
import argparse

import torch
import triton
import triton.language as tl

import _tune as T
import jsd as K  # noqa: E402 (triton_src on the path through _tune)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LOG2E = K.LOG2E
LN2 = K.LN2


@triton.jit
def _ex2(u, ASM: tl.constexpr):
    if ASM:
        return K._ex2(u)
    else:
        return tl.exp2(u)


@triton.jit
def _lg2(u, ASM: tl.constexpr):
    if ASM:
        return K._lg2(u)
    else:
        return tl.log2(u)


@triton.jit
def _lg2_poly(a):
    """log2(a) for a normal positive fp32 a without MUFU: a = 2^k f with f in
    [sqrt(1/2), sqrt(2)) from the bits, then log2(f) = m P(m), m = f - 1, P a degree-9
    least-squares fit on Chebyshev nodes (below 2e-8 relative with fp32 coefficients;
    evaluated in fp32, 1.5e-7 relative at most over [0.01, 140] under the interpreter)."""
    bits = a.to(tl.int32, bitcast=True)
    k = (bits - 0x3F3504F3) >> 23
    m = (bits - (k << 23)).to(tl.float32, bitcast=True) - 1.0
    s = -0.11020158976316452
    s = s * m + 0.18631209433078766
    s = s * m - 0.19102497398853302
    s = s * m + 0.2045752853155136
    s = s * m - 0.23961904644966125
    s = s * m + 0.2885688841342926
    s = s * m - 0.3606966435909271
    s = s * m + 0.4808982014656067
    s = s * m - 0.7213473320007324
    s = s * m + 1.4426950216293335
    return k.to(tl.float32) + m * s


@triton.jit
def jsd_fwd_exp2_kernel(x_ptr, y_ptr, grad_ptr, labels_ptr, count_ptr, partial_ptr, x_stride,
                        y_stride, grad_stride, V, chunk, n_chunks, ignore_index, beta, inv_n,
                        mode, has_labels, write_grad, BLOCK: tl.constexpr,
                        ASM: tl.constexpr, POLY: tl.constexpr):
    """Candidate: jsd_fwd_kernel in base 2. u = x log2(e), v = y log2(e); mode 0:
    s = max(u, v), e = 2^(min(u, v) - s), es = 2^s, log2 m = s + log2(w_s + w_o e), and
    l = beta ln2 p (v - log2 m) + (1 - beta) ln2 q (u - log2 m), g the second term.
    Numerics: the scaling by log2(e) rounds once per input (a relative 2^-24 of |x|, so
    absolute errors of a few 1e-6 at |x| ~ 30 in the exponents) and ln 2 multiplies the
    constants instead of each difference; otherwise the library's formula (the same two
    exponentials and one logarithm, never underflowing log m). ASM: ex2.approx.ftz /
    lg2.approx.ftz (2 ulp; results below 2^-126 flush to 0, so q or p under 1e-38 is 0).
    POLY: the logarithm by _lg2_poly (FMA pipe; its argument w_s + w_o e lies in
    [min(beta, 1 - beta), 1], always normal), relative error 1.5e-7 at most (about 2
    ulp, as lg2.approx). POLY == 2: also e = 2^(min - s) by _tune.exp2_poly (relative error
    about 1e-7; 0 where min - s < -126 instead of a subnormal): one MUFU operation an
    element."""
    dtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_chunks
    start = (pid - row * n_chunks) * chunk
    end = tl.minimum(start + chunk, V)
    lanes = tl.arange(0, BLOCK)
    g_row = grad_ptr + row * grad_stride
    lab = tl.load(labels_ptr + row, mask=has_labels != 0, other=0)
    if (has_labels == 0) | (lab != ignore_index):
        scale = K._scale(count_ptr, inv_n, has_labels)
        cq = (1.0 - beta) * LN2          # (1 - beta) ln 2
        cp = beta * LN2                  # beta ln 2
        gsc = cq * scale                 # gradient factor, the 1 / n folded in
        x_row = x_ptr + row * x_stride
        y_row = y_ptr + row * y_stride
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for i in range(start, end, BLOCK):
            cols = i + lanes
            mask = cols < V
            u = tl.load(x_row + cols, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32) * LOG2E
            v = tl.load(y_row + cols, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32) * LOG2E
            if mode == 1:
                p = _ex2(v, ASM)
                l = (p * (v - u)) * LN2
                g = -p * scale
            elif mode == 2:
                q = _ex2(u, ASM)
                l = (q * (u - v)) * LN2
                g = (l + q) * scale
            else:
                y_big = v >= u
                s = tl.maximum(u, v)
                if POLY == 2:
                    e = T.exp2_poly(tl.minimum(u, v) - s)
                else:
                    e = _ex2(tl.minimum(u, v) - s, ASM)
                es = _ex2(s, ASM)
                w_s = tl.where(y_big, beta, 1.0 - beta)
                if POLY != 0:
                    lm = s + _lg2_poly(w_s + (1.0 - w_s) * e)
                else:
                    lm = s + _lg2(w_s + (1.0 - w_s) * e, ASM)
                q = tl.where(y_big, es * e, es)
                p = tl.where(y_big, es, es * e)
                qd = q * (u - lm)
                l = cp * p * (v - lm) + cq * qd
                g = gsc * qd
            acc += tl.where(mask, l, 0.0)
            if write_grad != 0:
                tl.store(g_row + cols, g.to(dtype), mask=mask, eviction_policy="evict_first")
        tl.store(partial_ptr + pid, tl.sum(acc, axis=0))
    else:
        if write_grad != 0:
            zero = tl.zeros((BLOCK,), dtype=dtype)
            for i in range(start, end, BLOCK):
                cols = i + lanes
                tl.store(g_row + cols, zero, mask=cols < V)
        tl.store(partial_ptr + pid, 0.0)


FORMS = {  # name: (ASM, POLY); None: the library kernel
    "library": None,
    "exp2": (False, 0),
    "exp2-asm": (True, 0),
    "poly": (True, 1),
    "poly2": (True, 2),
    "poly-noasm": (False, 1),  # the interpreter's forms of poly and poly2
    "poly2-noasm": (False, 2),
}


def launcher(form, x, y, grad, labels, count, partial, beta, mode, has_labels, write_grad,
             block, chunk, warps):
    rows, v = x.shape
    n_chunks = triton.cdiv(v, chunk)
    grid = (rows * n_chunks,)
    args = (x, y, grad, labels, count, partial, v, v, v, v, chunk, n_chunks, -100, beta,
            1.0 / rows, mode, has_labels, write_grad)
    if FORMS[form] is None:
        return lambda: K.jsd_fwd_kernel[grid](*args, BLOCK=block, FAST=0, num_warps=warps)
    asm, poly = FORMS[form]
    return lambda: jsd_fwd_exp2_kernel[grid](*args, BLOCK=block, ASM=asm, POLY=poly,
                                             num_warps=warps)


def log_probs(rows, v, dtype, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    out = torch.empty(rows, v, device=device, dtype=dtype)
    for r in range(0, rows, 1024):  # in slices: the fp32 logits of all rows are 4 GB
        z = torch.randn(min(1024, rows - r), v, device=device, generator=gen) * 3
        out[r:r + 1024] = torch.log_softmax(z, dim=-1).to(dtype)
    return out


def check_forms(forms, dtype, device, block, chunk, warps):
    """Each form against the library kernel at a small shape: beta 0.5 / 0.1 / 0 / 1, with
    labels (some rows ignored) and without, the gradient and the loss partials."""
    rows, v = 6, 3 * chunk // 2 + 7
    x = log_probs(rows, v, dtype, device, 1)
    y = log_probs(rows, v, dtype, device, 2)
    x[0, :5] = torch.tensor([-30.0, 0.0, -80.0, -0.5, -100.0], dtype=dtype)
    y[0, :5] = torch.tensor([0.0, -30.0, -100.0, -0.4, -80.0], dtype=dtype)
    labels = torch.tensor([1, -100, 3, 4, -100, 5], device=device)
    n_chunks = triton.cdiv(v, chunk)
    for beta, mode in ((0.5, 0), (0.1, 0), (0.0, 1), (1.0, 2)):
        for has_labels in (0, 1):
            want = {}
            for form in ["library"] + list(forms):
                count = torch.tensor([4 if has_labels else 0], device=device,
                                     dtype=torch.int32)
                grad = torch.full_like(x, 7.0)
                partial = torch.full((rows * n_chunks,), 7.0, device=device)
                launcher(form, x, y, grad, labels, count, partial, beta, mode, has_labels, 1,
                         block, chunk, warps)()
                if form == "library":
                    want = (grad, partial)
                    continue
                # the gradient: a bf16 / fp16 rounding apart at most, relative to the row's
                # scale; the loss partials: fp32 sums of a chunk
                eps = torch.finfo(dtype).eps
                T.check(f"{form} beta={beta} labels={has_labels} grad", grad, want[0],
                        atol=1e-6 if dtype == torch.float32 else 2 * eps / rows * 1e-3,
                        rtol=2e-5 if dtype == torch.float32 else eps)
                T.check(f"{form} beta={beta} labels={has_labels} loss partials", partial,
                        want[1], atol=1e-4, rtol=1e-4)


def sass_counts(forms, dtype_name, block, warps):
    """Compile each form for sm_90 (no GPU needed) and count the SASS instructions of the
    whole kernel and its MUFU ones (ex2 / lg2 / rcp). mode is a runtime argument, so the
    counts hold all three branches (modes 1 and 2: one ex2 an element each); each loop body
    holds BLOCK / (32 warps) elements a thread, unrolled. At the library's bf16
    configuration (16 elements a thread) the base counts are 16 + 16 ex2 for modes 1 / 2
    and a few rcp; the rest is mode 0's."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    dt = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[dtype_name]
    sig = K._signature(K._FWD_ARGS, dt, {"BLOCK": block, "FAST": 0})
    for form in ["library"] + list(forms):
        if FORMS[form] is None:
            fn, const = K.jsd_fwd_kernel, {"BLOCK": block, "FAST": 0}
        else:
            asm, poly = FORMS[form]
            fn, const = jsd_fwd_exp2_kernel, {"BLOCK": block, "ASM": asm, "POLY": poly}
            sig = dict(sig, ASM="constexpr", POLY="constexpr")
        src = ASTSource(fn=fn, signature=sig, constexprs=const)
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        from triton.tools.disasm import get_sass
        lines = [ln for ln in get_sass(ck.asm["cubin"]).splitlines() if ";" in ln]
        mufu = [ln for ln in lines if "MUFU" in ln]
        kinds = ", ".join(sorted({ln.split("MUFU.")[1].split()[0] for ln in mufu}))
        print(f"{form:10s} sm_90 SASS: {len(lines)} instructions, {len(mufu)} MUFU ({kinds})",
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--sass", action="store_true",
                    help="only compile each form for sm_90 and count its instructions")
    T.add_device_args(ap)
    args = ap.parse_args()
    dtype, esz = DTYPES[args.dtype], DTYPES[args.dtype].itemsize
    lib_block, lib_chunk, lib_warps, _ = K._FWD[esz]
    if args.sass:
        sass_counts([f for f in FORMS if f != "library" and "noasm" not in f], args.dtype,
                    lib_block, lib_warps)
        return
    cpu = args.device != "cuda"
    T.setup(args.device)
    forms = (["exp2", "poly-noasm", "poly2-noasm"] if cpu
             else ["exp2", "exp2-asm", "poly", "poly2"])
    if cpu:  # small blocks so the interpreter's checks cross chunk and block edges
        lib_block, lib_chunk, lib_warps = 64, 256, 4
    check_forms(forms, dtype, args.device, lib_block, lib_chunk, lib_warps)
    if cpu:
        return
    m, v = args.rows, args.vocab
    mode = 1 if args.beta == 0 else 2 if args.beta == 1 else 0
    x = log_probs(m, v, dtype, "cuda", 1)
    y = log_probs(m, v, dtype, "cuda", 2)
    grad = torch.empty_like(x)
    labels = torch.zeros(1, device="cuda", dtype=torch.long)  # unread: no labels
    count = torch.zeros(1, device="cuda", dtype=torch.int32)
    fwd_bytes = 2 * m * v * esz
    train_bytes = 3 * m * v * esz
    print(f"jsd {m} x {v} {args.dtype} beta {args.beta}; floors at the copy bandwidth: "
          f"loss + gradient {train_bytes / T.COPY_BW / 1e3:.0f} us, loss alone "
          f"{fwd_bytes / T.COPY_BW / 1e3:.0f} us", flush=True)
    T.timed("torch copy of x", lambda: grad.copy_(x), 2 * m * v * esz)

    def run(form, block, chunk, warps, write_grad):
        n_chunks = triton.cdiv(v, chunk)
        partial = torch.empty(m * n_chunks, device="cuda")
        fn = launcher(form, x, y, grad, labels, count, partial, args.beta, mode, 0,
                      write_grad, block, chunk, warps)
        what = "loss+grad" if write_grad else "loss     "
        return T.timed(f"{what} {form:9s} BLOCK={block:5d} CHUNK={chunk:6d} warps={warps:2d}",
                       fn, train_bytes if write_grad else fwd_bytes)

    print("-- the library's configuration, each form", flush=True)
    times = {}
    for form in ["library"] + forms:
        for write_grad in (1, 0):
            ms = run(form, lib_block, lib_chunk, lib_warps, write_grad)
            if write_grad and ms is not None:
                times[form] = ms
    best = min((f for f in times if f != "library"), key=times.get, default="exp2")
    print(f"-- launch configurations (loss + gradient): library and the fastest form, {best}",
          flush=True)
    blocks = (2048, 4096) if args.quick else (1024, 2048, 4096, 8192)
    for form in ("library", best):
        # CHUNK is a runtime argument (no compile): three for the library, one for the form
        chunks = (16384, 32768, 65536) if form == "library" and not args.quick else (32768,)
        for block in blocks:
            for warps in (4, 8, 16):
                per_thread = block // (32 * warps)
                if per_thread < 4 or per_thread > 32:
                    continue
                for chunk in chunks:
                    if chunk % block == 0 and (block, chunk, warps) != (
                            lib_block, lib_chunk, lib_warps):
                        run(form, block, chunk, warps, 1)


if __name__ == "__main__":
    main()
