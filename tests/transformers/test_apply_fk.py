"""fk.transformers.apply_fk / revert_fk: what is patched, per instance and reversibly, the
causal-LM loss conventions, generation, and clear errors."""
import collections
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import HF_MODEL_TYPES, HF_MORE_MODEL_TYPES, tiny_hf_model

transformers = pytest.importorskip("transformers")
import fk.transformers as ft  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


class FkOps(TorchDispatchMode):
    """Counts the fk operators that run."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "fk":
            self.count[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _batch(device="cpu", batch=2, seq=12, vocab=96, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    labels = ids.clone()
    labels[0, :2] = -100
    return ids, labels


def _module_state(model):
    return {name: dict(m.__dict__) for name, m in model.named_modules()}


def _expected_kinds(model, model_type):
    """What apply_fk should replace in a tiny model, counted from the model's own classes."""
    names = collections.Counter(type(m).__name__ for m in model.modules())
    gate = "geglu" if model_type.startswith("gemma") else "swiglu"
    mlps = sum(n for c, n in names.items() if c.endswith("MLP") or c.endswith("Experts"))
    return {"rms_norm": sum(n for c, n in names.items() if c.endswith("RMSNorm")),
            "rope": sum(n for c, n in names.items() if c.endswith("Attention")),
            gate: mlps, "fused_linear_cross_entropy": 1, "cross_entropy": 1}


@pytest.mark.parametrize("model_type", HF_MODEL_TYPES)
def test_patches_every_module_and_kernels_run(model_type):
    model = tiny_hf_model(model_type)
    ft.apply_fk(model)
    expected = _expected_kinds(model, model_type)
    assert ft.patched(model) == expected
    ids, labels = _batch()
    model.train()
    with FkOps() as ops:
        model(input_ids=ids, labels=labels).loss.backward()
    gate = "geglu" if model_type.startswith("gemma") else "swiglu"
    assert ops.count["_rms_norm_forward"] == expected["rms_norm"]
    assert ops.count["_rms_norm_backward"] == expected["rms_norm"]
    assert ops.count["rope"] == expected["rope"]
    assert ops.count[gate] >= 1  # MoE experts run once per expert that received tokens
    assert ops.count["_fused_linear_cross_entropy_forward"] == 1


# What apply_fk replaces in the tiny models of HF_MORE_MODEL_TYPES (2 layers), besides the
# loss (fused_linear_cross_entropy and cross_entropy, one each). Left unpatched: Phi's and
# StarCoder 2's MLPs (no gate) and Cohere's q / k norms (a weight per head).
MORE_EXPECTED = {
    "glm": dict(rms_norm=5, rope=2, swiglu=2),
    "glm4": dict(rms_norm=9, rope=2, swiglu=2),
    "olmo": dict(layer_norm=5, rope=2, swiglu=2),
    "olmo3": dict(rms_norm=9, rope=2, swiglu=2),
    "smollm3": dict(rms_norm=5, rope=2, swiglu=2),
    "phi": dict(layer_norm=7, rope=2),
    "starcoder2": dict(layer_norm=5, rope=2),
    "cohere": dict(layer_norm=3, rope=2, swiglu=2),
    "cohere2": dict(layer_norm=3, rope=2, swiglu=2),
    "exaone4": dict(rms_norm=9, rope=2, swiglu=2),
    "ernie4_5": dict(rms_norm=5, rope=2, swiglu=2),
    "hunyuan_v1_dense": dict(rms_norm=9, rope=2, swiglu=2),
    "seed_oss": dict(rms_norm=5, rope=2, swiglu=2),
    # GPT-OSS: its clamped experts stay Hugging Face's.
    "gpt_oss": dict(rms_norm=5, rope=2),
    # DeepSeek-V3: 4 norms a layer (with q_a / kv_a); a dense MLP, a shared expert, experts.
    "deepseek_v3": dict(rms_norm=9, rope=2, swiglu=3),
    "granitemoe": dict(rms_norm=5, rope=2, swiglu=2),
    # Qwen3-Next: one full-attention layer (q / k norms), the gated delta-net layer left;
    # a shared expert and the experts in each layer.
    "qwen3_next": dict(rms_norm=7, rope=1, swiglu=4),
    "falcon_h1": dict(rms_norm=5, rope=2, swiglu=2),
    # Llama 4: the L2Norm of the rotary layer (one module for q and k); the shared expert
    # and the routed experts of each layer.
    "llama4_text": dict(rms_norm=6, rope=2, swiglu=4),
}
# Layers applying rotary (SmolLM 3's, EXAONE 4's, Cohere 2's and Llama 4's tiny configs have a
# NoPE one).
MORE_ROPE_LAYERS = {"smollm3": 1, "exaone4": 1, "cohere2": 1, "llama4_text": 1}
# fk's rotary op where it is not fk.rope.
ROPE_OP = {"llama4_text": "llama4_rope"}
# RMSNorm kernel launches where a module runs more than once (Llama 4's q / k L2Norm).
MORE_NORM_CALLS = {"llama4_text": 7}
# MoE experts run the gate once per expert that received tokens.
MORE_MOE = ("deepseek_v3", "granitemoe", "qwen3_next")


