"""Full training steps of a ~1B Llama-3-style Hugging Face model: eager vs fk vs Liger.

The model has Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 kv heads,
intermediate 8192, vocab 128256, tied embeddings, llama3 rope scaling), random weights in
bf16, sdpa attention, and trains on random tokens with AdamW (fused). One step is the forward
with labels, the backward, the optimizer step and zero_grad. Providers:

- ``eager``: the unpatched ``transformers.LlamaForCausalLM``;
- ``fk``: the same model after ``fk.transformers.apply_fk(model)`` (RMSNorm, RoPE, SwiGLU
  and the fused linear cross entropy loss: no logits in training);
- ``liger``: the same model after Liger Kernel's instance patcher (optional: an import error
  or a failure is recorded and the others still run).

Each provider runs in a fresh Python process so that its peak memory is its own; every
process builds the same weights (same seed) and trains on the same batches, so the first
losses agree across providers (all start near ln(vocab) = 11.76).

    python benchmarks/benchmark_hf_training.py [--batch 8] [--seq 2048] [--providers eager,fk,liger]
    python benchmarks/benchmark_hf_training.py --device cpu --tiny     # smoke test, seconds
    python benchmarks/benchmark_hf_training.py --model qwen3_1_7b --amp  # AMP (see below)

``--model qwen3_1_7b`` trains a Qwen3-1.7B-shaped model instead (hidden 2048, 28 layers, 16
heads, 8 kv heads, head_dim 128, intermediate 6144, vocab 151936, tied embeddings, q/k norms).
``--model glm4_1b`` and ``--model olmo3_1b`` train 1B-class models of those two structures
(hidden 2048, 16 layers; see glm4_config and olmo3_config), which fk patches through rows
added after the first twelve.
``--amp`` keeps the weights (and AdamW's state) in float32 and runs each forward under
``torch.autocast(dtype=torch.bfloat16)``, the backward after it: what
``transformers.Trainer(bf16=True)`` does. Its dtype column reads ``float32+amp_bf16``.

``--batch`` defaults to 8 (8 x 2048 = 16384 tokens a step), meant to fill a 141 GB H200
sensibly in the eager run, the most memory-hungry one. If eager runs out of memory the batch
is halved (and the note printed) until it fits; every provider then runs that batch.
Results go to ``benchmarks/results/hf_training_<gpu>.csv`` (a rerun replaces the rows with
the same model, provider, batch and seq); ``--tiny`` writes no CSV unless ``--out`` is given.
"""
import argparse
import csv
import importlib.metadata
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PROVIDERS = ("eager", "fk", "liger")
LOSS_STEPS = 5  # first losses recorded per provider (sanity: the same start everywhere)
# Targets for fk against eager HF and Liger.
TARGET_SPEEDUP = 1.25
TARGET_MEMORY_REDUCTION = 0.40
CSV_COLUMNS = ["gpu", "torch", "transformers", "fk", "liger", "model", "dtype", "provider",
               "batch", "seq", "warmup", "steps", "ms", "tokens_per_s", "peak_mb", "losses",
               "error"]
_KEY = ("model", "dtype", "provider", "batch", "seq")


MODELS = ("llama_3_2_1b", "qwen3_1_7b", "glm4_1b", "olmo3_1b")


def model_config(args):
    return {"qwen3_1_7b": qwen3_config, "glm4_1b": glm4_config,
            "olmo3_1b": olmo3_config}.get(args.model, llama_config)(args.tiny)


def model_name(args):
    if args.tiny:
        return "tiny_llama" if args.model == "llama_3_2_1b" else "tiny_" + args.model
    return args.model


def qwen3_config(tiny):
    from transformers import Qwen3Config
    if tiny:
        shape = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1024)
    else:  # Qwen3-1.7B
        shape = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936)
    return Qwen3Config(**shape, max_position_embeddings=40960, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                  "rope_theta": 1000000.0},
                       attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")


def glm4_config(tiny):
    """GLM-4's structure (partial interleaved rope, fused gate_up MLP, sandwich norms) at a
    1B-class shape of our choosing (GLM-4 ships 9B and larger only)."""
    from transformers import Glm4Config
    if tiny:
        shape = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1024)
    else:
        shape = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=16,
                     num_attention_heads=16, num_key_value_heads=2, head_dim=128,
                     vocab_size=151552)
    return Glm4Config(**shape, rms_norm_eps=1e-5, pad_token_id=None, eos_token_id=None, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.5},
                      attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")


