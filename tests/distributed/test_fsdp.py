"""A Hugging Face Llama patched with fk.transformers.apply_fk, trained in 2 processes under
torch's FSDP2 (fully_shard) and DDP, against the unpatched model trained in one process on
the same global batches: the same losses and gradients within float32 noise. Covers the
head as part of the root FSDP unit and as its own unit (fk's fused loss must get the
gathered weight, and its gradient must be reduce-scattered like any other), tied
embeddings, activation checkpointing, gradient accumulation with ``num_items_in_batch``
(unequal token counts per micro-batch and per rank) and bf16 mixed precision (fk against
Hugging Face under the same wrapper). All scenarios run in the same 2 processes; gloo on
CPU, or NCCL on 2 GPUs (marker cuda)."""
import pytest
import torch

from helpers import distributed_params, run_distributed, tiny_hf_model

STEPS, BATCH, SEQ, VOCAB = 3, 4, 16, 96  # BATCH: the global batch, split over the 2 ranks
LR = 0.5
MICRO = 2  # micro-batches per rank in the accumulation scenarios


def _batches(ignored):
    """Per step: (input_ids, labels) of the global batch. With ``ignored``, labels are -100
    at random places (about a third), so ranks and micro-batches hold unequal counts."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH * (MICRO if ignored else 1), SEQ), generator=g)
        labels = ids.clone()
        if ignored:
            labels[torch.rand(labels.shape, generator=g) < 0.35] = -100
        out.append((ids, labels))
    return out


def _model(tied):
    return tiny_hf_model("llama", tie_word_embeddings=tied).train()


def _name(n):
    """A parameter's name in the plain model (wrappers add prefixes)."""
    for prefix in ("module.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module."):
        n = n.replace(prefix, "")
    return n


def _full_grads(model):
    from torch.distributed.tensor import DTensor
    return {_name(n): (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
            .detach().cpu().clone() for n, p in model.named_parameters()}


# scenario -> (wrapper, options)
SCENARIOS = {
    "ddp": ("ddp", {}),
    "fsdp": ("fsdp", {}),
    "fsdp_head_unit": ("fsdp", dict(head_unit=True)),
    "fsdp_tied": ("fsdp", dict(tied=True)),
    "fsdp_checkpointing": ("fsdp", dict(checkpointing=True)),
    "fsdp_unpatched": ("fsdp", dict(patch=False)),
    "fsdp_patched_after_sharding": ("fsdp", dict(head_unit=True, patch_after=True)),
    "fsdp_accumulation": ("fsdp", dict(accumulate=True)),
    "fsdp_head_unit_accumulation": ("fsdp", dict(accumulate=True, head_unit=True)),
    "ddp_accumulation": ("ddp", dict(accumulate=True)),
    "fsdp_bf16": ("fsdp", dict(bf16=True)),
    "fsdp_bf16_unpatched": ("fsdp", dict(bf16=True, patch=False)),
}


def _train(rank, world_size, device, wrapper, tied=False, head_unit=False, checkpointing=False,
           patch=True, accumulate=False, bf16=False, patch_after=False):
    """Train the tiny model on this rank's part of each global batch; returns the global
    losses per step and the full gradients of the first step."""
    import torch.distributed as dist
    import fk.transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(tied).to(device)
    if patch and not patch_after:
        fk.transformers.apply_fk(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if wrapper == "ddp":
        wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 else MixedPrecisionPolicy())
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        if head_unit:
            fully_shard(model.lm_head, mp_policy=mp)
        wrapped = fully_shard(model, mp_policy=mp)
        if patch_after:  # fully_shard has given the modules classes of its own by now
            fk.transformers.apply_fk(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], None
    for ids, labels in _batches(accumulate):
        ids, labels = ids.to(device), labels.to(device)
        if not accumulate:
            part = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
            loss = wrapped(input_ids=ids[part], labels=labels[part]).loss
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            total /= world_size  # equal token counts per rank: the mean of the ranks' means
        else:
            # Hugging Face's (and the Trainer's) recipe: every micro-batch's loss is its sum
            # over tokens divided by the count of non-ignored (shifted) labels over all
            # micro-batches of all ranks; the wrappers average gradients over the ranks, so
            # the loss is scaled up by the number of ranks.
            count = (labels[:, 1:] != -100).sum()
            rows = ids.shape[0] // (world_size * MICRO)
            total = torch.zeros((), device=device)
            for m in range(MICRO):
                part = slice((rank * MICRO + m) * rows, (rank * MICRO + m + 1) * rows)
                last = m == MICRO - 1
                if wrapper == "ddp" and not last:
                    with wrapped.no_sync():
                        loss = wrapped(input_ids=ids[part], labels=labels[part],
                                       num_items_in_batch=count).loss
                        (loss * world_size).backward()
                else:
                    if wrapper == "fsdp":
                        wrapped.set_requires_gradient_sync(last)
                    loss = wrapped(input_ids=ids[part], labels=labels[part],
                                   num_items_in_batch=count).loss
                    (loss * world_size).backward()
                total += loss.detach()
            dist.all_reduce(total)
        if grads is None:
            grads = _full_grads(wrapped)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(total))
    return dict(losses=losses, grads=grads,
                patched=fk.transformers.patched(model) if patch else {})