@pytest.mark.parametrize("model_type", HF_MORE_MODEL_TYPES)
def test_more_models_patch_what_they_should_and_kernels_run(model_type):
    model = tiny_hf_model(model_type)
    ft.apply_fk(model)
    expected = dict(MORE_EXPECTED[model_type], fused_linear_cross_entropy=1, cross_entropy=1)
    assert ft.patched(model) == expected
    ids, labels = _batch()
    model.train()
    with FkOps() as ops:
        model(input_ids=ids, labels=labels).loss.backward()
    norms = MORE_NORM_CALLS.get(model_type, expected.get("rms_norm", 0))
    assert ops.count["_rms_norm_forward"] == norms
    assert ops.count["_rms_norm_backward"] == norms
    assert ops.count["_layer_norm_forward"] == expected.get("layer_norm", 0)
    assert ops.count[ROPE_OP.get(model_type, "rope")] == MORE_ROPE_LAYERS.get(
        model_type, expected["rope"])
    if model_type in MORE_MOE:
        assert ops.count["swiglu"] >= expected["swiglu"]
    else:
        assert ops.count["swiglu"] == expected.get("swiglu", 0)
    assert ops.count["geglu"] == 0
    assert ops.count["_fused_linear_cross_entropy_forward"] == 1


MORE_DROPOUT = {"seed_oss": dict(attention_dropout=0.1, residual_dropout=0.1)}


def _loss_and_grads(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels, **kw).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("model_type", HF_MORE_MODEL_TYPES)
def test_more_models_same_loss_gradients_and_logits(model_type):
    """float32 on the CPU: the patched model's training loss and every parameter's gradient
    are Hugging Face's, and so are its eval logits and loss. Dropout (Seed-OSS's, inside the
    MLP fk replaces) is on where the model has it: the same seed gives the same masks."""
    model, ref = _pair(model_type, **MORE_DROPOUT.get(model_type, {}))
    ids, labels = _batch()
    model.train(), ref.train()
    torch.manual_seed(11)
    loss, grads = _loss_and_grads(model, ids, labels)
    torch.manual_seed(11)
    want, want_grads = _loss_and_grads(ref, ids, labels)
    torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-5)
    assert grads.keys() == want_grads.keys()
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=1e-6, rtol=1e-4,
                                   msg=name)
    model.eval(), ref.eval()
    with torch.no_grad():
        out, ref_out = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, ref_out.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, ref_out.loss, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("model_type", ["seed_oss", "olmo", "cohere", "exaone4"])
def test_more_models_tiled_mlp(model_type):
    """tiled_mlp=True on gate / up / down MLPs of the added model types (Seed-OSS's with its
    output dropout): the same loss and gradients."""
    model, ref = _pair(model_type, **MORE_DROPOUT.get(model_type, {}))
    ft.apply_fk(model, tiled_mlp=True, num_shards=3)
    kinds = ft.patched(model)
    assert kinds["tiled_mlp"] == 2 and "swiglu" not in kinds
    ids, labels = _batch()
    model.train(), ref.train()
    torch.manual_seed(5)
    loss, grads = _loss_and_grads(model, ids, labels)
    torch.manual_seed(5)
    want, want_grads = _loss_and_grads(ref, ids, labels)
    torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-5)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=1e-6, rtol=1e-4,
                                   msg=name)


@pytest.mark.parametrize("model_type", HF_MODEL_TYPES + HF_MORE_MODEL_TYPES)
def test_revert_restores_the_model_exactly(model_type):
    model = tiny_hf_model(model_type)
    pristine = copy.deepcopy(model)
    before = _module_state(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ft.apply_fk(model)
    assert _module_state(model) != before
    ft.revert_fk(model)
    after = _module_state(model)
    assert after.keys() == before.keys()
    for name in before:  # the very same attribute objects, no extra attributes
        assert after[name].keys() == before[name].keys(), name
        assert all(after[name][k] is before[name][k] for k in before[name]), name
    assert ft.patched(model) == {}
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    ids, labels = _batch()
    model.train(), pristine.train()
    out, ref = model(input_ids=ids, labels=labels), pristine(input_ids=ids, labels=labels)
    assert torch.equal(out.loss, ref.loss) and torch.equal(out.logits, ref.logits)


def test_patching_twice_is_patching_once():
    once, twice = tiny_hf_model("qwen3"), tiny_hf_model("qwen3")
    ft.apply_fk(once)
    ft.apply_fk(twice)
    ft.apply_fk(twice)
    assert ft.patched(twice) == ft.patched(once)
    ids, labels = _batch()
    once.train(), twice.train()
    assert torch.equal(twice(input_ids=ids, labels=labels).loss,
                       once(input_ids=ids, labels=labels).loss)
    ft.revert_fk(twice)  # one revert undoes both
    assert ft.patched(twice) == {}
    assert all("forward" not in m.__dict__ for m in twice.modules())
    ft.revert_fk(twice)  # harmless on an unpatched model


def test_patching_again_with_other_options_replaces_the_first():
    model = tiny_hf_model("llama")
    ft.apply_fk(model)
    ft.apply_fk(model, rope=False, swiglu=False)
    kinds = ft.patched(model)
    assert "rope" not in kinds and "swiglu" not in kinds and kinds["rms_norm"] == 5


def test_only_the_given_instance_is_patched():
    a, b = tiny_hf_model("llama"), tiny_hf_model("llama")
    ft.apply_fk(a)
    assert ft.patched(b) == {}
    ids, labels = _batch()
    b.train()
    with FkOps() as ops:
        out = b(input_ids=ids, labels=labels)
    assert not ops.count and out.logits is not None


@pytest.mark.parametrize("option", ft.KINDS)
def test_each_option_switches_its_kind_off(option):
    model_type = {"geglu": "gemma", "layer_norm": "llama"}.get(option, "llama")
    model = tiny_hf_model(model_type)
    if option == "layer_norm":  # none of the supported models has one: add one
        model.model.extra_norm = torch.nn.LayerNorm(64)
    ft.apply_fk(model)
    assert option in ft.patched(model)
    ft.apply_fk(model, **{option: False})
    assert option not in ft.patched(model)


def test_layer_norm_modules_run_fk():
    model = tiny_hf_model("llama")
    model.model.extra_norm = torch.nn.LayerNorm(64)
    ft.apply_fk(model)
    x = torch.randn(3, 64)
    with FkOps() as ops:
        y = model.model.extra_norm(x)
    assert ops.count["layer_norm"] + ops.count["_layer_norm_forward"] >= 1
    torch.testing.assert_close(y, F.layer_norm(x, (64,), model.model.extra_norm.weight,
                                               model.model.extra_norm.bias))


def test_unsupported_model_type_names_the_supported_ones():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    model = transformers.GPT2LMHeadModel(config)
    with pytest.raises(ValueError) as e:
        ft.apply_fk(model, strict=True)
    msg = str(e.value)
    assert "'gpt2' is not supported" in msg
    assert all(t in msg for t in ft.SUPPORTED_MODEL_TYPES)
    assert ft.patched(model) == {}
    with pytest.raises(ValueError, match="not supported"):
        ft.apply_fk(torch.nn.Linear(2, 2))


# --- the causal-LM loss --------------------------------------------------------------------

def _pair(model_type="llama", **kw):
    ref = tiny_hf_model(model_type, **kw)
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    return model, ref


def test_training_loss_has_no_logits_and_matches():
    model, ref = _pair()
    ids, labels = _batch()
    model.train(), ref.train()
    out, want = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    assert out.logits is None
    torch.testing.assert_close(out.loss, want.loss)
    tup = model(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(tup, tuple)
    torch.testing.assert_close(tup[0], want.loss)


def test_loss_dtype_is_hugging_faces_in_bfloat16():
    """Hugging Face upcasts the logits to float32 before its loss: the patched model's loss
    (fused in training, through fk.cross_entropy in eval) is float32 too."""
    model, ref = _pair()
    model.to(torch.bfloat16), ref.to(torch.bfloat16)
    ids, labels = _batch()
    for train in (True, False):
        model.train(train), ref.train(train)
        with torch.no_grad():
            out, want = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
        assert want.loss.dtype == torch.float32 and out.loss.dtype == want.loss.dtype


def test_eval_returns_logits_and_loss_through_fk_cross_entropy():
    model, ref = _pair()
    ids, labels = _batch()
    model.eval(), ref.eval()
    with torch.no_grad(), FkOps() as ops:
        out = model(input_ids=ids, labels=labels)
    want = ref(input_ids=ids, labels=labels)
    assert ops.count["_cross_entropy_forward"] == 1
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, want.loss)
    # The loss must not have written its gradient into the returned logits.
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=1e-5)


