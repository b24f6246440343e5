"""Benchmark fk.swiglu_linear (the fused SwiGLU GEMM) and the whole Llama MLP around it
against cuBLAS, torch, torch.compile and Liger.

    python benchmarks/benchmark_swiglu_linear.py --model llama_3_8b --sweep-mode token_length
    python benchmarks/benchmark_swiglu_linear.py --device cpu --tokens 64 --quick   # smoke test

Three tables per run (x: (tokens, hidden), Wg, Wu: (inter, hidden), Wd: (hidden, inter)):

gate   forward of silu(x Wg^T) * (x Wu^T). "cublas+<swiglu>": one cuBLAS GEMM on the stacked
       weights [Wg; Wu] plus a SiLU-mul kernel on contiguous (tokens, inter) halves, timed
       apart and summed (the best such pair is the baseline); "cublas x2 + fk.swiglu": the
       unfused path as run (two GEMMs, then fk.swiglu); "fk": fk.swiglu_linear with x
       requiring grad (writes z and the two backward factors); "fk (no grad)": z only.
mlp    the whole MLP, down(silu(gate(x)) * up(x)), forward + backward with every weight
       trainable: torch eager, torch.compile, Liger's LigerSwiGLUMLP, fk.nn.SwiGLUMLP
       (cuBLAS + fk.swiglu), fk.nn.FusedSwiGLUMLP (fk.swiglu_linear, factors saved) and the
       same with recompute=True; time and peak memory above the inputs.
gemm   TFLOP/s of fk's fused forward GEMM in its three store modes (training: z, s, t; no
       grad: z; the backward's recompute: s, t) against cuBLAS doing the same products with
       stacked weights (torch.matmul); 4 * tokens * inter * hidden flops. Then the backward
       of the gated projection: fk's gate-gradient kernel alone (bandwidth), the op's whole
       backward (that kernel + cuBLAS for dx, dWg, dWu), and torch forming da, db with two
       multiplications followed by cuBLAS on stacked operands.
Rows go to benchmarks/results/swiglu_linear_<gpu>.csv (the harness's columns plus flops and
tflops); timing and peak memory use the shared harness.

Floors at Llama-3-8B, 8192 tokens, bf16 (T = 8192, H = 4096, N = 14336; MiB = 2^20 B):
- Each fused kernel does 4 T N H = 1.924 TFLOP: 2.75 ms at cuBLAS's ~700 TFLOP/s. Its
  minimum DRAM traffic is 960 MiB (fwd: x 64 + Wg, Wu 224 + z, s, t 672; dx: dz, s, t 672 +
  W 224 + dx 64; dW: dz, s, t 672 + x 64 + dW 224), 0.24 ms at 4.2 TB/s: compute-bound
  (about 2000 FLOP per byte against a ridge near 200). Triton reached 59 % (dx) and 74 %
  (dW) of cuBLAS on the backward products, so the backward is one elementwise kernel
  (da = dz t, db = dz s: 5 x 224 MiB, 0.28 ms) + cuBLAS (dx 2.75 ms, dW 2.81 ms).
- Unfused forward: cuBLAS on (T x 2N x H) 2.75 ms + SiLU-mul (read 448, write 224 MiB)
  0.17 ms = 2.92 ms; 0.95 of that asks the fused forward for ~695 TFLOP/s, cuBLAS's rate.
- MLP forward + backward, eager: nine GEMMs (1.37 ms each at 700 TFLOP/s) + about 2.9 GB of
  elementwise traffic (0.7 ms) = ~13.1 ms. fk: three cuBLAS GEMMs for down_proj (4.1 ms) +
  the fused forward (3.2 ms at 606 TFLOP/s) + gate grads (0.28 ms) + cuBLAS dx, dW
  (5.6 ms) = ~13.2 ms: at eager's time, not below it unless the fused forward gains on
  the SiLU-mul and stores it saves (eager: a, b written, read twice, silu(a) written).
- Peak memory above the inputs, eager: a, b, silu(a), d_prod, d_silu, d_b (6 x 224) + dWd
  112 + output 64 = ~1520 MiB in the SiLU-mul backward. fk: s, t, dz (3 x 224; da, db are
  written over t, s) + dWd, dWg, dWu (3 x 112) + dx, output (2 x 64) = ~1136 MiB (0.75).
  recompute=True has the same peak inside one MLP's backward; what it saves is the
  448 MiB of s, t per layer held between forward and backward, for a second forward GEMM
  (~3 ms) in the backward.
"""
import statistics

import torch
import torch.nn.functional as F
from torch.func import functional_call

import _harness as H

# The harness's CSV columns plus the GEMM rate of each row.
CSV_COLUMNS = H.CSV_COLUMNS + ["flops", "tflops"]


