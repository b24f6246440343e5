"""Shared benchmark harness: CLI, timing, peak memory, tables and CSV for the op benchmarks.

An op benchmark supplies ``make_inputs(tokens)`` (fresh random tensors; those that need
gradients have ``requires_grad``), providers (name -> factory returning the op callable;
a factory raising ImportError marks the provider as not installed) and
``bytes_moved(tokens, mode)``, the minimum DRAM traffic of the op, for the ceiling column.
"""
from __future__ import annotations

import argparse
import csv
import importlib.metadata
import re
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from models import MODELS, ModelConfig, get_model  # noqa: F401  (re-exported)

try:
    import triton
    from triton.testing import do_bench as _triton_do_bench
except ImportError:
    triton = None

H200_COPY_BW = 4.2e12  # B/s, device-to-device copy on an H200 (bytes read + written)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MODES = ("forward", "full")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUICK_DIV = 16  # --quick divides every model width by this


def batch_and_seq(tokens: int, seq: int):
    """(batch, seq) for `tokens` tokens in sequences of min(tokens, seq); exits with a message
    when they do not divide."""
    seq = min(tokens, seq)
    if tokens % seq:
        raise SystemExit(f"--tokens {tokens} is not a multiple of the sequence length {seq}")
    return tokens // seq, seq


class Outputs:
    """Several outputs as the harness's single one: ``torch.randn_like(outs)`` gives one
    gradient per output (each like its output) and ``outs.backward(grads)`` runs one backward
    through all of them."""

    def __init__(self, *tensors):
        self.tensors = tensors

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        outs, rest = args[0], args[1:]
        return Outputs(*(func(t, *rest, **(kwargs or {})) for t in outs.tensors))

    def backward(self, grads):
        torch.autograd.backward(self.tensors, grads.tensors)


def outputs_of(fn):
    """fn returning a tuple of tensors, as a callable returning one :class:`Outputs`."""
    return lambda *args: Outputs(*fn(*args))


def make_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="llama_3_8b", choices=sorted(MODELS))
    p.add_argument("--sweep-mode", default="token_length", choices=["token_length"])
    p.add_argument("--tokens", default="1024,2048,4096,8192", help="comma-separated token counts")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="forward,full",
                   help="comma-separated modes: forward, full (forward + backward), or both "
                        "as forward,full (the default)")
    p.add_argument("--copy-bw", type=float, default=None,
                   help=f"copy bandwidth ceiling in B/s (default {H200_COPY_BW:.2e}, H200)")
    p.add_argument("--measure-ceiling", action="store_true",
                   help="measure a large device-to-device copy and use it as the ceiling")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="include torch.compile (default: yes, except with --quick on CPU)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke test: model widths / {QUICK_DIV}, short timing")
    p.add_argument("--warmup", type=float, default=25.0, help="warm-up time per measurement, ms")
    p.add_argument("--rep", type=float, default=100.0, help="timed repetitions per measurement, ms")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every provider this many times, in rotating order (round r "
                        "starts at the r-th provider), and report the median: no provider is "
                        "always timed first, on a cooler chip than the others")
    p.add_argument("--timer", default="events", choices=["events", "kernels"],
                   help="events: time per call with CUDA events (what a caller waits for, "
                        "launch and CPU overhead included); kernels: the GPU time of the "
                        "kernels a call runs (torch.profiler), without launch gaps")
    p.add_argument("--out", default=str(RESULTS_DIR), help="CSV folder ('' writes no CSV)")
    return p


def parse_modes(text: str) -> list:
    """The modes of a --modes value ("forward,full"); an unknown or empty one is an error, not
    a mode silently skipped."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes {text!r}: give a comma-separated list of {', '.join(MODES)}")
    return modes


def setup(args) -> SimpleNamespace:
    """Resolve the CLI into the context the op benchmarks build their inputs from."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is visible; use --device cpu for a smoke run")
    model = get_model(args.model)
    if args.quick:
        model = model.scaled(QUICK_DIV)
        args.warmup, args.rep = min(args.warmup, 5.0), min(args.rep, 20.0)
    if args.quick and device.type == "cpu":
        torch.set_num_threads(1)  # tiny shapes: thread start-up would dominate, and vary
    if args.compile is None:
        args.compile = not (args.quick and device.type == "cpu")
    modes = parse_modes(args.modes)
    dtype = DTYPES[args.dtype]
    return SimpleNamespace(
        args=args, model=model, device=device, dtype=dtype,
        elem=torch.empty((), dtype=dtype).element_size(),
        tokens=[int(t) for t in args.tokens.split(",") if t.strip()],
        modes=modes)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_ms(fn, device, warmup=25.0, rep=100.0, grads=()):
    """Median time of ``fn()`` in ms: triton's do_bench (CUDA events) on a GPU, else a timer."""
    if device.type == "cuda" and triton is not None:
        return _triton_do_bench(fn, warmup=warmup, rep=rep, grad_to_none=list(grads) or None,
                                return_mode="median")

    def once():
        for t in grads:
            t.grad = None
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        return (time.perf_counter() - t0) * 1e3

    est = max(statistics.median(once() for _ in range(3)), 1e-3)
    for _ in range(min(1000, int(warmup / est))):
        once()
    return statistics.median(once() for _ in range(max(5, min(1000, int(rep / est)))))