def test_logits_built_when_fused_loss_is_off():
    model, ref = _pair()
    ft.apply_fk(model, fused_linear_cross_entropy=False)
    ids, labels = _batch()
    model.train(), ref.train()
    with FkOps() as ops:
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
    want = ref(input_ids=ids, labels=labels)
    want.loss.backward()
    assert ops.count["_cross_entropy_forward"] == 1 and out.logits is not None
    torch.testing.assert_close(out.loss, want.loss)
    torch.testing.assert_close(model.lm_head.weight.grad, ref.lm_head.weight.grad)


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "granite", "qwen3_moe", "cohere",
                                        "phi", "falcon_h1", "gpt_oss"])
def test_num_items_in_batch_and_shift_labels(model_type):
    model, ref = _pair(model_type)
    ids, labels = _batch()
    model.train(), ref.train()
    n = torch.tensor(7)
    out = model(input_ids=ids, labels=labels, num_items_in_batch=n)
    want = ref(input_ids=ids, labels=labels, num_items_in_batch=n)
    torch.testing.assert_close(out.loss, want.loss)
    out.loss.backward(), want.loss.backward()
    torch.testing.assert_close(model.lm_head.weight.grad, ref.lm_head.weight.grad,
                               atol=1e-6, rtol=1e-5)
    # shift_labels given: the labels are used as they are, not shifted again.
    shift = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    out = model(input_ids=ids, labels=labels, shift_labels=shift)
    want = ref(input_ids=ids, labels=labels, shift_labels=shift)
    torch.testing.assert_close(out.loss, want.loss)


class _FkCalls(TorchDispatchMode):
    """Records the fk operators that run, with their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "fk":
            self.calls.append((func.__name__.split(".")[0], args))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("num_items", [torch.tensor(7), 7])
def test_num_items_in_batch_is_the_mean_denominator(num_items):
    """With the logits built, num_items_in_batch goes to the cross entropy as its
    mean_denominator (reduction "mean"): the loss's backward gets a grad_output of 1 (no
    scaling pass over the gradient); loss and gradients as Hugging Face's."""
    model, ref = _pair()
    ft.apply_fk(model, fused_linear_cross_entropy=False)
    ids, labels = _batch()
    model.train(), ref.train()
    with _FkCalls() as rec:
        out = model(input_ids=ids, labels=labels, num_items_in_batch=num_items)
        out.loss.backward()
    want = ref(input_ids=ids, labels=labels, num_items_in_batch=num_items)
    want.loss.backward()
    fwd = [a for name, a in rec.calls if name == "_cross_entropy_forward"]
    bwd = [a for name, a in rec.calls if name.startswith("_cross_entropy_backward")]
    assert len(fwd) == 1 and len(bwd) == 1
    assert fwd[0][5] == "mean" and float(fwd[0][10]) == 7.0
    assert torch.equal(bwd[0][1], torch.tensor(1.0))
    torch.testing.assert_close(out.loss, want.loss)
    torch.testing.assert_close(model.lm_head.weight.grad, ref.lm_head.weight.grad,
                               atol=1e-6, rtol=1e-5)