def olmo3_config(tiny):
    """OLMo-3's structure (post-norms, q/k norms over all heads, sliding-window layers) at
    OLMo-2-1B's shape with OLMo-3's vocabulary."""
    from transformers import Olmo3Config
    if tiny:
        shape = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, vocab_size=1024)
    else:
        shape = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=16, num_key_value_heads=16, vocab_size=100278)
    return Olmo3Config(**shape, rms_norm_eps=1e-6, pad_token_id=None, eos_token_id=None, tie_word_embeddings=False,
                       max_position_embeddings=65536, sliding_window=4096,
                       attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")


def llama_config(tiny):
    from transformers import LlamaConfig
    if tiny:  # a few hundred thousand parameters, same structure (GQA, tied embeddings)
        shape = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
    else:  # Llama-3.2-1B
        shape = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    return LlamaConfig(
        **shape, head_dim=shape["hidden_size"] // shape["num_attention_heads"],
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        attention_dropout=0.0, use_cache=False, attn_implementation="sdpa")


def _dist_version(*names):
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            pass
    return ""


# --- one provider, in its own process -----------------------------------------------------

def patch(model, provider):
    if provider == "fk":
        import fk.transformers
        fk.transformers.apply_fk(model)
    elif provider == "liger":
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        _apply_liger_kernel_to_instance(model=model)
    elif provider != "eager":
        raise ValueError(f"unknown provider {provider!r}")


def run_provider(args):
    """Build, patch, train; return the measurements as a dict."""
    import torch
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" and not args.amp else torch.float32
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # tiny shapes; a busy small machine's thread pool stalls
    config = model_config(args)
    torch.manual_seed(args.seed)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.train()
    patch(model, args.provider)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=cuda,
                            foreach=None if cuda else True)
    g = torch.Generator().manual_seed(args.seed + 1)
    steps = args.warmup + args.steps
    # The same batches for every provider; labels are the inputs (HF shifts them inside).
    batches = [torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=g)
               for _ in range(min(steps, 4))]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for i in range(steps):
        ids = batches[i % len(batches)].to(device, non_blocking=True)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if i < LOSS_STEPS:
            losses.append(out.loss.item())
        del out
    ms = statistics.median(times[args.warmup:]) * 1e3
    if args.profile and cuda:  # where one more step's GPU time goes, kernel by kernel
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        print(f"--- {args.provider}: GPU kernels of one step", file=sys.stderr)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25,
                                        max_name_column_width=70), file=sys.stderr)
    dtype_name = str(dtype).replace("torch.", "") + ("+amp_bf16" if args.amp else "")
    return dict(params=params, dtype=dtype_name, ms=ms,
                tokens_per_s=args.batch * args.seq / (ms * 1e-3),
                peak_mb=torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
                losses=losses)


def child_main(args):
    try:
        res = run_provider(args)
    except Exception as e:  # noqa: BLE001  (recorded, reported by the parent)
        traceback.print_exc()
        oom = type(e).__name__ == "OutOfMemoryError"
        first = (str(e).strip().splitlines() or [""])[0][:300]
        res = dict(error=f"{type(e).__name__}: {first}", oom=oom)
    print("RESULT " + json.dumps(res), flush=True)