def _worker(rank, world_size, device):
    return {name: _train(rank, world_size, device, wrapper, **opts)
            for name, (wrapper, opts) in SCENARIOS.items()}


@pytest.fixture(scope="module", params=distributed_params())
def run(request):
    """(device type, the results of every scenario per rank)."""
    backend, device = request.param
    return device, run_distributed(_worker, backend=backend, device=device)


# Relative tolerance against the one-process CPU reference: float32 noise (summation orders
# differ with the sharding); on GPUs the kernels' float32 summation orders differ from the
# CPU's too.
RTOL = {"cpu": 2e-4, "cuda": 2e-3}


def _reference(tied=False, accumulate=False):
    """The unpatched model in one process on the whole global batches (a plain mean over
    all non-ignored tokens)."""
    model = _model(tied)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], None
    for ids, labels in _batches(accumulate):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return dict(losses=losses, grads=grads)


_REFERENCES = {}


def ref_patched():
    """What apply_fk patches in the tiny model, unsharded."""
    import fk.transformers
    return fk.transformers.patched(fk.transformers.apply_fk(_model(False)))


def _ref(**kw):
    key = tuple(sorted(kw.items()))
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(**kw)
    return _REFERENCES[key]


def _assert_matches(ours, ref, rtol, atol, what):
    assert ours["grads"].keys() == ref["grads"].keys(), what
    for n, g in ref["grads"].items():
        torch.testing.assert_close(ours["grads"][n], g, rtol=rtol, atol=atol,
                                   msg=lambda m: f"{what}: gradient of {n}: {m}")
    torch.testing.assert_close(torch.tensor(ours["losses"]), torch.tensor(ref["losses"]),
                               rtol=rtol, atol=0.0, msg=lambda m: f"{what}: losses: {m}")


FP32 = [s for s, (_, o) in SCENARIOS.items() if not o.get("bf16")]


@pytest.mark.parametrize("scenario", FP32)
def test_matches_one_process_unpatched(run, scenario):
    """Losses of every step and gradients of the first, in every rank, equal the unpatched
    model's in one process on the whole batch (float32 noise: summation orders differ)."""
    _, opts = SCENARIOS[scenario]
    ref = _ref(tied=opts.get("tied", False), accumulate=opts.get("accumulate", False))
    device, results = run
    for rank, res in enumerate(results):
        ours = res[scenario]
        if opts.get("patch", True):
            assert ours["patched"] == ref_patched(), scenario
        _assert_matches(ours, ref, RTOL[device], 1e-6, f"{scenario} (rank {rank})")


def test_bf16_mixed_precision_follows_unpatched(run):
    """bf16 parameters and float32 gradient reduction (FSDP2's MixedPrecisionPolicy): fk
    and Hugging Face under the same wrapper agree to bf16 rounding."""
    for res in run[1]:
        ours, hf = res["fsdp_bf16"], res["fsdp_bf16_unpatched"]
        torch.testing.assert_close(torch.tensor(ours["losses"]), torch.tensor(hf["losses"]),
                                   rtol=2e-2, atol=0.0)
        for n, g in hf["grads"].items():
            err = (ours["grads"][n] - g).norm() / g.norm()
            assert err < 5e-2, (n, float(err))