def test_logits_to_keep_in_training():
    model, ref = _pair()
    ids, labels = _batch()
    model.train(), ref.train()
    out = model(input_ids=ids, labels=labels[:, -5:], logits_to_keep=5)
    want = ref(input_ids=ids, labels=labels[:, -5:], logits_to_keep=5)
    torch.testing.assert_close(out.loss, want.loss)


def test_moe_router_aux_loss_is_added():
    model, ref = _pair("mixtral")
    ids, labels = _batch()
    model.train(), ref.train()
    out = model(input_ids=ids, labels=labels, output_router_logits=True)
    want = ref(input_ids=ids, labels=labels, output_router_logits=True)
    assert out.aux_loss is not None and out.router_logits is not None
    torch.testing.assert_close(out.aux_loss, want.aux_loss)
    torch.testing.assert_close(out.loss, want.loss)
    no_aux = model(input_ids=ids, labels=labels, output_router_logits=False)
    assert no_aux.aux_loss is None
    torch.testing.assert_close(out.loss - no_aux.loss,
                               model.router_aux_loss_coef * out.aux_loss)


def test_autocast_with_float32_weights():
    """bf16 autocast over a float32 model (what mixed-precision trainers do)."""
    model, ref = _pair("qwen3")
    ids, labels = _batch()
    model.train(), ref.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=labels)
        want = ref(input_ids=ids, labels=labels)
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    torch.testing.assert_close(out.loss, want.loss, atol=3e-2, rtol=0)


# --- generation -----------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe", "gemma2", "phi3", "olmo2"]
                         + list(HF_MORE_MODEL_TYPES))
def test_generate_matches_unpatched(model_type, device):
    model, ref = _pair(model_type)
    model.to(device), ref.to(device)
    for m in (model, ref):  # Hugging Face's router loss fails under generate with a mask
        m.config.output_router_logits = False
    ids = _batch(device, batch=2, seq=5)[0]
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with FkOps() as ops:
        got = model.generate(ids, **kw)
    assert ops.count[ROPE_OP.get(model_type, "rope")] > 0
    assert torch.equal(got, ref.generate(ids, **kw))


def test_torch_compile_of_a_patched_model():
    """torch.compile wraps the model's forward: the patched forwards must be plain functions
    it can trace (fk's ops have Meta kernels)."""
    torch._dynamo.reset()
    model, ref = _pair("qwen3")
    ids, labels = _batch()
    model.train(), ref.train()
    compiled = torch.compile(model)
    out = compiled(input_ids=ids, labels=labels)
    out.loss.backward()
    want = ref(input_ids=ids, labels=labels)
    want.loss.backward()
    assert out.logits is None
    torch.testing.assert_close(out.loss, want.loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4, msg=name)


# --- vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) -----------------

VL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 90, 91, 92, 93

# Per model type: the classes apply_fk replaces (RMSNorms, gated SiLU MLPs, attentions); the
# vision towers' torch LayerNorms are replaced too (the layer_norm kind).
_VL_CLASSES = {
    "qwen2_vl": ("Qwen2VLRMSNorm", ("Qwen2MLP",), "Qwen2VLAttention"),
    "qwen2_5_vl": ("Qwen2_5_VLRMSNorm", ("Qwen2MLP", "Qwen2_5_VLMLP"), "Qwen2_5_VLAttention"),
    "qwen3_vl": ("Qwen3VLTextRMSNorm", ("Qwen3VLTextMLP",), "Qwen3VLTextAttention"),
    "qwen3_vl_moe": ("Qwen3VLMoeTextRMSNorm", ("Qwen3VLMoeTextMLP",), "Qwen3VLMoeTextAttention"),
}
# Left to Hugging Face: the vision attention (its rotary embedding upcasts q and k to float32
# around the rotation), the vision towers' non-gated MLPs, the MoE experts.
_VL_UNPATCHED = {
    "qwen2_vl": ("VisionAttention", "VisionMlp"),
    "qwen2_5_vl": ("Qwen2_5_VLVisionAttention",),
    "qwen3_vl": ("Qwen3VLVisionAttention", "Qwen3VLVisionMLP"),
    "qwen3_vl_moe": ("Qwen3VLMoeVisionAttention", "Qwen3VLMoeVisionMLP",
                     "Qwen3VLMoeTextExperts"),
}