def torch_mlp(x, wg, wu, wd):
    """Hugging Face LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def module_provider(make):
    """The MLP as a module, its weights swapped for the benchmark's inputs on every call."""
    mod = make()

    def run(x, wg, wu, wd):
        params = {"gate_proj.weight": wg, "up_proj.weight": wu, "down_proj.weight": wd}
        return functional_call(mod, params, (x,))
    return run


def liger_mlp(ctx):
    from types import SimpleNamespace

    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    cfg = SimpleNamespace(hidden_size=ctx.model.hidden_size,
                          intermediate_size=ctx.model.intermediate_size, hidden_act="silu")
    return module_provider(lambda: LigerSwiGLUMLP(cfg).to(ctx.device, ctx.dtype))


def fk_mlp(ctx, unfused=False, recompute=False):
    import fk
    h, n = ctx.model.hidden_size, ctx.model.intermediate_size
    if unfused:
        return module_provider(lambda: fk.nn.SwiGLUMLP(h, n, device=ctx.device, dtype=ctx.dtype))
    return module_provider(lambda: fk.nn.FusedSwiGLUMLP(h, n, device=ctx.device, dtype=ctx.dtype,
                                                        recompute=recompute))


def liger_swiglu():
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    return LigerSiLUMulFunction.apply


class Bench:
    """Times callables with the harness and collects the CSV rows."""

    def __init__(self, ctx):
        self.ctx, self.rows, self.notes = ctx, [], []
        self.info = H._versions(ctx.device)

    def time(self, section, tokens, entries):
        """entries: (name, fn, grads, flops, nbytes) tuples. Each fn is called once (compiles /
        autotunes, shows failures) and its peak memory measured; then all are timed together
        in the harness's rotating rounds (--rounds), each row taking its median."""
        live, meta = {}, {}
        for name, fn, grads, flops, nbytes in entries:
            try:
                fn()
                for t in grads:
                    t.grad = None
                meta[name] = (H.peak_mb(fn, self.ctx.device, grads), flops, nbytes)
            except Exception as e:  # noqa: BLE001 - a provider that fails is reported, skipped
                msg = (str(e).strip().splitlines() or [""])[0][:160]
                self.notes.append(f"{name}: failed in {section} at {tokens} tokens: "
                                  f"{type(e).__name__}: {msg}")
                continue
            live[name] = (fn, grads)
        times = H.time_rounds(live, self.ctx.device, self.ctx.args)
        self.notes.extend(f"{section} {tokens} tokens, {line}" for line in H.rounds_note(times))
        for name in live:
            mb, flops, nbytes = meta[name]
            self.add(section, tokens, name, statistics.median(times[name]), mb, flops, nbytes)

    def add(self, section, tokens, name, ms, mb=float("nan"), flops=0.0, nbytes=0):
        copy_bw = self.ctx.args.copy_bw or H.H200_COPY_BW
        self.rows.append(dict(self.info, op="swiglu_linear", model=self.ctx.model.name,
                              dtype=self.ctx.args.dtype, mode=section, tokens=tokens,
                              provider=name, timer="events", ms=ms, peak_mb=mb, bytes=nbytes,
                              copy_bw=copy_bw,
                              fraction_of_copy_bw=nbytes / (ms * 1e-3) / copy_bw,
                              flops=flops, tflops=flops / (ms * 1e-3) / 1e12 if flops else 0.0))
        return ms

    def ms(self, section, tokens, name):
        for r in self.rows:
            if (r["mode"], r["tokens"], r["provider"]) == (section, tokens, name):
                return r["ms"]
        return None


def operands(ctx, tokens):
    """x, Wg, Wu, the stacked [Wg; Wu] and the flops of one fused GEMM (4 * T * N * H)."""
    h, n = ctx.model.hidden_size, ctx.model.intermediate_size
    kw = dict(device=ctx.device, dtype=ctx.dtype)
    x = torch.randn(tokens, h, **kw)
    wg, wu = torch.randn(n, h, **kw) * h ** -0.5, torch.randn(n, h, **kw) * h ** -0.5
    return x, wg, wu, torch.cat([wg, wu]), 4.0 * tokens * n * h


