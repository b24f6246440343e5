"""fk's ops on DTensors (torch.distributed.tensor), in 2 processes, against independent
references on the full tensors: outputs and gradients equal, and the placements those
carry are the ones torch's own layers give (activations sharded as the input, the
gradients of replicated weights Partial sums). Each case runs in the same 2 processes (one
process group for the whole module); gloo on CPU, or NCCL on 2 GPUs (marker cuda)."""
import zlib

import torch
import torch.nn.functional as F
import pytest

from helpers import assert_close, distributed_params, ref_cross_entropy, ref_geglu, ref_rms_norm, \
    ref_swiglu, run_distributed

T, H = 6, 8  # tokens per sequence, hidden size
V = 32  # vocabulary of the cross entropy cases


def _inputs(case):
    """The full (unsharded) inputs of a case, the same in every process and in the test."""
    g = torch.Generator().manual_seed(zlib.crc32(case.encode()))

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    op = case.split(":")[0]
    if op in ("rms_norm", "layer_norm"):
        return dict(x=rnd(4, T, H), weight=1 + 0.1 * rnd(H), bias=rnd(H), grad=rnd(4, T, H))
    if op == "fused_add_rms_norm":
        return dict(x=rnd(4, T, H), residual=rnd(4, T, H), weight=1 + 0.1 * rnd(H),
                    grad=rnd(4, T, H), grad_residual=rnd(4, T, H))
    if op == "rope":
        pos = torch.arange(T, dtype=torch.float32)[:, None] * 0.3 ** torch.arange(8)
        cos, sin = torch.cat([pos.cos(), pos.cos()], -1), torch.cat([pos.sin(), pos.sin()], -1)
        return dict(q=rnd(2, 4, T, 16), k=rnd(2, 2, T, 16), cos=cos[None], sin=sin[None],
                    grad_q=rnd(2, 4, T, 16), grad_k=rnd(2, 2, T, 16))
    if op in ("swiglu", "geglu"):
        return dict(a=rnd(4, T, H), b=rnd(4, T, H), grad=rnd(4, T, H))
    if op == "cross_entropy":
        target = torch.randint(0, V, (12,), generator=g)
        target[[1, 2, 7]] = -100  # rank 0 gets 2 ignored rows, rank 1 one: unequal counts
        return dict(logits=rnd(12, V), target=target, grad=rnd(12), weight=rnd(V).abs() + 0.5)
    raise ValueError(case)


# case -> placement of the activations (dim sharded over the 2 processes)
CASES = {
    "rms_norm:batch": 0, "rms_norm:seq": 1, "rms_norm:hidden": 2,
    "layer_norm:seq": 1, "layer_norm:hidden": 2,
    "fused_add_rms_norm:seq": 1,
    "rope:batch": 0, "rope:heads": 1, "rope:seq": 2, "rope:head_dim": 3,
    "swiglu:seq": 1, "swiglu:hidden": 2, "geglu:batch": 0,
    "cross_entropy:mean": 0, "cross_entropy:sum": 0, "cross_entropy:none": 0,
    "cross_entropy:vocab": 1, "cross_entropy:weighted": 0,
    # defer_grad, and mean_denominator (a plain tensor of 5)
    "cross_entropy:defer_mean": 0, "cross_entropy:defer_sum": 0, "cross_entropy:defer_none": 0,
    "cross_entropy:mean_den": 0, "cross_entropy:defer_mean_den": 0,
}

MEAN_DENOMINATOR = 5.0


def _ce_variant(variant):
    """(reduction, defer_grad, mean_denominator or None, weighted) of a cross_entropy case."""
    defer = variant.startswith("defer_")
    base = variant[len("defer_"):] if defer else variant
    den = MEAN_DENOMINATOR if base == "mean_den" else None
    reduction = "mean" if base in ("vocab", "weighted", "mean_den") else base
    return reduction, defer, den, base == "weighted"


