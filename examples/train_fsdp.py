"""Train a small randomly initialised Llama with fk on several processes under FSDP2.

    torchrun --nproc-per-node 2 examples/train_fsdp.py [--steps 20] [--compare]

The model is ``examples/train_tiny.py``'s (a byte-level ``LlamaForCausalLM``), patched with
``fk.transformers.apply_fk`` and sharded with torch's ``fully_shard`` (FSDP2): each decoder
layer is one unit, the root holds the embeddings, the final norm and the head. fk's fused
linear cross entropy runs inside the head's call, so FSDP gathers the head's sharded weight
for it and reduce-scatters its gradient as for any layer. On GPUs: NCCL, one GPU per
process, bf16 parameters for compute with float32 gradient reduction and float32 master
weights (``MixedPrecisionPolicy``); on CPU: gloo, float32 throughout.

Every step, each process trains on its own rows of the global batch (``--batch`` rows of
``--context`` bytes of ``examples/data/tiny.txt``). Rank 0 prints the loss averaged over the
processes. ``--compare`` trains the unpatched Hugging Face model the same way first, from
the same weights on the same batches, prints both curves and exits non-zero if fk's departs
from it by more than train_tiny.py's tolerances. ``--accumulate K`` splits each process's
rows into K micro-batches and accumulates their gradients, with Hugging Face's
``num_items_in_batch`` (the token count of the whole global batch) so that the gradients
are those of the whole batch.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import fk
import fk.transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tiny import DATA, FIRST, REL, make_model  # noqa: E402


def setup():
    """The process group: NCCL with one GPU per process where CUDA is available, else gloo
    on CPU. torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return torch.device("cuda", local)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)  # the processes share the machine's cores
    return torch.device("cpu")


def shard(model, device):
    """FSDP2: one unit per decoder layer, then the root (embeddings, final norm, head)."""
    cuda = device.type == "cuda"
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if cuda else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    return fully_shard(model, mp_policy=mp)


def train(model, batches, args, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses = []
    for ids in batches:
        ids = ids.to(device)
        # The token count of the whole global batch (labels are shifted inside the model).
        count = ids.shape[0] * (ids.shape[1] - 1)
        mine = ids.chunk(world)[rank]
        total = torch.zeros((), device=device)
        micro = mine.chunk(args.accumulate)
        for i, part in enumerate(micro):
            model.set_requires_gradient_sync(i == len(micro) - 1)
            if args.accumulate > 1:
                # The sum over this micro-batch's tokens / the global count; FSDP averages
                # gradients over processes, hence the factor world.
                loss = model(input_ids=part, labels=part, num_items_in_batch=count).loss
                (loss * world).backward()
            else:
                loss = model(input_ids=part, labels=part).loss
                loss.backward()
                loss = loss / world  # equal token counts: the mean of the processes' means
            total += loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(total)
        losses.append(total.item())
        if rank == 0 and (len(losses) == 1 or len(losses) % args.every == 0):
            print(f"step {len(losses):4d}  loss {losses[-1]:.4f}", flush=True)
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="rows of the global batch")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per process")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=5, help="print the loss every N steps")
    ap.add_argument("--compare", action="store_true",
                    help="train the unpatched model first and check that fk's loss follows it")
    args = ap.parse_args()

    device = setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % (world * args.accumulate):
        raise SystemExit(f"--batch {args.batch} must be a multiple of processes x accumulate "
                         f"({world} x {args.accumulate})")
    data = torch.tensor(list(DATA.read_bytes()), dtype=torch.long)
    g = torch.Generator().manual_seed(args.seed)  # the same batches in every process
    starts = torch.randint(0, len(data) - args.context, (args.steps, args.batch), generator=g)
    batches = [torch.stack([data[s:s + args.context] for s in row]) for row in starts]
    if rank == 0:
        print(f"fk {fk.__version__}, torch {torch.__version__}; {world} processes "
              f"({dist.get_backend()}, {device.type}); FSDP2; {args.steps} steps of "
              f"{args.batch} x {args.context} tokens", flush=True)

    runs = {}
    for name in (("HF", "fk") if args.compare else ("fk",)):
        model = make_model(device, torch.float32, args.seed)  # float32 master weights
        if name == "fk":
            fk.transformers.apply_fk(model)
        if rank == 0:
            print(f"{name}: {fk.transformers.patched(model) or 'Hugging Face as written'}",
                  flush=True)
        runs[name] = train(shard(model, device), batches, args, device)
        del model

    ok = True
    if args.compare and rank == 0:
        hf, ours = runs["HF"], runs["fk"]
        first, rel = FIRST[device.type], REL[device.type]
        d0 = abs(ours[0] - hf[0])
        worst = max(abs(a - b) / b for a, b in zip(ours, hf))
        print(f"|fk - HF| at step 1: {d0:.2e} (tolerance {first:g}); largest |fk - HF| / HF: "
              f"{worst:.2e} (tolerance {rel:g})")
        ok = d0 <= first and worst <= rel
        print("OK: fk's loss follows Hugging Face's under FSDP2" if ok
              else "FAIL: fk's loss departs from Hugging Face's")
    # Every rank leaves together: a gloo peer closing its connections while another rank is
    # still inside the group can abort that rank's shutdown.
    dist.barrier()
    dist.destroy_process_group()
    # Leave without C++ static destructors: on a loaded 2-core machine a gloo rank has still
    # aborted in them ("terminate called without an active exception") after this clean
    # shutdown, with every result already printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