def tiny_vl_model(model_type, seed=0):
    """A randomly initialised ``...ForConditionalGeneration`` of ``model_type``: the language
    model as tiny_hf_model's (2 layers, hidden 64, 4 heads of 16, 2 kv heads, vocab 96) with
    multimodal RoPE sections (2, 3, 3) of the 8 frequencies, a one-block vision tower (patch 2,
    temporal patch 2, merge 2), eager attention."""
    from transformers import AutoModelForImageTextToText, CONFIG_MAPPING
    text = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "mrope_section": [2, 3, 3]},
                bos_token_id=None, eos_token_id=None)
    if model_type == "qwen3_vl_moe":  # one MoE layer, one dense MLP layer
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                    mlp_only_layers=[1], router_aux_loss_coef=0.02)
    vision = dict(depth=1, hidden_size=32, embed_dim=32, num_heads=2, intermediate_size=48,
                  out_hidden_size=64, patch_size=2, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3, in_chans=3,
                  num_position_embeddings=16, deepstack_visual_indexes=[0])
    if model_type == "qwen2_vl":  # Qwen2-VL's vision hidden_size is its output width
        vision["hidden_size"] = 64
    config = CONFIG_MAPPING[model_type](
        text_config=text, vision_config=vision, tie_word_embeddings=False, pad_token_id=0,
        image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norm weights start at 1: perturb them (as tiny_hf_model does)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _vl_inputs(image, device="cpu", batch=2, seq=12, seed=3):
    """Text-only inputs, or each row with one 4 x 4-patch image (4 tokens after the merge)
    after a vision-start token; labels ignore the prompt up to the image's end."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 80, (batch, seq), generator=g)
    labels = ids.clone()
    labels[0, :2] = -100
    kw = {}
    if image:
        ids[:, 1], ids[:, 2:6], ids[:, 6] = VISION_START, IMAGE_TOKEN, VISION_END
        labels = ids.clone()
        labels[:, :7] = -100
        kw = dict(pixel_values=torch.randn(batch * 16, 3 * 2 * 2 * 2, generator=g).to(device),
                  image_grid_thw=torch.tensor([[1, 4, 4]] * batch, device=device),
                  mm_token_type_ids=(ids == IMAGE_TOKEN).int().to(device))
    return dict(input_ids=ids.to(device), labels=labels.to(device), **kw)


def _vl_pair(model_type):
    ref = tiny_vl_model(model_type)
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    return model, ref


def _count(model, names):
    return sum(type(m).__name__ in names for m in model.modules())


def test_vl_model_types_are_supported():
    assert set(VL_MODEL_TYPES) <= set(ft.SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", VL_MODEL_TYPES)
def test_vl_patches_every_module_and_kernels_run(model_type):
    model = tiny_vl_model(model_type)
    ft.apply_fk(model)
    norm, mlps, attention = _VL_CLASSES[model_type]
    expected = {"rms_norm": _count(model, (norm,)), "rope": _count(model, (attention,)),
                "swiglu": _count(model, mlps), "fused_linear_cross_entropy": 1,
                "cross_entropy": 1}
    layer_norms = _count(model, ("LayerNorm",))
    if layer_norms:
        expected["layer_norm"] = layer_norms
    assert ft.patched(model) == expected
    assert expected["rope"] == 2 and expected["rms_norm"] >= 5
    unpatched = _VL_UNPATCHED[model_type]
    assert _count(model, unpatched) >= len(unpatched)
    for m in model.modules():
        if type(m).__name__ in unpatched:
            assert not m.__dict__.keys() & {"forward", "_fk_saved"}, type(m).__name__
    language = model.model.language_model
    text_norms = _count(language, (norm,))
    model.train()
    with FkOps() as ops:  # text only: the vision tower does not run
        model(**_vl_inputs(image=False)).loss.backward()
    assert ops.count["_rms_norm_forward"] == text_norms
    assert ops.count["_rms_norm_backward"] == text_norms
    assert ops.count["rope"] == 2
    assert ops.count["swiglu"] >= 1
    assert ops.count["_fused_linear_cross_entropy_forward"] == 1
    assert ops.count["layer_norm"] + ops.count["_layer_norm_forward"] == 0
    with FkOps() as ops:  # with an image: the vision tower's patched modules run too
        model(**_vl_inputs(image=True)).loss.backward()
    if model_type == "qwen2_5_vl":  # its vision norms and gated MLP are the patched classes
        assert ops.count["_rms_norm_forward"] == expected["rms_norm"]
        assert ops.count["swiglu"] == expected["swiglu"]
    else:
        assert ops.count["_rms_norm_forward"] == text_norms
        assert ops.count["layer_norm"] + ops.count["_layer_norm_forward"] == layer_norms


@pytest.mark.parametrize("image", [False, True], ids=["text", "image"])
@pytest.mark.parametrize("model_type", VL_MODEL_TYPES)
def test_vl_training_loss_and_gradients_match(model_type, image):
    """float32 on the CPU: the patched model's loss and every parameter's gradient against
    Hugging Face's, with the multimodal RoPE positions of an image when one is given."""
    model, ref = _vl_pair(model_type)
    model.train(), ref.train()
    kw = _vl_inputs(image)
    out, want = model(**kw), ref(**kw)
    assert out.logits is None and want.logits is not None
    assert type(out) is type(want)
    if image:  # the image's positions are compressed: multimodal RoPE is exercised
        assert (want.rope_deltas != 0).all()
        assert torch.equal(out.rope_deltas, want.rope_deltas)
    else:
        assert out.rope_deltas is None and want.rope_deltas is None
    torch.testing.assert_close(out.loss, want.loss)
    out.loss.backward(), want.loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4, msg=name)
    tup = model(**kw, return_dict=False)
    assert isinstance(tup, tuple)
    torch.testing.assert_close(tup[0], want.loss)