def _run_case(case, mesh):
    import fk
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    op, variant = case.split(":")
    t = {n: v.to(mesh.device_type) for n, v in _inputs(case).items()}
    shard = [Shard(CASES[case])]

    def act(x, placements=shard):
        return distribute_tensor(x, mesh, placements).requires_grad_(x.is_floating_point())

    def rep(w):
        return distribute_tensor(w, mesh, [Replicate()]).requires_grad_()

    out, leaves = {}, {}
    if op in ("rms_norm", "layer_norm", "fused_add_rms_norm"):
        leaves["x"], leaves["weight"] = act(t["x"]), rep(t["weight"])
        if op == "rms_norm":
            ys = [fk.rms_norm(leaves["x"], leaves["weight"], 1e-6)]
            grads = [t["grad"]]
        elif op == "layer_norm":
            leaves["bias"] = rep(t["bias"])
            ys = [fk.layer_norm(leaves["x"], leaves["weight"], leaves["bias"], 1e-5)]
            grads = [t["grad"]]
        else:
            leaves["residual"] = act(t["residual"])
            ys = list(fk.fused_add_rms_norm(leaves["x"], leaves["residual"], leaves["weight"],
                                            1e-6))
            grads = [t["grad"], t["grad_residual"]]
    elif op == "rope":
        dim = CASES[case]
        table = {0: [Replicate()], 1: [Replicate()], 2: [Shard(1)], 3: [Replicate()]}[dim]
        leaves["q"], leaves["k"] = act(t["q"]), act(t["k"])
        cos, sin = (distribute_tensor(t[n], mesh, table) for n in ("cos", "sin"))
        ys = list(fk.rope(leaves["q"], leaves["k"], cos, sin))
        grads = [t["grad_q"], t["grad_k"]]
    elif op in ("swiglu", "geglu"):
        leaves["a"], leaves["b"] = act(t["a"]), act(t["b"])
        f = fk.swiglu if op == "swiglu" else (lambda a, b: fk.geglu(a, b, "tanh"))
        ys, grads = [f(leaves["a"], leaves["b"])], [t["grad"]]
    else:
        leaves["logits"] = act(t["logits"])
        target = distribute_tensor(t["target"], mesh, [Shard(0)])
        reduction, defer, den, weighted = _ce_variant(variant)
        weight = distribute_tensor(t["weight"], mesh, [Replicate()]) if weighted else None
        if den is not None:
            den = torch.tensor(den, device=t["logits"].device)
        ys = [fk.cross_entropy(leaves["logits"], target, weight, reduction=reduction,
                               mean_denominator=den, defer_grad=defer)]
        grads = [t["grad"] if reduction == "none" else torch.ones((), device=t["grad"].device)]
    out["placements"] = [str(tuple(y.placements)) for y in ys]
    out["y"] = [y.full_tensor() for y in ys]
    # Partial outputs (a sum over shards) are reduced before the backward, as a user would.
    ys = [y.redistribute(placements=[Replicate() if p.is_partial() else p
                                     for p in y.placements]) for y in ys]
    torch.autograd.backward(ys, [distribute_tensor(g, mesh, y.placements)
                                 for y, g in zip(ys, grads)])
    out["grad_placements"] = {n: str(tuple(v.grad.placements)) for n, v in leaves.items()}
    out["grads"] = {n: v.grad.full_tensor() for n, v in leaves.items()}
    return out


def _hf_norm(device, patch):
    """The final RMSNorm of a tiny Hugging Face Llama of hidden size H, patched by apply_fk
    (the model's own class with fk's forward) or as written."""
    import fk.transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=16, hidden_size=H, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6))
    if patch:
        fk.transformers.apply_fk(model)
        assert "forward" in model.model.norm.__dict__  # fk's forward on this instance
    return model.model.norm.to(device)


def _sequence_parallel(mesh, device):
    """fk.nn.RMSNorm, a Hugging Face Llama's RMSNorm patched by apply_fk, the same
    unpatched and torch.nn.RMSNorm under SequenceParallel: the same outputs and gradients,
    with the same placements."""
    import fk
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
    res = {}
    t = _inputs("rms_norm:seq")
    for name, make in (("fk", lambda: fk.nn.RMSNorm(H, eps=1e-6, device=device)),
                       ("torch", lambda: torch.nn.RMSNorm(H, eps=1e-6, device=device)),
                       ("hf_fk", lambda: _hf_norm(device, True)),
                       ("hf", lambda: _hf_norm(device, False))):
        norm = make()
        with torch.no_grad():
            norm.weight.copy_(t["weight"])
        parallelize_module(norm, mesh, SequenceParallel(sequence_dim=1))
        rank = torch.distributed.get_rank()
        x = t["x"].chunk(2, dim=1)[rank].to(device).requires_grad_()  # this rank's sequence part
        y = norm(x)
        y.backward(distribute_tensor(t["grad"].to(device), mesh, y.placements))
        res[name] = dict(y=y.full_tensor().cpu(), y_placements=str(y.placements),
                         x_grad=x.grad.cpu(), w_grad=norm.weight.grad.full_tensor().cpu(),
                         w_grad_placements=str(norm.weight.grad.placements),
                         w_placements=str(norm.weight.placements))
    return res