def spawn(args, provider, batch):
    """Run one provider in a fresh process; its progress goes to stderr, its result back."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", provider,
           "--device", args.device, "--batch", str(batch), "--seq", str(args.seq),
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--lr", str(args.lr),
           "--seed", str(args.seed), "--model", args.model] + (["--tiny"] if args.tiny else []) \
        + (["--amp"] if args.amp else []) \
        + (["--profile"] if args.profile else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return dict(error=f"process exited with {p.returncode} and no result "
                          f"(output: {p.stdout.strip()[-300:]!r})", oom=False, wall_s=wall)
    return dict(json.loads(lines[-1][len("RESULT "):]), wall_s=wall)


# --- the parent: providers, table, targets, CSV -------------------------------------------

def versions(device):
    import torch
    import transformers
    try:
        import fk
        fk_version = fk.__version__
    except Exception:  # noqa: BLE001
        fk_version = ""
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return dict(gpu=gpu, torch=torch.__version__, transformers=transformers.__version__,
                fk=fk_version, liger=_dist_version("liger-kernel", "liger_kernel"))


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _cell(v, spec):
    return "" if v is None else format(v, spec)


def print_table(res, info, args, batch, title="HF training step"):
    eager = res.get("eager", {})
    shape = {"llama_3_2_1b": "Llama-3.2-1B", "qwen3_1_7b": "Qwen3-1.7B", "glm4_1b": "GLM-4 (1B-class)",
             "olmo3_1b": "OLMo-3 (1B-class)"}[args.model]
    print(f"\n{title} | {'tiny ' + shape if args.tiny else shape + ' shape'}"
          f"{' | float32 weights, bf16 autocast' if args.amp else ''} "
          f"({_fmt(next((r['params'] for r in res.values() if 'params' in r), None), ',')} "
          f"parameters) | batch {batch} x seq {args.seq} | {info['gpu']} | torch "
          f"{info['torch']} transformers {info['transformers']} fk {info['fk'] or '-'} liger "
          f"{info['liger'] or '-'}")
    head = ["provider", "ms/step", "tokens/s", "speedup", "peak MB", "mem vs eager",
            "first losses"]
    rows = []
    for name, r in res.items():
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "-", "failed (see below)"])
            continue
        sp = eager["ms"] / r["ms"] if "ms" in eager else None
        mem = (1 - r["peak_mb"] / eager["peak_mb"]
               if r.get("peak_mb") and eager.get("peak_mb") else None)
        rows.append([name, f"{r['ms']:.1f}", f"{r['tokens_per_s']:,.0f}", _fmt(sp, ".2f") +
                     ("x" if sp else ""), _fmt(r.get("peak_mb"), ",.0f"),
                     "-" if mem is None else f"{-mem * 100:+.1f} %",
                     " ".join(f"{x:.4f}" for x in r["losses"])])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    if "fk" in res and "liger" in res and "ms" in res["fk"] and "ms" in res["liger"]:
        fk, lg = res["fk"], res["liger"]
        line = f"fk vs liger: {lg['ms'] / fk['ms']:.2f}x speed"
        if fk.get("peak_mb") and lg.get("peak_mb"):
            line += f", peak memory {fk['peak_mb'] / lg['peak_mb']:.2f}x of Liger's"
        print(line)
    for name, r in res.items():
        if "error" in r:
            print(f"note: {name}: {r['error']}")


def check(res, args, vocab):
    """Sanity (exit status) and the targets (printed; exit status with --check-targets)."""
    ok, lines = True, []
    ln_v = math.log(vocab)
    for name, r in res.items():
        # Tied random embeddings (std 0.02) give logits of std about 0.02 * sqrt(hidden), 0.9
        # at hidden 2048, which puts the first loss about 0.4 above ln(vocab).
        if "losses" in r and abs(r["losses"][0] - ln_v) > 1.0:
            ok = False
            lines.append(f"FAIL sanity: {name}'s first loss {r['losses'][0]:.4f} is not near "
                         f"ln({vocab}) = {ln_v:.4f}")
    if "losses" in res.get("eager", {}) and "losses" in res.get("fk", {}):
        d = abs(res["fk"]["losses"][0] - res["eager"]["losses"][0])
        tol = 0.02 if args.device == "cuda" else 1e-3
        ok &= d <= tol
        lines.append(f"{'PASS' if d <= tol else 'FAIL'} sanity: fk's first loss is within {tol} "
                     f"of eager's ({d:.2e})")
    for name in ("eager", "fk"):
        if "error" in res.get(name, {}):
            ok = False
    targets = []
    e, f, lg = res.get("eager", {}), res.get("fk", {}), res.get("liger", {})
    if "ms" in e and "ms" in f:
        sp = e["ms"] / f["ms"]
        targets.append((sp >= TARGET_SPEEDUP, f"fk step {sp:.2f}x faster than eager "
                                              f"(target >= {TARGET_SPEEDUP}x)"))
        if e.get("peak_mb") and f.get("peak_mb"):
            red = 1 - f["peak_mb"] / e["peak_mb"]
            targets.append((red >= TARGET_MEMORY_REDUCTION,
                            f"fk peak memory {red * 100:.1f} % below eager "
                            f"(target >= {TARGET_MEMORY_REDUCTION * 100:.0f} %)"))
    if "ms" in f and "ms" in lg:
        targets.append((f["ms"] <= lg["ms"], f"fk step {lg['ms'] / f['ms']:.2f}x Liger's speed "
                                             f"(target >= 1.00x)"))
    elif "liger" in res:
        targets.append((None, "fk at least as fast as Liger: not measured (Liger did not run)"))
    if args.device != "cuda":
        targets.append((None, "fk peak memory below eager: not measured on CPU"))
    print()
    for ln in lines:
        print(ln)
    where = "" if args.device == "cuda" and not args.tiny else " (smoke run: the targets are for the 1B model on an H200)"
    for passed, text in targets:
        verdict = "N/A" if passed is None else "PASS" if passed else "FAIL"
        print(f"{verdict} target: {text}{where}")
    if args.check_targets and not all(p for p, _ in targets):  # N/A counts as missed
        ok = False
    return ok


def write_csv(res, info, args, batch, path, model=None):
    model = model or model_name(args)
    new = []
    for name, r in res.items():
        new.append(dict(info, model=model, dtype=r.get("dtype", ""), provider=name,
                        batch=batch, seq=args.seq, warmup=args.warmup, steps=args.steps,
                        ms=_cell(r.get("ms"), ".3f"),
                        tokens_per_s=_cell(r.get("tokens_per_s"), ".0f"),
                        peak_mb=_cell(r.get("peak_mb"), ".0f"),
                        losses=";".join(f"{x:.4f}" for x in r.get("losses", [])),
                        error=r.get("error", "")))
    keys = {tuple(str(r[k]) for k in _KEY) for r in new}
    old = []
    if path.exists():
        with open(path, newline="") as fh:
            old = [r for r in csv.DictReader(fh) if tuple(r.get(k, "") for k in _KEY) not in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(old + new)
    print(f"wrote {path}")


def chosen_providers(args):
    """(the providers of --providers, notes): unknown names exit; Liger is left out on the CPU."""
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    bad = [p for p in providers if p not in PROVIDERS]
    if bad:
        raise SystemExit(f"unknown provider(s) {bad}; choose from {', '.join(PROVIDERS)}")
    notes = []
    if args.device == "cpu" and "liger" in providers:
        providers.remove("liger")
        notes.append("liger: skipped on CPU (its kernels are Triton GPU kernels)")
    return providers, notes


def add_step_args(ap, per_step="per step", batch=8, device_help=""):
    """The options of a training-step benchmark (this one and benchmark_fsdp_training.py):
    batch sequences `per_step`, `batch` of them by default."""
    ap.add_argument("--device", default=None,
                    help="cuda (default when a GPU is visible) or cpu" + device_help)
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny Llama (hidden 64, 2 layers, vocab 1024), seq 64, batch 2: "
                         "a smoke test that runs on CPU in seconds")
    ap.add_argument("--providers", default=",".join(PROVIDERS),
                    help="comma-separated, from eager, fk, liger (liger is skipped on CPU)")
    ap.add_argument("--batch", type=int, default=None, help=f"sequences {per_step} (default "
                    f"{batch}; 2 with --tiny); halved while eager runs out of memory")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 2048; "
                    "64 with --tiny)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=MODELS[0], choices=MODELS,
                    help="the model's shape (default llama_3_2_1b)")
    ap.add_argument("--out", default=None, help="CSV folder ('' for none; default "
                    "benchmarks/results, none with --tiny)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)


def fill_step_args(args, batch=8):
    """The defaults of add_step_args's options that depend on --tiny and the machine."""
    if args.batch is None:
        args.batch = 2 if args.tiny else batch
    if args.seq is None:
        args.seq = 64 if args.tiny else 2048
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_args(ap)
    ap.add_argument("--check-targets", action="store_true",
                    help="exit non-zero when a target is missed (by default only failed runs "
                         "or insane losses do)")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, print each provider's GPU kernels of one step")
    ap.add_argument("--amp", action="store_true",
                    help="float32 weights, forwards under torch.autocast bf16 (as "
                         "Trainer(bf16=True))")
    args = fill_step_args(ap.parse_args())

    if args.child:
        args.provider = args.child
        child_main(args)
        return

    providers, notes = chosen_providers(args)
    info = versions(args.device)
    batch, res = args.batch, {}
    for name in providers:
        while True:
            print(f"[{name}] batch {batch} x seq {args.seq} ...", file=sys.stderr, flush=True)
            r = spawn(args, name, batch)
            if name == "eager" and r.get("oom") and batch > 1:
                notes.append(f"eager ran out of memory at batch {batch}; halved to {batch // 2}")
                batch //= 2
                continue
            break
        r.pop("oom", None)
        print(f"[{name}] done in {r.pop('wall_s'):.0f} s" +
              (f": {r['error']}" if "error" in r else ""), file=sys.stderr, flush=True)
        res[name] = r
    print_table(res, info, args, batch)
    for n in notes:
        print(f"note: {n}")
    ok = check(res, args, model_config(args).vocab_size)
    out = args.out if args.out is not None else ("" if args.tiny else str(RESULTS_DIR))
    if out:
        slug = re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower()).strip("-")
        write_csv(res, info, args, batch, Path(out) / f"hf_training_{slug}.csv")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
