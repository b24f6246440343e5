"""FSDP2 training steps of a ~1B Llama-3-style Hugging Face model on N GPUs: eager vs fk vs
Liger.

The model and providers are ``benchmark_hf_training.py``'s (Llama-3.2-1B's shape, random
weights, sdpa attention, random tokens; ``eager`` / ``fk`` (``apply_fk``) / ``liger``),
sharded with torch's ``fully_shard`` (FSDP2): one unit per decoder layer and the root
(embeddings, final norm and the tied head). Weights and AdamW's state are float32 shards;
compute runs on bf16 parameters gathered per unit, gradients are reduced in float32
(``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``). One step is the
forward with labels, the backward, the optimizer step and zero_grad. Each provider runs in
its own ``torchrun`` launch of ``--nproc`` processes, one GPU each (NCCL), so that its peak
memory is its own; every process trains on its own ``--batch`` rows of each global batch.

Reported per provider: the step time (the median over the timed steps, of the slowest
process), tokens/s per GPU (``batch x seq`` / step time), peak memory per GPU
(``torch.cuda.max_memory_allocated``, the largest over processes), the first losses
(averaged over processes: the same start for every provider).

    python benchmarks/benchmark_fsdp_training.py --nproc 2 [--batch 4] [--seq 2048]
    python benchmarks/benchmark_fsdp_training.py --nproc 2 --device cpu --tiny  # gloo smoke test

``--device cpu`` runs the same on gloo, in float32 (no mixed precision; Liger skipped); with
``--tiny`` (a tiny Llama, seq 64) it takes seconds. Results go to
``benchmarks/results/fsdp_training_<gpu>.csv`` (model column ``<model>@fsdp<N>``).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmark_hf_training import (LOSS_STEPS, RESULTS_DIR, add_step_args,  # noqa: E402
                                   check, chosen_providers, fill_step_args, model_config,
                                   model_name, patch, print_table, versions, write_csv)


def run_rank(args):
    """One process of one provider: build, patch, shard, train; rank 0 gets the results."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = model_config(args)
    torch.manual_seed(args.seed)  # the same weights in every process and every provider
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    patch(model, args.provider)
    params = sum(p.numel() for p in model.parameters())
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if cuda else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=True)
    g = torch.Generator().manual_seed(args.seed + 1)
    steps = args.warmup + args.steps
    # Global batches, the same for every provider; each process trains on its own rows.
    batches = [torch.randint(0, config.vocab_size, (args.batch * world, args.seq),
                             generator=g).chunk(world)[rank] for _ in range(min(steps, 4))]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for i in range(steps):
        ids = batches[i % len(batches)].to(device, non_blocking=True)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if i < LOSS_STEPS:
            losses.append(loss.detach().float())
    ms = statistics.median(times[args.warmup:]) * 1e3
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else 0.0
    stats = torch.tensor([ms, peak], dtype=torch.float64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # the slowest process, the fullest GPU
    mean_losses = torch.stack(losses)
    dist.all_reduce(mean_losses)  # gloo has no AVG
    mean_losses = (mean_losses / world).tolist()
    ms, peak = stats.tolist()
    dist.destroy_process_group()
    dtype = "float32+fsdp_mp_bf16" if cuda else "float32"
    return rank, dict(params=params, dtype=dtype, ms=ms,
                      tokens_per_s=args.batch * args.seq / (ms * 1e-3),
                      peak_mb=peak if cuda else None, losses=mean_losses)


def child_main(args):
    rank = int(os.environ.get("RANK", 0))
    try:
        rank, res = run_rank(args)
    except Exception as e:  # noqa: BLE001  (recorded, reported by the parent)
        traceback.print_exc()
        oom = type(e).__name__ == "OutOfMemoryError"
        first = (str(e).strip().splitlines() or [""])[0][:300]
        res = dict(error=f"{type(e).__name__}: {first}", oom=oom)
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def launch(args, provider, batch):
    """One provider: torchrun with --nproc processes; rank 0's result comes back."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(args.nproc), os.path.abspath(__file__), "--child", provider,
           "--device", args.device, "--batch", str(batch), "--seq", str(args.seq),
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--lr", str(args.lr),
           "--seed", str(args.seed), "--model", args.model] + (["--tiny"] if args.tiny else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return dict(error=f"torchrun exited with {p.returncode} and no result "
                          f"(output: {p.stdout.strip()[-300:]!r})", oom=False, wall_s=wall)
    return dict(json.loads(lines[-1][len("RESULT "):]), wall_s=wall)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=None,
                    help="processes, one GPU each (default: every visible GPU; 2 on CPU)")
    add_step_args(ap, per_step="per GPU and step", batch=4, device_help=" (gloo, float32)")
    ap.add_argument("--check-targets", action="store_true",
                    help="exit non-zero when a target of benchmark_hf_training.py is missed")
    args = fill_step_args(ap.parse_args(argv), batch=4)
    if args.nproc is None:
        import torch
        args.nproc = torch.cuda.device_count() if args.device == "cuda" else 2
    args.amp, args.profile = False, False  # what benchmark_hf_training's helpers read
    return args


def main():
    args = parse_args()
    if args.child:
        args.provider = args.child
        child_main(args)
        return
    providers, notes = chosen_providers(args)
    info = versions(args.device)
    batch, res = args.batch, {}
    for name in providers:
        while True:
            print(f"[{name}] {args.nproc} processes, batch {batch} x seq {args.seq} per "
                  f"process ...", file=sys.stderr, flush=True)
            r = launch(args, name, batch)
            if name == "eager" and r.get("oom") and batch > 1:
                notes.append(f"eager ran out of memory at batch {batch}; halved to {batch // 2}")
                batch //= 2
                continue
            break
        r.pop("oom", None)
        print(f"[{name}] done in {r.pop('wall_s'):.0f} s" +
              (f": {r['error']}" if "error" in r else ""), file=sys.stderr, flush=True)
        res[name] = r
    backend = "NCCL" if args.device == "cuda" else "gloo"
    print_table(res, info, args, batch,
                title=f"FSDP2 training step, {args.nproc} processes ({backend}); per GPU")
    for n in notes:
        print(f"note: {n}")
    ok = check(res, args, model_config(args).vocab_size)
    out = args.out if args.out is not None else ("" if args.tiny else str(RESULTS_DIR))
    if out:
        slug = re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower()).strip("-")
        write_csv(res, info, args, batch, Path(out) / f"fsdp_training_{slug}.csv",
                  model=f"{model_name(args)}@fsdp{args.nproc}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
