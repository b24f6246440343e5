"""Benchmark fk.vocab_parallel_cross_entropy (and its fused linear head) on W GPUs against
gathering the logits and calling torch's (or fk's) cross entropy on the whole vocabulary.

    python benchmarks/benchmark_vocab_parallel_cross_entropy.py --world 2 --model llama_3_8b
    python benchmarks/benchmark_vocab_parallel_cross_entropy.py --cpu-smoke   # gloo, tiny

Each of W processes (one per GPU, NCCL) holds a (tokens, V / W) slice of the logits of the
model's vocabulary (bf16 by default) and the same targets. Providers, per rank:

- ``torch (gather)``: all-gather the shards into the (tokens, V) logits, then Hugging Face's
  loss (F.cross_entropy of the logits upcast to float32); the backward keeps this rank's
  columns of the full gradient (every rank computed the same one);
- ``fk (gather)``: the same gather, then fk.cross_entropy (gradient in the gathered logits);
- ``fk``: fk.vocab_parallel_cross_entropy on the shard (one all-gather of 6 floats a row);
- with ``--linear``: ``fk linear``, fk.vocab_parallel_fused_linear_cross_entropy from the
  (tokens, H) hidden states and this rank's (V / W, H) head rows, against ``torch linear
  (gather)``: the shard's logits by a matmul, then ``torch (gather)`` (the hidden states'
  gradient all-reduced over the ranks in the backward, as fk's).

Modes: forward, and full (forward + ``loss.backward()``). Every rank runs the same fixed
number of calls (a timer that picks its repetitions from a first estimate could pick a
different number on each rank and leave a collective waiting); the time per call is the
slowest rank's (CUDA events on GPUs), the peak memory above the inputs the largest rank's.
"""
import argparse
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402


class _GatherLogits(torch.autograd.Function):
    """(tokens, V / W) shards -> (tokens, V); the backward keeps this rank's columns (every
    rank computes the same loss of the same full logits, so no communication)."""

    @staticmethod
    def forward(ctx, shard, group, rank, world):
        n, v = shard.shape
        out = shard.new_empty((world * n, v))
        dist.all_gather_into_tensor(out, shard.contiguous(), group=group)
        ctx.cols = (rank * v, (rank + 1) * v)
        return out.view(world, n, v).permute(1, 0, 2).reshape(n, world * v)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.cols[0]:ctx.cols[1]], None, None, None


class _SumGradOverRanks(torch.autograd.Function):
    """Identity whose backward all-reduces (sums) the gradient: the column-parallel head's
    input, whose gradient is the sum of every rank's part (Megatron's copy to the tensor
    parallel region)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def providers(group, rank, world, linear):
    import fk

    def gather(x):
        return _GatherLogits.apply(x, group, rank, world)

    out = {
        "torch (gather)": lambda x, t: F.cross_entropy(gather(x).float(), t),
        "fk (gather)": lambda x, t: fk.cross_entropy(gather(x), t, loss_dtype=torch.float32),
        "fk": lambda x, t: fk.vocab_parallel_cross_entropy(x, t, group,
                                                           loss_dtype=torch.float32),
    }
    if linear:
        out["torch linear (gather)"] = lambda h, w, t: F.cross_entropy(
            gather(_SumGradOverRanks.apply(h, group) @ w.t()).float(), t)
        out["fk linear"] = lambda h, w, t: fk.vocab_parallel_fused_linear_cross_entropy(
            h, w, t, group, loss_dtype=torch.float32)
    return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device, group, warmup, rep):
    """Time per call of fn() over `rep` calls after `warmup`, the slowest rank's."""
    for _ in range(warmup):
        fn()
    _sync(device)
    dist.barrier(group=group)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(rep):
            fn()
        end.record()
        _sync(device)
        ms = start.elapsed_time(end) / rep
    else:
        t0 = time.perf_counter()
        for _ in range(rep):
            fn()
        ms = (time.perf_counter() - t0) * 1e3 / rep
    return _max_over_ranks(ms, device, group)


