"""fk.transformers.apply_fk(model, tiled_mlp=True): the gate / up / down MLPs run as the tiled
MLP on their own parameters; same loss and gradients as the unpatched model, exact revert."""
import copy

import pytest
import torch

from helpers import HF_MODEL_TYPES, tiny_hf_model

transformers = pytest.importorskip("transformers")
import fk.transformers as ft  # noqa: E402

# the model types whose MLP is a gate_proj / up_proj / down_proj module (not Phi-3's stacked
# one, not Mixtral's experts only)
DENSE = [t for t in HF_MODEL_TYPES if t not in ("phi3", "mixtral")]


def _batch(batch=2, seq=12, vocab=96, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return ids, ids.clone()


def _loss_and_grads(model, ids, labels):
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


def _mlp_count(model):
    return sum(1 for m in model.modules() if type(m).__name__.endswith("MLP"))


@pytest.mark.parametrize("model_type", DENSE)
@pytest.mark.parametrize("num_shards", [None, 5])
def test_same_loss_and_gradients(model_type, num_shards):
    ref = tiny_hf_model(model_type)
    model = copy.deepcopy(ref)
    ft.apply_fk(model, tiled_mlp=True, num_shards=num_shards)
    counts = ft.patched(model)
    assert counts["tiled_mlp"] == _mlp_count(model)
    # the tiled MLP takes the gate's place on the MLPs; MoE experts keep the gate
    experts = sum(1 for m in model.modules() if type(m).__name__.endswith("Experts"))
    assert counts.get("swiglu", 0) + counts.get("geglu", 0) == experts
    ids, labels = _batch()
    loss_ref, grads_ref = _loss_and_grads(ref, ids, labels)
    loss, grads = _loss_and_grads(model, ids, labels)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    assert grads.keys() == grads_ref.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], grads_ref[n], rtol=1e-4, atol=1e-6, msg=n)


def test_mlp_bias_and_only_the_mlp():
    ref = tiny_hf_model("llama", mlp_bias=True)
    model = copy.deepcopy(ref)
    ft.apply_fk(model, rms_norm=False, rope=False, swiglu=False, cross_entropy=False,
                fused_linear_cross_entropy=False, tiled_mlp=True, num_shards=3)
    assert ft.patched(model) == {"tiled_mlp": 2}
    ids, labels = _batch()
    loss_ref, grads_ref = _loss_and_grads(ref, ids, labels)
    loss, grads = _loss_and_grads(model, ids, labels)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    assert any("mlp.gate_proj.bias" in n for n in grads)
    for n in grads:
        torch.testing.assert_close(grads[n], grads_ref[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("model_type", ["llama", "gemma"])
def test_weights_shared_and_revert_exact(model_type):
    model = tiny_hf_model(model_type).eval()
    before = {name: dict(m.__dict__) for name, m in model.named_modules()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ft.apply_fk(model, tiled_mlp=True, num_shards=4)
    mlp = model.model.layers[0].mlp
    # the patched forward reads the module's own parameters: an update shows at once
    ids, _ = _batch()
    with torch.no_grad():
        out1 = model(input_ids=ids).logits
        mlp.down_proj.weight.mul_(2)
        out2 = model(input_ids=ids).logits
        mlp.down_proj.weight.div_(2)
    assert not torch.allclose(out1, out2)
    ft.revert_fk(model)
    assert ft.patched(model) == {}
    assert {name: dict(m.__dict__) for name, m in model.named_modules()} == before
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k])


def test_default_is_off_and_repatch():
    model = tiny_hf_model("llama")
    ft.apply_fk(model)
    assert "tiled_mlp" not in ft.patched(model) and "swiglu" in ft.patched(model)
    ft.apply_fk(model, tiled_mlp=True)
    assert "tiled_mlp" in ft.patched(model) and "swiglu" not in ft.patched(model)
    ft.apply_fk(model)
    assert "tiled_mlp" not in ft.patched(model)