@pytest.mark.parametrize("model_type", VL_MODEL_TYPES)
def test_vl_revert_restores_the_model_exactly(model_type):
    model = tiny_vl_model(model_type)
    pristine = copy.deepcopy(model)
    before = _module_state(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ft.apply_fk(model)
    assert _module_state(model) != before
    ft.revert_fk(model)
    after = _module_state(model)
    assert after.keys() == before.keys()
    for name in before:
        assert after[name].keys() == before[name].keys(), name
        assert all(after[name][k] is before[name][k] for k in before[name]), name
    assert ft.patched(model) == {}
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    kw = _vl_inputs(image=True)
    model.train(), pristine.train()
    out, ref = model(**kw), pristine(**kw)
    assert torch.equal(out.loss, ref.loss) and torch.equal(out.logits, ref.logits)


@pytest.mark.parametrize("model_type", VL_MODEL_TYPES)
def test_vl_eval_returns_logits_and_loss_through_fk_cross_entropy(model_type):
    model, ref = _vl_pair(model_type)
    model.eval(), ref.eval()
    kw = _vl_inputs(image=True)
    with torch.no_grad(), FkOps() as ops:
        out = model(**kw)
    with torch.no_grad():
        want = ref(**kw)
    assert ops.count["_cross_entropy_forward"] == 1
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, want.loss)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen3_vl"])
def test_vl_num_items_in_batch_and_logits_to_keep(model_type):
    model, ref = _vl_pair(model_type)
    model.train(), ref.train()
    kw = _vl_inputs(image=True)
    n = torch.tensor(7)
    out, want = model(**kw, num_items_in_batch=n), ref(**kw, num_items_in_batch=n)
    torch.testing.assert_close(out.loss, want.loss)
    out.loss.backward(), want.loss.backward()
    torch.testing.assert_close(model.lm_head.weight.grad, ref.lm_head.weight.grad,
                               atol=1e-6, rtol=1e-5)
    kw["labels"] = kw["labels"][:, -5:]
    out, want = model(**kw, logits_to_keep=5), ref(**kw, logits_to_keep=5)
    torch.testing.assert_close(out.loss, want.loss)


def test_vl_moe_router_aux_loss_only_when_asked():
    """Qwen3-VL-MoE adds the router loss only when output_router_logits is passed."""
    model, ref = _vl_pair("qwen3_vl_moe")
    model.train(), ref.train()
    kw = _vl_inputs(image=True)
    out = model(**kw, output_router_logits=True)
    want = ref(**kw, output_router_logits=True)
    assert out.aux_loss is not None and out.router_logits is not None
    torch.testing.assert_close(out.aux_loss, want.aux_loss)
    torch.testing.assert_close(out.loss, want.loss)
    out.loss.backward(), want.loss.backward()
    torch.testing.assert_close(model.model.language_model.layers[0].mlp.gate.weight.grad,
                               ref.model.language_model.layers[0].mlp.gate.weight.grad,
                               atol=1e-6, rtol=1e-4)
    plain, plain_want = model(**kw), ref(**kw)
    assert plain.aux_loss is None and plain_want.aux_loss is None
    torch.testing.assert_close(plain.loss, plain_want.loss)
    torch.testing.assert_close(out.loss - plain.loss,
                               model.config.text_config.router_aux_loss_coef * out.aux_loss)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("image", [False, True], ids=["text", "image"])
@pytest.mark.parametrize("model_type", VL_MODEL_TYPES)
def test_vl_generate_matches_unpatched(model_type, image, device):
    model, ref = _vl_pair(model_type)
    model.to(device), ref.to(device)
    kw = _vl_inputs(image, device, seq=8)
    kw.pop("labels")
    ids = kw.pop("input_ids")
    gen = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
               pad_token_id=0, **kw)
    with FkOps() as ops:
        got = model.generate(ids, **gen)
    assert ops.count["rope"] > 0
    assert torch.equal(got, ref.generate(ids, **gen))


@pytest.mark.parametrize("model_type", VL_MODEL_TYPES)
def test_vl_tiled_mlp(model_type):
    """tiled_mlp=True: the gated MLPs (Qwen2.5-VL's vision MLP too, on (tokens, hidden)
    inputs) run tiled, with the same loss and gradients."""
    ref = tiny_vl_model(model_type)
    model = copy.deepcopy(ref)
    ft.apply_fk(model, tiled_mlp=True)
    kinds = ft.patched(model)
    assert "swiglu" not in kinds
    assert kinds["tiled_mlp"] == _count(model, _VL_CLASSES[model_type][1])
    model.train(), ref.train()
    kw = _vl_inputs(image=True)
    out, want = model(**kw), ref(**kw)
    torch.testing.assert_close(out.loss, want.loss)
    out.loss.backward(), want.loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4, msg=name)


# --- the head: the fused loss runs inside its call (hooks such as FSDP2's run around it) ---

def test_fused_loss_runs_inside_the_head_call():
    model = tiny_hf_model("llama").train()
    ft.apply_fk(model)
    calls = []
    model.lm_head.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append((len(args), "labels" in kwargs)), with_kwargs=True)
    ids, labels = _batch()
    with FkOps() as ops:
        out = model(input_ids=ids, labels=labels)
    assert calls == [(1, True)] and ops.count["_fused_linear_cross_entropy_forward"] == 1
    assert out.logits is None
    # Without labels the head is the plain linear layer.
    x = torch.randn(3, model.config.hidden_size)
    torch.testing.assert_close(model.lm_head(x), F.linear(x, model.lm_head.weight), rtol=0,
                               atol=0)
    ft.revert_fk(model)
    assert "forward" not in model.lm_head.__dict__


def test_a_head_replaced_after_patching_is_read_directly():
    model = tiny_hf_model("llama").train()
    ref = copy.deepcopy(model)
    ft.apply_fk(model)
    model.lm_head = copy.deepcopy(ref.lm_head)  # no fk forward on this one
    ids, labels = _batch()
    with FkOps() as ops:
        loss = model(input_ids=ids, labels=labels).loss
    assert ops.count["_fused_linear_cross_entropy_forward"] == 1
    torch.testing.assert_close(loss, ref(input_ids=ids, labels=labels).loss, rtol=1e-5,
                               atol=1e-6)


def test_a_hook_dropping_the_labels_raises_instead_of_returning_logits():
    model = tiny_hf_model("llama").train()
    ft.apply_fk(model)
    model.lm_head.register_forward_pre_hook(lambda m, args, kwargs: (args, {}),
                                            with_kwargs=True)
    ids, labels = _batch()
    with pytest.raises(RuntimeError, match="dropped the labels"):
        model(input_ids=ids, labels=labels)