def gate_section(b, tokens, providers):
    ctx = b.ctx
    h, n = ctx.model.hidden_size, ctx.model.intermediate_size
    kw = dict(device=ctx.device, dtype=ctx.dtype)
    x, wg, wu, wcat, flops = operands(ctx, tokens)
    e = ctx.elem
    gemm_bytes = (tokens * h + 2 * n * h + 2 * tokens * n) * e
    a, g = torch.randn(tokens, n, **kw), torch.randn(tokens, n, **kw)
    swiglus = {"torch": lambda p, q: F.silu(p) * q}
    if ctx.args.compile:
        swiglus["torch.compile"] = torch.compile(lambda p, q: F.silu(p) * q)
    if "liger" in providers:
        swiglus["liger"] = providers["liger"]
    import fk
    swiglus["fk"] = fk.swiglu
    xg = x.clone().requires_grad_()
    entries = [("cublas (stacked)", lambda: torch.matmul(x, wcat.T), (), flops, gemm_bytes)]
    entries += [(f"swiglu {name}", lambda fn=fn: fn(a, g), (), 0.0, 3 * tokens * n * e)
                for name, fn in swiglus.items()]
    entries += [("cublas x2 + fk.swiglu", lambda: fk.swiglu(F.linear(x, wg), F.linear(x, wu)),
                 (), flops, 0),
                ("fk", lambda: fk.swiglu_linear(xg, wg, wu), (), flops,
                 (tokens * h + 2 * n * h + 3 * tokens * n) * e),
                ("fk (no grad)", lambda: fk.swiglu_linear(x, wg, wu), (), flops,
                 (tokens * h + 2 * n * h + tokens * n) * e)]
    b.time("gate", tokens, entries)
    gemm = b.ms("gate", tokens, "cublas (stacked)")
    best = [m for m in (b.ms("gate", tokens, f"swiglu {s}") for s in swiglus) if m]
    if gemm and best:
        b.add("gate", tokens, "cublas+best swiglu", gemm + min(best), flops=flops)


def mlp_section(b, tokens, providers):
    ctx = b.ctx
    h, n = ctx.model.hidden_size, ctx.model.intermediate_size
    torch.manual_seed(tokens)
    kw = dict(device=ctx.device, dtype=ctx.dtype)
    inputs = [torch.randn(tokens, h, **kw), torch.randn(n, h, **kw) * h ** -0.5,
              torch.randn(n, h, **kw) * h ** -0.5, torch.randn(h, n, **kw) * n ** -0.5]
    for t in inputs:
        t.requires_grad_()
    grad_out = torch.randn(tokens, h, **kw)
    flops = 3 * 2.0 * tokens * n * h * 3  # three GEMMs forward, six backward
    b.time("mlp", tokens, [(name, lambda fn=fn: fn(*inputs).backward(grad_out), inputs, flops, 0)
                           for name, fn in providers.items()])


def gemm_section(b, tokens):
    import fk  # noqa: F401  (registers torch.ops.fk)
    ctx = b.ctx
    n = ctx.model.intermediate_size
    x, wg, wu, wcat, flops = operands(ctx, tokens)
    dz = torch.randn(tokens, n, device=ctx.device, dtype=ctx.dtype)
    _, s, t = torch.ops.fk._swiglu_linear_forward(x, wg, wu, [False, True])
    e = ctx.elem
    fwd = torch.ops.fk._swiglu_linear_forward
    b.time("gemm", tokens, [
        ("fwd cublas (stacked)", lambda: torch.matmul(x, wcat.T), (), flops, 0),
        ("fwd fk (z, s, t)", lambda: fwd(x, wg, wu, [True, True]), (), flops, 0),
        ("fwd fk (z)", lambda: fwd(x, wg, wu, [True, False]), (), flops, 0),
        ("fwd fk (s, t: recompute)", lambda: fwd(x, wg, wu, [False, True]), (), flops, 0),
        # The backward of the gated projection: the gate-gradient kernel alone (bytes: read
        # dz, t, s, write da, db), then as the op runs it (that kernel + cuBLAS for dx and
        # both dW), against torch forming da, db with two multiplications and cuBLAS on
        # stacked operands.
        ("bwd fk gate grads", lambda: torch.ops.fk._swiglu_linear_gate_grads(dz, t, s), (), 0.0,
         5 * dz.numel() * e),
        ("bwd fk", lambda: fk_backward(dz, x, wg, wu, t, s), (), 2 * flops, 0),
        ("bwd torch da,db + cublas (stacked)", lambda: cublas_backward(dz, x, wcat, s, t), (),
         2 * flops, 0)])


def fk_backward(dz, x, wg, wu, t, s):
    """What the op's backward runs (new tensors for da, db, as with retain_graph)."""
    da, db = torch.ops.fk._swiglu_linear_gate_grads(dz, t, s)
    return torch.addmm(torch.mm(da, wg), db, wu), torch.mm(da.T, x), torch.mm(db.T, x)


def cublas_backward(dz, x, wcat, s, t):
    dab = torch.cat([dz * t, dz * s], dim=1)
    return torch.matmul(dab, wcat), torch.matmul(dab.T, x)