def _unsupported(mesh):
    """fk's ops without a sharding rule refuse DTensors with DTensor's clear error."""
    import fk
    from torch.distributed.tensor import Replicate, distribute_tensor
    device = mesh.device_type
    x = distribute_tensor(torch.randn(4, H, device=device), mesh, [Replicate()])
    w = distribute_tensor(torch.randn(V, H, device=device), mesh, [Replicate()])
    target = distribute_tensor(torch.zeros(4, dtype=torch.long, device=device), mesh,
                               [Replicate()])
    try:
        fk.fused_linear_cross_entropy(x, w, target)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return f"{type(e).__name__}: {e}"
    return "no error"


def _tensor_parallel_head(mesh, device):
    """apply_fk's fused loss with a vocab-sharded (ColwiseParallel) head: a clear error."""
    import fk.transformers
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from helpers import tiny_hf_model
    model = tiny_hf_model("llama").to(device).train()
    fk.transformers.apply_fk(model)
    parallelize_module(model.lm_head, mesh, ColwiseParallel())
    ids = torch.randint(0, 96, (2, 8), device=device)
    try:
        model(input_ids=ids, labels=ids)
    except NotImplementedError as e:
        return str(e)
    return "no error"


def _worker(rank, world_size, device):
    from torch.distributed.tensor import init_device_mesh
    import fk  # noqa: F401 - registers the ops and their sharding rules
    mesh = init_device_mesh(device.type, (world_size,))
    res = {case: _cpu(_run_case(case, mesh)) for case in CASES}
    res["sequence_parallel"] = _sequence_parallel(mesh, device)
    res["unsupported"] = _unsupported(mesh)
    res["tensor_parallel_head"] = _tensor_parallel_head(mesh, device)
    return res


def _cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: _cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_cpu(v) for v in tree]
    return tree


@pytest.fixture(scope="module", params=distributed_params())
def results(request):
    backend, device = request.param
    return run_distributed(_worker, backend=backend, device=device)


# --- references on the full tensors ---------------------------------------------------------

def _rope_ref(q, k, cos, sin):
    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], -1)
    c, s = cos[:, None], sin[:, None]
    return q * c + rot(q) * s, k * c + rot(k) * s


def _reference(case):
    """(outputs, {leaf: gradient}) from plain torch math in float64."""
    op, variant = case.split(":")
    t = {n: v.double() if v.is_floating_point() else v for n, v in _inputs(case).items()}
    names = {"rms_norm": ("x", "weight"), "layer_norm": ("x", "weight", "bias"),
             "fused_add_rms_norm": ("x", "residual", "weight"), "rope": ("q", "k"),
             "swiglu": ("a", "b"), "geglu": ("a", "b"), "cross_entropy": ("logits",)}[op]
    leaves = {n: t[n].clone().requires_grad_() for n in names}
    if op == "rms_norm":
        ys, grads = [ref_rms_norm(leaves["x"], leaves["weight"], 1e-6)], [t["grad"]]
    elif op == "layer_norm":
        ys = [F.layer_norm(leaves["x"], (H,), leaves["weight"], leaves["bias"], 1e-5)]
        grads = [t["grad"]]
    elif op == "fused_add_rms_norm":
        r = leaves["x"] + leaves["residual"]
        ys, grads = [ref_rms_norm(r, leaves["weight"], 1e-6), r], [t["grad"], t["grad_residual"]]
    elif op == "rope":
        ys = list(_rope_ref(leaves["q"], leaves["k"], t["cos"], t["sin"]))
        grads = [t["grad_q"], t["grad_k"]]
    elif op == "swiglu":
        ys, grads = [ref_swiglu(leaves["a"], leaves["b"])], [t["grad"]]
    elif op == "geglu":
        ys, grads = [ref_geglu(leaves["a"], leaves["b"], "tanh")], [t["grad"]]
    else:
        reduction, _, den, weighted = _ce_variant(variant)
        weight = t["weight"] if weighted else None
        if den is None:
            ys = [ref_cross_entropy(leaves["logits"], t["target"], weight,
                                    reduction=reduction)[0]]
        else:
            ys = [ref_cross_entropy(leaves["logits"], t["target"], weight, reduction="sum")[0]
                  / den]
        grads = [t["grad"] if reduction == "none" else torch.tensor(1.0, dtype=torch.float64)]
    torch.autograd.backward(ys, grads)
    return [y.detach() for y in ys], {n: v.grad for n, v in leaves.items()}


def _close(a, b, what):
    # float32 results: the rounding of one float32 computation (the tests of each op bound
    # the kernels' own error; a sharded call must add none).
    assert_close(a, b, torch.float32, factor=2, what=what)