# --- Gemma 3, Llava, PaliGemma, Mllama (...ForConditionalGeneration), text inputs -----------

MM_MODEL_TYPES = ("gemma3", "llava", "paligemma", "mllama")
_MM_TEXT = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                head_dim=16, pad_token_id=0, bos_token_id=None, eos_token_id=None)
_MM_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=8, patch_size=2, projection_dim=32)
# What apply_fk replaces (besides the loss): the language model's norms (Gemma 3's projector
# norm too), rotary and gated MLPs; the vision towers' torch LayerNorms. Mllama's second
# layer is a cross-attention layer (no rotary; its q / k norms are patched).
MM_EXPECTED = {
    "gemma3": dict(rms_norm=14, rope=2, geglu=2, layer_norm=4),
    "llava": dict(rms_norm=5, rope=2, swiglu=2, layer_norm=4),
    "paligemma": dict(rms_norm=5, rope=2, geglu=2, layer_norm=4),
    "mllama": dict(rms_norm=7, rope=1, swiglu=2, layer_norm=6),
}
# The norms that run on text inputs: not Gemma 3's projector norm, nor Mllama's
# cross-attention layer (skipped without an image, its MLP too).
MM_NORM_CALLS = {"gemma3": 13, "llava": 5, "paligemma": 5, "mllama": 3}


def tiny_mm_model(model_type, seed=0):
    """A randomly initialised ``...ForConditionalGeneration``: the language model as
    tiny_hf_model's (Llama for Llava, Gemma for PaliGemma), a one-layer vision tower."""
    from transformers import AutoModelForImageTextToText, CONFIG_MAPPING
    cls = CONFIG_MAPPING[model_type]
    if model_type == "gemma3":
        config = cls(text_config=dict(_MM_TEXT, query_pre_attn_scalar=16, sliding_window=8),
                     vision_config=_MM_VISION, mm_tokens_per_image=4, image_token_index=90,
                     boi_token_index=91, eoi_token_index=92)
    elif model_type == "llava":
        config = cls(text_config=dict(_MM_TEXT, model_type="llama"),
                     vision_config=dict(_MM_VISION, model_type="clip_vision_model"),
                     image_token_index=90)
    elif model_type == "paligemma":
        config = cls(text_config=dict(_MM_TEXT, model_type="gemma"),
                     vision_config=dict(_MM_VISION, model_type="siglip_vision_model"),
                     image_token_index=90, projection_dim=64)
    else:
        config = cls(text_config=dict(_MM_TEXT, bos_token_id=1, eos_token_id=2,
                                      cross_attention_layers=[1]),
                     vision_config=dict(hidden_size=32, intermediate_size=48,
                                        num_hidden_layers=1, num_global_layers=1,
                                        attention_heads=2, image_size=8, patch_size=2,
                                        vision_output_dim=64, intermediate_layers_indices=[0],
                                        max_num_tiles=1, supported_aspect_ratios=[[1, 1]]),
                     image_token_index=90)
    config.tie_word_embeddings = False
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _mm_pair(model_type):
    ref = tiny_mm_model(model_type)
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    return model, ref


def _mm_batch(device="cpu", seq=12):
    ids = torch.randint(1, 80, (2, seq), generator=torch.Generator().manual_seed(3)).to(device)
    labels = ids.clone()
    labels[0, :2] = -100
    return ids, labels


def test_mm_model_types_are_supported():
    assert set(MM_MODEL_TYPES) <= set(ft.SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", MM_MODEL_TYPES)
def test_mm_patches_and_matches(model_type):
    """float32 on the CPU, text inputs: what is patched, the fk kernels that run, the loss and
    every parameter's gradient against Hugging Face's, and the eval logits."""
    model, ref = _mm_pair(model_type)
    expected = dict(MM_EXPECTED[model_type], fused_linear_cross_entropy=1, cross_entropy=1)
    assert ft.patched(model) == expected
    ids, labels = _mm_batch()
    model.train(), ref.train()
    with FkOps() as ops:
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
    want = ref(input_ids=ids, labels=labels)
    want.loss.backward()
    assert ops.count["_fused_linear_cross_entropy_forward"] == 1
    assert ops.count["rope"] == expected["rope"]
    assert ops.count["_rms_norm_forward"] == MM_NORM_CALLS[model_type]
    gate = "geglu" if "geglu" in expected else "swiglu"
    assert ops.count[gate] == (1 if model_type == "mllama" else expected[gate])
    assert out.logits is None and type(out) is type(want)
    torch.testing.assert_close(out.loss, want.loss, atol=1e-6, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4, msg=name)
    model.eval(), ref.eval()
    with torch.no_grad():
        out, want = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, want.loss, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("model_type", MM_MODEL_TYPES)
def test_mm_revert_restores_the_model_exactly(model_type):
    model = tiny_mm_model(model_type)
    pristine = copy.deepcopy(model)
    before = _module_state(model)
    ft.apply_fk(model)
    assert _module_state(model) != before
    ft.revert_fk(model)
    after = _module_state(model)
    assert after.keys() == before.keys()
    for name in before:
        assert after[name].keys() == before[name].keys(), name
        assert all(after[name][k] is before[name][k] for k in before[name]), name
    assert ft.patched(model) == {}
    ids, labels = _mm_batch()
    model.train(), pristine.train()
    out, ref = model(input_ids=ids, labels=labels), pristine(input_ids=ids, labels=labels)
    assert torch.equal(out.loss, ref.loss) and torch.equal(out.logits, ref.logits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", MM_MODEL_TYPES)
def test_mm_generate_matches_unpatched(model_type, device):
    model, ref = _mm_pair(model_type)
    model.to(device), ref.to(device)
    ids = _mm_batch(device, seq=5)[0]
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
              pad_token_id=0)
    with FkOps() as ops:
        got = model.generate(ids, **kw)
    assert ops.count["rope"] > 0
    assert torch.equal(got, ref.generate(ids, **kw))


@pytest.mark.parametrize("interleave", [True, False])
def test_deepseek_v3_rotary_with_and_without_interleave(interleave):
    """DeepSeek-V3's MLA rotates q_rot / k_rot with apply_rotary_pos_emb_interleave (pairs
    (2i, 2i+1), de-interleaved out) or plain rotate-half: fk's rope either way."""
    model, ref = _pair("deepseek_v3", rope_interleave=interleave)
    ids, labels = _batch()
    model.train(), ref.train()
    with FkOps() as ops:
        loss, grads = _loss_and_grads(model, ids, labels)
    want, want_grads = _loss_and_grads(ref, ids, labels)
    assert ops.count["rope"] == 2
    torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-5)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=1e-6, rtol=1e-4,
                                   msg=name)