def print_section(b, section, title):
    rows = [r for r in b.rows if r["mode"] == section]
    if not rows:
        return
    print(f"\n[{section}] {title}")
    names = list(dict.fromkeys(r["provider"] for r in rows))
    width = max(len(p) for p in names)
    for tokens in dict.fromkeys(r["tokens"] for r in rows):
        print(f"  tokens {tokens}")
        for p in names:
            r = next((r for r in rows if r["tokens"] == tokens and r["provider"] == p), None)
            if r is None:
                continue
            tf = f"{r['tflops']:7.1f} TFLOP/s" if r["tflops"] else " " * 15
            mb = f"{r['peak_mb']:9.1f} MB" if r["peak_mb"] == r["peak_mb"] else " " * 12
            print(f"    {p:<{width}}  {r['ms']:9.4f} ms  {tf}  {mb}")


def print_criteria(b):
    """fk against the targets the op is built for (gate <= 0.95 x cuBLAS + best swiglu, MLP
    <= 0.98 x eager time and <= 0.8 x its peak memory, fused GEMMs >= 85 % of cuBLAS)."""
    lines = []
    for tokens in dict.fromkeys(r["tokens"] for r in b.rows):
        def ms(section, name):
            return b.ms(section, tokens, name)

        def peak(name):
            r = next((r for r in b.rows if r["mode"] == "mlp" and r["tokens"] == tokens
                      and r["provider"] == name), None)
            return r["peak_mb"] if r else None

        def ratio(num, den, target, what, higher=False):
            if num and den:
                v = num / den
                ok = v >= target if higher else v <= target
                lines.append(f"  {tokens:6d} tokens  {what:<46} {v:6.3f}  "
                             f"({'<=' if not higher else '>='} {target}) "
                             f"{'ok' if ok else 'MISSED'}")
        ratio(ms("gate", "fk"), ms("gate", "cublas+best swiglu"), 0.95,
              "gate fwd: fk / (cuBLAS stacked + best swiglu)")
        for mode in ("fk", "fk (recompute)"):
            ratio(ms("mlp", mode), ms("mlp", "torch"), 0.98, f"mlp fwd+bwd time: {mode} / torch")
            pk, pt = peak(mode), peak("torch")
            if pk == pk and pt == pt:
                ratio(pk, pt, 0.8, f"mlp peak memory: {mode} / torch")
        for mode in ("z, s, t", "z"):
            ratio(ms("gemm", "fwd cublas (stacked)"), ms("gemm", f"fwd fk ({mode})"), 0.85,
                  f"fused GEMM rate writing {mode}: fk / cuBLAS", higher=True)
    if lines:
        print("\ntargets")
        print("\n".join(lines))


def main():
    args = H.make_parser(__doc__.splitlines()[0]).parse_args()
    ctx = H.setup(args)
    if ctx.model.mlp_act != "silu":
        print(f"note: {ctx.model.name} uses {ctx.model.mlp_act}, not SiLU; "
              "benchmarking the SwiGLU MLP at its shapes")
    b = Bench(ctx)
    mlp = {"torch": torch_mlp}
    if args.compile:
        mlp["torch.compile"] = torch.compile(torch_mlp)
    gate_extra = {}
    try:
        mlp["liger"] = liger_mlp(ctx)
        gate_extra["liger"] = liger_swiglu()
    except ImportError as e:
        b.notes.append(f"liger: not installed ({e}); skipped")
    mlp["fk.nn.SwiGLUMLP (unfused)"] = fk_mlp(ctx, unfused=True)
    mlp["fk"] = fk_mlp(ctx)
    mlp["fk (recompute)"] = fk_mlp(ctx, recompute=True)
    for tokens in ctx.tokens:
        torch.manual_seed(tokens)
        gate_section(b, tokens, gate_extra)
        mlp_section(b, tokens, mlp)
        gemm_section(b, tokens)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    m = ctx.model
    print(f"swiglu_linear | {m.name} hidden {m.hidden_size} inter {m.intermediate_size} | "
          f"{args.dtype} | {b.info['gpu']} | torch {b.info['torch']} triton "
          f"{b.info['triton'] or '-'} fk {b.info['fk']} liger {b.info['liger'] or '-'}")
    print_section(b, "gate", "forward of the gated projection")
    print_section(b, "mlp", "whole MLP, forward + backward, every weight trainable")
    print_section(b, "gemm", "the fused GEMM kernels against cuBLAS on the same products")
    print_criteria(b)
    for note in b.notes:
        print(f"note: {note}")
    if args.out and b.rows:
        H.CSV_COLUMNS = CSV_COLUMNS  # write_csv writes the columns named there
        path = H.write_csv(b.rows, H.Path(args.out), "swiglu_linear", b.info["gpu"])
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