def kernel_ms(fn, device, iters=10, grads=(), names=None):
    """GPU time of ``fn()`` in ms: the summed duration of the kernels (and copies) it runs,
    from torch.profiler, median over ``iters`` calls with the L2 cache flushed before each.
    Gaps between kernels (Python, dispatcher, autograd and launch overhead) are not in it.
    With ``names``, only the kernels whose name holds one of those strings count (so that
    fn may also restore its inputs, untimed)."""
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    times = []
    for _ in range(iters + 2):
        for t in grads:
            t.grad = None
        flush.zero_()
        _sync(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            _sync(device)
        times.append(sum(e.device_time_total for e in prof.key_averages()
                         if names is None or any(n in e.key for n in names)) / 1e3)
    return statistics.median(times[2:])


def rotations(items, rounds):
    """Every one of items, `rounds` times over, round r in the order rotated by r. Under a
    power cap the chip runs slower as it warms, so a fixed order of measurement favours
    whatever comes first."""
    items = list(items)
    for r in range(rounds if items else 0):
        k = r % len(items)
        yield from items[k:] + items[:k]


def time_rounds(fns, device, args, kernels=False):
    """{name: [ms of each round]} for fns = {name: (fn, grads)}: ``args.rounds`` rounds, each
    timing every callable once (``kernel_ms`` if ``kernels``, else ``bench_ms``), in
    rotating order (``rotations``)."""
    times = {n: [] for n in fns}
    for n in rotations(fns, max(1, args.rounds)):
        fn, grads = fns[n]
        times[n].append(kernel_ms(fn, device, grads=grads) if kernels
                        else bench_ms(fn, device, args.warmup, args.rep, grads))
    return times


def rounds_note(times):
    """One line per callable timed in more than one round: its rounds' spread."""
    return [f"{n}: {len(v)} rounds, median {statistics.median(v):.4f} ms, "
            f"{min(v):.4f}-{max(v):.4f}" for n, v in times.items() if len(v) > 1]


def peak_mb(fn, device, grads=()):
    """Peak memory allocated while running ``fn()`` once, above what was allocated before (MiB)."""
    if device.type != "cuda":
        return float("nan")
    for t in grads:
        t.grad = None
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    for t in grads:
        t.grad = None
    return (peak - base) / 2**20


def measure_copy_bw(device, warmup=25.0, rep=200.0):
    """Device-to-device copy bandwidth in B/s, counting bytes read plus bytes written."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), device, warmup, rep)
    return 2 * n / (ms * 1e-3)


def _step(fn, inputs, mode, grad_out):
    if mode == "forward":
        return lambda: fn(*inputs)
    return lambda: fn(*inputs).backward(grad_out)


def _versions(device):
    def dist(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return ""
    import fk
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"gpu": gpu, "torch": torch.__version__,
            "triton": triton.__version__ if triton is not None else "",
            "fk": fk.__version__, "liger": dist("liger-kernel") or dist("liger_kernel")}


def run(ctx, op, make_inputs, providers, bytes_moved, shape=""):
    """Benchmark every provider at every token count and mode; print tables, write the CSV."""
    args, device = ctx.args, ctx.device
    notes, fns = [], {}
    if not args.compile and "torch.compile" in providers:
        notes.append("torch.compile: skipped (off by default with --quick on CPU; pass --compile)")
    for name, factory in providers.items():
        if name == "torch.compile" and not args.compile:
            continue
        try:
            fns[name] = factory()
        except ImportError as e:
            notes.append(f"{name}: not installed ({e}); column skipped")
    copy_bw, bw_src = args.copy_bw or H200_COPY_BW, "given" if args.copy_bw else "default, H200"
    if args.measure_ceiling:
        copy_bw, bw_src = measure_copy_bw(device), "measured"
    ctx.copy_bw = copy_bw  # for bytes_moved of compute-bound ops (flops scaled to this ceiling)
    info = _versions(device)

    rows, broken = [], set()
    kernels = args.timer == "kernels" and device.type == "cuda"
    for mode in ctx.modes:
        for tokens in ctx.tokens:
            nbytes = bytes_moved(tokens, mode)
            # Every provider's inputs and first call (which compiles and shows failures) and
            # peak memory first, then the timing rounds over all of them.
            live, peaks = {}, {}
            for name, fn in fns.items():
                if name in broken:
                    continue
                torch.manual_seed(tokens)  # the same values for every provider
                inputs = make_inputs(tokens)
                grads = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
                grad_out = None
                if mode == "full":
                    with torch.no_grad():
                        grad_out = torch.randn_like(fns.get("torch", fn)(*inputs))
                step = _step(fn, inputs, mode, grad_out)
                try:
                    step()
                    for t in grads:
                        t.grad = None
                    peaks[name] = peak_mb(step, device, grads)
                except Exception as e:  # noqa: BLE001
                    broken.add(name)
                    msg = (str(e).strip().splitlines() or [""])[0][:160]
                    notes.append(f"{name}: failed in {mode} at {tokens} tokens, skipped: "
                                 f"{type(e).__name__}: {msg}")
                    continue
                live[name] = (step, grads)
            times = time_rounds(live, device, args, kernels)
            notes.extend(f"{mode} {tokens} tokens, {line}" for line in rounds_note(times))
            for name in live:
                ms = statistics.median(times[name])
                rows.append(dict(info, op=op, model=ctx.model.name, dtype=args.dtype, mode=mode,
                                 timer=args.timer if device.type == "cuda" else "wall",
                                 tokens=tokens, provider=name, ms=ms, peak_mb=peaks[name],
                                 bytes=nbytes, copy_bw=copy_bw,
                                 fraction_of_copy_bw=nbytes / (ms * 1e-3) / copy_bw))
            del live

    timer = "GPU kernel time" if args.timer == "kernels" else "time per call (CUDA events)"
    print(f"{op} | {ctx.model.name} {shape} | {args.dtype} | {timer} | {info['gpu']} | torch "
          f"{info['torch']} triton {info['triton'] or '-'} fk {info['fk']} liger "
          f"{info['liger'] or '-'} | ceiling {copy_bw / 1e12:.2f} TB/s ({bw_src})")
    for mode in ctx.modes:
        print_table(mode, [r for r in rows if r["mode"] == mode])
    for n in notes:
        print(f"note: {n}")
    if args.out and rows:
        path = write_csv(rows, Path(args.out), op, info["gpu"])
        print(f"wrote {path}")
    return rows


def _fmt(v, spec):
    return "-" if v is None or v != v else format(v, spec)


def print_table(mode, rows):
    """One line per token count: time per provider, fk speedups, peak memory, ceiling fraction."""
    names = list(dict.fromkeys(r["provider"] for r in rows))
    get = {(r["tokens"], r["provider"]): r for r in rows}
    cols = [("tokens", lambda t: str(t))]

    def val(key, name):
        return lambda t: get[(t, name)][key] if (t, name) in get else None

    def ratio(num, den):
        return lambda t: (num(t) / den(t)) if num(t) and den(t) else None

    fk_ms, liger_ms, compile_ms = val("ms", "fk"), val("ms", "liger"), val("ms", "torch.compile")

    def best_ms(t):  # the faster of Liger and torch.compile
        ms = [m for m in (liger_ms(t), compile_ms(t)) if m]
        return min(ms) if ms else None

    short = {"torch.compile": "compile"}
    for n in names:
        cols.append((f"{short.get(n, n)} ms", lambda t, f=val("ms", n): _fmt(f(t), ".4f")))
    cols.append(("fk/liger x", lambda t: _fmt(ratio(liger_ms, fk_ms)(t), ".2f")))
    cols.append(("fk/best x", lambda t: _fmt(ratio(best_ms, fk_ms)(t), ".2f")))
    for n in names:
        cols.append((f"{short.get(n, n)} MB", lambda t, f=val("peak_mb", n): _fmt(f(t), ".1f")))
    cols.append(("fk/liger MB", lambda t: _fmt(ratio(val("peak_mb", "fk"),
                                                     val("peak_mb", "liger"))(t), ".2f")))
    for n in ("fk", "liger"):
        if n in names:
            cols.append((f"{n} %ceil", lambda t, f=val("fraction_of_copy_bw", n):
                         _fmt(f(t) * 100 if f(t) is not None else None, ".1f")))
    tokens = list(dict.fromkeys(r["tokens"] for r in rows))
    cells = [[c[1](t) for c in cols] for t in tokens]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, (h, _) in enumerate(cols)]
    print(f"\n[{mode}]" + (" (forward + backward)" if mode == "full" else ""))
    print("  ".join(h.rjust(w) for (h, _), w in zip(cols, widths)))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


CSV_COLUMNS = ["gpu", "torch", "triton", "fk", "liger", "op", "model", "dtype", "mode", "tokens",
               "provider", "timer", "ms", "peak_mb", "bytes", "copy_bw", "fraction_of_copy_bw"]
_KEY = ("op", "model", "dtype", "mode", "tokens", "provider", "timer")


def write_csv(rows, out_dir: Path, op, gpu):
    """Write <op>_<gpu-slug>.csv; a rerun replaces the rows with the same key, keeps others."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{op}_{re.sub(r'[^a-z0-9]+', '-', gpu.lower()).strip('-')}.csv"
    new = [{k: r[k] for k in CSV_COLUMNS} for r in rows]
    keys = {tuple(str(r[k]) for k in _KEY) for r in new}
    old = []
    if path.exists():
        with open(path, newline="") as f:
            old = [dict(r, timer=r.get("timer") or "events") for r in csv.DictReader(f)]
            old = [r for r in old if tuple(r.get(k, "") for k in _KEY) not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(old + new)
    return path