def _max_over_ranks(v, device, group):
    t = torch.tensor([v], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def peak_mb(fn, device, group):
    if device.type != "cuda":
        return float("nan")
    _sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return _max_over_ranks((torch.cuda.max_memory_allocated(device) - base) / 2**20, device,
                           group)


def worker(rank, world, port, args):
    backend = "gloo" if args.cpu_smoke else "nccl"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    group = dist.group.WORLD
    model = H.get_model(args.model)
    if args.cpu_smoke:
        model = model.scaled(H.QUICK_DIV * 8)
    v = model.vocab_size // world * world
    vl, hdim = v // world, model.hidden_size
    dtype = H.DTYPES[args.dtype]
    fns = providers(group, rank, world, args.linear)
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        for mode in H.parse_modes(args.modes):
            for name, fn in fns.items():
                torch.manual_seed(tokens)  # the same inputs on every rank
                t = torch.randint(0, v, (tokens,), device=device)
                if "linear" in name:
                    h = (torch.randn(tokens, hdim, device=device) * 0.5).to(dtype)
                    w = (torch.randn(v, hdim, device=device) * 0.02).to(dtype)
                    h.requires_grad_()
                    w = w[rank * vl:(rank + 1) * vl].clone().requires_grad_()
                    inputs = (h, w, t)
                    grads = (h, w)
                else:
                    x = torch.randn(tokens, v, device=device).to(dtype)
                    x = x[:, rank * vl:(rank + 1) * vl].clone().requires_grad_()
                    inputs = (x, t)
                    grads = (x,)

                def step(fn=fn, inputs=inputs, grads=grads, mode=mode):
                    for g in grads:
                        g.grad = None
                    loss = fn(*inputs)
                    if mode == "full":
                        loss.backward()
                    return loss

                step()
                mb = peak_mb(step, device, group)
                ms = time_ms(step, device, group, args.warmup, args.rep)
                rows.append(dict(tokens=tokens, mode=mode, provider=name, ms=ms, peak_mb=mb))
                del inputs, grads
    if rank == 0:
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"vocab_parallel_cross_entropy | {model.name} (tokens, {v} / {world}) mean | "
              f"{args.dtype} | {backend}, {world} ranks | {gpu} | torch {torch.__version__} | "
              "time per call: the slowest rank's; peak MB: the largest rank's")
        names = list(dict.fromkeys(r["provider"] for r in rows))
        for mode in dict.fromkeys(r["mode"] for r in rows):
            print(f"\n[{mode}]")
            print("tokens  " + "  ".join(f"{n + ' ms':>22}" for n in names)
                  + "  " + "  ".join(f"{n + ' MB':>22}" for n in names))
            for tokens in dict.fromkeys(r["tokens"] for r in rows):
                get = {r["provider"]: r for r in rows if r["mode"] == mode
                       and r["tokens"] == tokens}
                print(f"{tokens:6d}  " + "  ".join(f"{get[n]['ms']:22.4f}" for n in names)
                      + "  " + "  ".join(f"{get[n]['peak_mb']:22.1f}" for n in names))
        if args.out:
            import fk
            info = dict(gpu=f"{gpu} x{world}", torch=torch.__version__, triton="",
                        fk=fk.__version__, liger="")
            csv_rows = [dict(info, op="vocab_parallel_cross_entropy", model=model.name,
                             dtype=args.dtype, timer="events" if device.type == "cuda"
                             else "wall", bytes=0, copy_bw=0, fraction_of_copy_bw=0, **r)
                        for r in rows]
            print("wrote", H.write_csv(csv_rows, Path(args.out),
                                       f"vocab_parallel_cross_entropy_x{world}", gpu))
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama_3_8b", choices=sorted(H.MODELS))
    p.add_argument("--tokens", default="4096,8192,16384", help="comma-separated token counts")
    p.add_argument("--dtype", default="bf16", choices=sorted(H.DTYPES))
    p.add_argument("--world", type=int, default=2, help="processes (one GPU each)")
    p.add_argument("--modes", default="forward,full")
    p.add_argument("--linear", action="store_true",
                   help="also the fused linear head against matmul + gather + torch")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls")
    p.add_argument("--rep", type=int, default=20, help="timed calls")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="gloo on the CPU, the model's widths / 128, 64 tokens (a smoke test)")
    p.add_argument("--out", default="", help="CSV folder (default: no CSV)")
    args = p.parse_args()
    if args.cpu_smoke:
        args.tokens, args.warmup, args.rep = "64", 1, 2
    elif torch.cuda.device_count() < args.world:
        raise SystemExit(f"needs {args.world} GPUs (found {torch.cuda.device_count()}); "
                         "--cpu-smoke runs a tiny shape on gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