_MM_IMAGE_TOKENS = {"gemma3": 4, "llava": 16, "paligemma": 16, "mllama": 1}


def _mm_image_inputs(model_type):
    """One 8 x 8 image per row: its tokens (90) after the first token, the labels ignoring
    them and the prompt; token_type_ids as the model wants them (Gemma 3: 1 on the image
    tokens; PaliGemma: 0 on the prefix, 1 on the suffix the loss is on); Mllama's one tile,
    its aspect ratio and the cross-attention mask."""
    n = _MM_IMAGE_TOKENS[model_type]
    seq = n + 8
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 80, (2, seq), generator=g)
    ids[:, 1:1 + n] = 90
    labels = ids.clone()
    labels[:, :1 + n] = -100
    kw = dict(input_ids=ids, labels=labels, pixel_values=torch.randn(2, 3, 8, 8, generator=g))
    if model_type == "gemma3":
        kw["token_type_ids"] = (ids == 90).long()
    elif model_type == "paligemma":
        kw["token_type_ids"] = (torch.arange(seq) >= n + 3).long().expand(2, seq)
    elif model_type == "mllama":
        kw.update(pixel_values=kw["pixel_values"][:, None, None],
                  aspect_ratio_ids=torch.ones(2, 1, dtype=torch.long),
                  aspect_ratio_mask=torch.ones(2, 1, 1, dtype=torch.long),
                  cross_attention_mask=torch.ones(2, seq, 1, 1, dtype=torch.long))
    return kw


@pytest.mark.parametrize("model_type", list(_MM_IMAGE_TOKENS))
def test_mm_with_an_image_matches(model_type):
    """With an image: the vision tower's patched LayerNorms run (and Mllama's cross-attention
    layer); loss and every parameter's gradient against Hugging Face's (PaliGemma's and
    Gemma 3's attention masks depend on the labels and token types: passed on to the base
    model as Hugging Face does)."""
    model, ref = _mm_pair(model_type)
    kw = _mm_image_inputs(model_type)
    model.train(), ref.train()
    with FkOps() as ops:
        out = model(**kw)
        out.loss.backward()
    want = ref(**kw)
    want.loss.backward()
    assert ops.count["_layer_norm_forward"] == MM_EXPECTED[model_type]["layer_norm"]
    assert out.logits is None and type(out) is type(want)
    if model_type == "mllama":  # the cross-attention layer runs: every norm, both MLPs
        assert ops.count["_rms_norm_forward"] == MM_EXPECTED["mllama"]["rms_norm"]
        assert ops.count["swiglu"] == 2
    else:
        torch.testing.assert_close(out.image_hidden_states, want.image_hidden_states)
    torch.testing.assert_close(out.loss, want.loss, atol=1e-6, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is None:
            assert p.grad is None, name
            continue
        # atol relative to the gradient's largest value: Gemma 3's projector gradients reach
        # 1e3 here, where float32 sums cancelling to near 0 differ by ~1e-4
        atol = 1e-6 * max(1.0, q.grad.abs().max().item())
        torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=1e-4, msg=name)


def test_llava_around_a_language_model_outside_the_table():
    """Llava's row takes its language model's modules from the text model type's row; for a
    type the table has not (Helium), they are checked (strict None) or left (strict True)."""
    from transformers import AutoModelForImageTextToText, CONFIG_MAPPING
    assert "helium" not in ft.SUPPORTED_MODEL_TYPES
    config = CONFIG_MAPPING["llava"](text_config=dict(_MM_TEXT, model_type="helium"),
                                     vision_config=dict(_MM_VISION,
                                                        model_type="clip_vision_model"),
                                     image_token_index=90)
    config.tie_word_embeddings = False
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model = copy.deepcopy(ref)
    ft.apply_fk(model, strict=True)
    assert ft.patched(model) == dict(fused_linear_cross_entropy=1, cross_entropy=1,
                                     layer_norm=4)
    ft.apply_fk(model)
    assert ft.patched(model) == dict(fused_linear_cross_entropy=1, cross_entropy=1,
                                     layer_norm=4, rms_norm=5, swiglu=2)
    checked = {e.cls for e in ft.report(model).by_status("patched")
               if not e.detail.startswith("table")}
    assert checked == {"HeliumRMSNorm", "HeliumMLP"}
    ids, labels = _mm_batch()
    model.train(), ref.train()
    out, want = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, want.loss, atol=1e-6, rtol=1e-5)