# The placements of the outputs, per case (as the input is sharded; the Partial of a sum).
OUT_PLACEMENTS = {
    "rms_norm:batch": ["(Shard(dim=0),)"], "rms_norm:seq": ["(Shard(dim=1),)"],
    "layer_norm:seq": ["(Shard(dim=1),)"],
    "fused_add_rms_norm:seq": ["(Shard(dim=1),)"] * 2,
    "rope:batch": ["(Shard(dim=0),)"] * 2, "rope:heads": ["(Shard(dim=1),)"] * 2,
    "rope:seq": ["(Shard(dim=2),)"] * 2,
    "swiglu:seq": ["(Shard(dim=1),)"], "swiglu:hidden": ["(Shard(dim=2),)"],
    "geglu:batch": ["(Shard(dim=0),)"],
    "cross_entropy:mean": ["(Replicate(),)"], "cross_entropy:sum": ["(Partial(sum),)"],
    "cross_entropy:none": ["(Shard(dim=0),)"],
    "cross_entropy:defer_mean": ["(Replicate(),)"],
    "cross_entropy:defer_sum": ["(Partial(sum),)"],
    "cross_entropy:defer_none": ["(Shard(dim=0),)"],
    "cross_entropy:mean_den": ["(Replicate(),)"],
    "cross_entropy:defer_mean_den": ["(Replicate(),)"],
    # class weights: the mean is computed on replicated rows (the logits gathered)
    "cross_entropy:weighted": ["(Replicate(),)"],
}
# Cases sharded on the dim an op reduces over (or rotates): redistributed first, so never
# computed piecewise; the output is not left sharded on that dim.
REDISTRIBUTED = ("rms_norm:hidden", "layer_norm:hidden", "rope:head_dim", "cross_entropy:vocab")


@pytest.mark.parametrize("case", list(CASES))
def test_op_on_dtensor_matches_reference(results, case):
    ref_y, ref_grads = _reference(case)
    for rank, res in enumerate(results):
        r = res[case]
        assert len(r["y"]) == len(ref_y)
        for i, (y, ref) in enumerate(zip(r["y"], ref_y)):
            _close(y, ref, f"{case}: output {i} on rank {rank}")
        for name, ref in ref_grads.items():
            _close(r["grads"][name], ref, f"{case}: gradient of {name} on rank {rank}")
        if case in OUT_PLACEMENTS:
            assert r["placements"] == OUT_PLACEMENTS[case]
        else:
            assert case in REDISTRIBUTED
            dim = CASES[case]
            assert all(f"Shard(dim={dim})" not in p for p in r["placements"]), r["placements"]


# Class-weighted mean cross entropy runs on gathered rows: its gradient comes back
# replicated (the same values, another valid placement).
GATHERED = ("cross_entropy:weighted",)


@pytest.mark.parametrize("case", [c for c in CASES if c not in REDISTRIBUTED + GATHERED])
def test_gradients_are_placed_like_torch_layers(results, case):
    """Activations' gradients sharded as the activations; replicated weights' gradients
    Partial sums (reduced when read, as torch's own norms under SequenceParallel)."""
    r = results[0][case]
    for name, placement in r["grad_placements"].items():
        if name in ("weight", "bias"):
            assert placement == "(Partial(sum),)", (name, placement)
        else:
            assert placement == f"(Shard(dim={CASES[case]}),)", (name, placement)


@pytest.mark.parametrize("ours,theirs", [("fk", "torch"), ("hf_fk", "hf"), ("hf_fk", "torch")])
def test_sequence_parallel_rms_norm_matches_torch(results, ours, theirs):
    for res in results:
        a, b = res["sequence_parallel"][ours], res["sequence_parallel"][theirs]
        for key in ("y_placements", "w_grad_placements", "w_placements"):
            assert a[key] == b[key], key
        assert a["w_grad_placements"] == "(Partial(sum),)"
        for key in ("y", "x_grad", "w_grad"):
            _close(a[key], b[key], f"{ours} vs {theirs}: {key}")


def test_ops_without_a_rule_refuse_dtensors_clearly(results):
    msg = results[0]["unsupported"]
    assert "fk._fused_linear_cross_entropy_forward" in msg and "sharding strategy" in msg, msg


def test_tensor_parallel_head_refuses_the_fused_loss_clearly(results):
    msg = results[0]["tensor_parallel_head"]
    assert "needs the full lm_head weight" in msg and "Shard(dim=0)" in msg, msg
    assert "fused_linear_cross_entropy=False" in msg
