"""Checked patching (apply_fk on model types outside the table, or strict=False): modules
found by what they are, patched only when their own forward and fk's agree; report();
AutoFkModelForCausalLM and the Trainer."""
import copy
import time
import types

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_causal_lm, tiny_hf_model

transformers = pytest.importorskip("transformers")
import fk.transformers as ft  # noqa: E402
from fk.transformers import _verify  # noqa: E402


# --- modules, genuine and altered ---------------------------------------------------------

class RMSNorm(torch.nn.Module):
    """Llama's RMSNorm; ``variant`` alters it."""

    def __init__(self, dim=32, eps=1e-6, variant="llama"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps
        self.variant = variant
        if variant == "bias":
            self.bias = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        var = h.pow(2).mean(-1, keepdim=True)
        if self.variant == "eps_outside":
            h = h / (var.sqrt() + self.variance_epsilon)
        elif self.variant == "eps_fixed":  # ignores its eps attribute
            h = h * torch.rsqrt(var + 1e-5)
        else:
            h = h * torch.rsqrt(var + self.variance_epsilon)
        if self.variant == "gemma":  # (1 + weight), float32 throughout
            return (h * (1.0 + self.weight.float())).to(dtype)
        if self.variant == "half_offset":  # an offset fk has not
            return (h * (0.5 + self.weight.float())).to(dtype)
        y = self.weight * h.to(dtype)
        if self.variant == "bias":
            y = y + self.bias
        return y


class MLP(torch.nn.Module):
    """A gated MLP; ``variant`` alters it."""

    def __init__(self, dim=32, inter=48, act="silu", variant="plain", dropout=0.0):
        super().__init__()
        self.gate_proj = torch.nn.Linear(dim, inter, bias=False)
        self.up_proj = torch.nn.Linear(dim, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, dim, bias=False)
        self.act_fn = {"silu": torch.nn.SiLU(), "gelu_tanh": torch.nn.GELU("tanh"),
                       "gelu": torch.nn.GELU()}[act]
        self.variant = variant
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x):
        g, u = self.gate_proj(x), self.up_proj(x)
        if self.variant == "clamped":
            h = self.act_fn(g.clamp(max=2.0)) * u
        elif self.variant == "swapped":
            h = self.act_fn(u) * g
        else:
            h = self.act_fn(g) * u
        return self.dropout(self.down_proj(h))


class Toy(torch.nn.Module):
    """Modules applied one after the other, as a model of a type no table names."""

    def __init__(self, *mods):
        super().__init__()
        self.config = types.SimpleNamespace(model_type="toy")
        self.layers = torch.nn.ModuleList(mods)

    def forward(self, x):
        for m in self.layers:
            x = m(x)
        return x


def _perturb(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def _out_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(3)  # the same dropout masks for both
    y = model(x)
    y.square().sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


def _assert_same(model, ref, x, rtol=1e-5, atol=1e-5):
    """Output and gradients equal, ``atol`` relative to each reference's largest value."""
    y, gx, gp = _out_and_grads(model, x)
    ry, rgx, rgp = _out_and_grads(ref, x)
    for name, got, want in [("output", y, ry), ("input grad", gx, rgx),
                            *((n, gp[n], rgp[n]) for n in rgp)]:
        torch.testing.assert_close(got, want, rtol=rtol,
                                   atol=atol * want.abs().max().item(), msg=name)


@pytest.fixture(autouse=True)
def _fresh_cache():
    _verify._CACHE.clear()
    yield


GENUINE = [(RMSNorm(), "rms_norm", "llama"), (RMSNorm(variant="gemma"), "rms_norm", "gemma"),
           (MLP(), "swiglu", "swiglu"), (MLP(act="gelu_tanh"), "geglu", "geglu_tanh"),
           (MLP(act="gelu"), "geglu", "geglu_none")]
ALTERED = [RMSNorm(variant="eps_outside"), RMSNorm(variant="eps_fixed"),
           RMSNorm(variant="half_offset"), RMSNorm(variant="bias"), MLP(variant="clamped"),
           MLP(variant="swapped"), MLP(dropout=0.1)]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("i", range(len(GENUINE)))
def test_genuine_modules_are_patched_and_match(i, dtype, device):
    module, kind, variant = GENUINE[i]
    ref = _perturb(Toy(copy.deepcopy(module))).to(device, dtype)
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    assert ft.patched(model) == {kind: 1}
    (entry,) = ft.report(model).by_status("patched")
    assert entry.kind == kind and entry.detail.startswith(variant + ","), entry
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    _assert_same(model, ref, x, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("i", range(len(ALTERED)))
def test_altered_modules_are_rejected_and_keep_their_code(i, device):
    ref = _perturb(Toy(copy.deepcopy(ALTERED[i]))).to(device)
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    assert ft.patched(model) == {}
    assert "forward" not in model.layers[0].__dict__
    (entry,) = ft.report(model).by_status("rejected")
    assert entry.name == "layers.0" and "tolerance" in entry.detail, entry
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1)).to(device) * 20
    _assert_same(model, ref, x, rtol=0, atol=0)


def test_an_altered_module_next_to_genuine_ones():
    ref = _perturb(Toy(RMSNorm(), MLP(variant="clamped"), RMSNorm(), MLP()))
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    assert ft.patched(model) == {"rms_norm": 2, "swiglu": 1}
    assert "forward" not in model.layers[1].__dict__
    _assert_same(model, ref, torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2)))
    assert ft.revert_fk(model) is model and ft.patched(model) == {}
    assert ft.report(model).by_status("patched") == []


class GatedRMSNorm(RMSNorm):
    """An RMSNorm with an optional gate input: fk's forward takes one input, so it stays."""

    def forward(self, x, gate=None):
        y = super().forward(x)
        return y if gate is None else y * F.silu(gate)


def test_module_with_a_second_input_is_left_alone():
    model = Toy(GatedRMSNorm())
    ft.apply_fk(model)
    assert ft.patched(model) == {}
    (entry,) = ft.report(model)
    assert entry.status == "not recognized" and "more than one input" in entry.detail


class NamedRMSNorm(RMSNorm):
    def forward(self, hidden_states):
        return super().forward(hidden_states)


class NamedMLP(MLP):
    def forward(self, hidden_states):
        return super().forward(hidden_states)


class CallsByName(Toy):
    def forward(self, x):
        for m in self.layers:
            x = m(hidden_states=x)
        return x


def test_patched_module_takes_its_input_by_name():
    ref = _perturb(CallsByName(NamedRMSNorm(), NamedMLP()))
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    assert ft.patched(model) == {"rms_norm": 1, "swiglu": 1}
    _assert_same(model, ref, torch.randn(2, 5, 32))


def test_tiled_mlp_option_on_a_checked_mlp():
    ref = _perturb(Toy(MLP(), MLP(act="gelu_tanh")))
    model = copy.deepcopy(ref)
    ft.apply_fk(model, tiled_mlp=True, num_shards=2)
    assert ft.patched(model) == {"tiled_mlp": 2}
    _assert_same(model, ref, torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(4)))


def test_report_of_a_table_model():
    model = ft.apply_fk(tiny_hf_model("phi"))
    report = ft.report(model)
    assert {e.detail for e in report.by_status("patched")} == {"table (phi)"}
    assert len(report.by_status("patched")) == sum(ft.patched(model).values())
    unrecognized = {e.cls for e in report.by_status("not recognized")}
    assert "PhiMLP" in unrecognized  # no gate: Hugging Face's
    assert "PhiAttention" not in unrecognized  # its rotary embedding is patched
    assert "patched:" in str(report) and "not recognized:" in str(report)


def test_switched_off_kinds_are_not_checked():
    model = _perturb(Toy(RMSNorm(), MLP()))
    ft.apply_fk(model, rms_norm=False, layer_norm=False, swiglu=False)
    assert ft.patched(model) == {}
    assert [(e.cls, e.status) for e in ft.report(model)] == [("RMSNorm", "off"),
                                                             ("MLP", "off")]
    model = Toy(MLP(), MLP(act="gelu").requires_grad_())
    model.layers[1].act_fn = torch.nn.ReLU()
    ft.apply_fk(model)
    assert [(e.status, e.kind) for e in ft.report(model)] == [("patched", "swiglu"),
                                                              ("not recognized", "swiglu/geglu")]


def test_patching_under_no_grad_and_autocast_still_checks():
    ref = _perturb(Toy(RMSNorm(), MLP(variant="swapped")))
    model = copy.deepcopy(ref)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ft.apply_fk(model)
    assert ft.patched(model) == {"rms_norm": 1}
    assert [e.status for e in ft.report(model)] == ["patched", "rejected"]


@pytest.mark.parametrize("chunk", [1 << 22, 1])
def test_comparison_of_non_finite_values(chunk, monkeypatch):
    monkeypatch.setattr(_verify, "_CHUNK", chunk)  # 1: every element a chunk of its own
    inf, nan = float("inf"), float("nan")
    want = torch.tensor([1.0, inf, -inf, 2.0])
    assert _verify._diff(want.clone(), want, "x") == 0.0
    for got in ([1.0, inf, inf, 2.0], [1.0, 3.0, -inf, 2.0], [nan, inf, -inf, 2.0]):
        with pytest.raises(_verify.Mismatch):
            _verify._diff(torch.tensor(got), want, "x")
    with pytest.raises(_verify.Mismatch, match="differs by"):
        _verify._diff(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0]), "x")
    with pytest.raises(_verify.Mismatch, match="differs by"):
        _verify._diff(torch.tensor([1.0, 2.001]), torch.tensor([1.0, 2.0]), "x")
    assert _verify._diff(torch.tensor([1.0, 2.00001]), torch.tensor([1.0, 2.0]), "x") <= 1


def test_checked_once_per_class_and_configuration(monkeypatch):
    calls = []
    choose = _verify._choose
    monkeypatch.setattr(_verify, "_choose", lambda m, *a: calls.append(type(m)) or choose(m, *a))
    layers = [RMSNorm() if i % 2 == 0 else MLP() for i in range(16)]
    layers += [RMSNorm(eps=1e-5), RMSNorm(dim=32, variant="gemma")]
    model = _perturb(Toy(*layers))
    ft.apply_fk(model)
    # RMSNorm (eps 1e-6), RMSNorm (eps 1e-5), RMSNorm (gemma), MLP: four checks for 18 modules
    assert len(calls) == 4
    assert ft.patched(model) == {"rms_norm": 10, "swiglu": 8}


# --- Hugging Face models outside the table ------------------------------------------------

UNKNOWN = "helium"  # Llama-like, not in the table


def test_model_type_outside_the_table_is_patched_checked():
    assert UNKNOWN not in ft.SUPPORTED_MODEL_TYPES
    ref = tiny_causal_lm(UNKNOWN)
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    assert ft.patched(model) == {"rms_norm": 3, "swiglu": 1, "fused_linear_cross_entropy": 1,
                                 "cross_entropy": 1}
    text = str(ft.report(model))
    assert "HeliumAttention" in text and "not recognized" in text
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :3] = -100
    for m in (model, ref):
        m.train()
        m.zero_grad(set_to_none=True)
        m(input_ids=ids, labels=labels).loss.backward()
    out = model(input_ids=ids, labels=labels)
    assert out.logits is None  # the fused loss
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)
    with pytest.raises(ValueError, match="not supported.*strict=False"):
        ft.apply_fk(copy.deepcopy(ref), strict=True)


def test_head_with_a_different_loss_is_rejected():
    """A model whose forward scales its logits where fk's does not (config values it does
    not know): its head keeps its code."""
    ref = tiny_causal_lm(UNKNOWN)
    cls = type(ref)

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        out = cls.forward(self, input_ids, attention_mask, labels=labels, **kwargs)
        if out.loss is not None:
            out.loss = out.loss * 1.5
        return out

    odd = type("OddForCausalLM", (cls,), {"forward": forward})
    ref.__class__ = odd
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    rejected = {e.kind: e.detail for e in ft.report(model).by_status("rejected")}
    assert set(rejected) == {"fused_linear_cross_entropy"}
    assert rejected["fused_linear_cross_entropy"].startswith("loss: differs")
    # fk's cross entropy in place of the loss function the forward calls: the same loss
    assert ft.patched(model)["cross_entropy"] == 1
    assert "fused_linear_cross_entropy" not in ft.patched(model)
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    model.train(), ref.train()
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss,
                               ref(input_ids=ids, labels=ids).loss)


def test_strict_false_on_a_table_model_adds_checked_modules():
    ref = tiny_hf_model("llama")
    ref.model.extra = RMSNorm(dim=64, variant="gemma")  # not a class the table names
    model = copy.deepcopy(ref)
    ft.apply_fk(model)
    assert "forward" not in model.model.extra.__dict__
    ft.apply_fk(model, strict=False)
    assert "forward" in model.model.extra.__dict__
    assert ft.patched(model)["rms_norm"] == 6
    statuses = {(e.cls, e.detail.split(",")[0]) for e in ft.report(model).by_status("patched")}
    assert ("RMSNorm", "gemma") in statuses and ("LlamaRMSNorm", "table (llama)") in statuses


def test_check_cost_of_a_many_layer_model(monkeypatch):
    """32 layers (an 8B model's count): each kind of module is checked once, so patching
    runs the checks a 1-layer model runs (counted; the time is printed, not asserted)."""
    calls = []
    choose = _verify._choose
    monkeypatch.setattr(_verify, "_choose",
                        lambda m, *a: calls.append(type(m).__name__) or choose(m, *a))
    checks = {}
    for layers in (1, 32):
        config = copy.deepcopy(tiny_causal_lm(UNKNOWN).config)
        config.num_hidden_layers = layers
        model = transformers.AutoModelForCausalLM.from_config(config)
        _verify._CACHE.clear()
        calls.clear()
        t = time.perf_counter()
        ft.apply_fk(model)
        print(f"apply_fk with checks, {layers} layers: {time.perf_counter() - t:.3f} s")
        checks[layers] = sorted(calls)
    assert ft.patched(model) == {"rms_norm": 65, "swiglu": 32, "fused_linear_cross_entropy": 1,
                                 "cross_entropy": 1}
    assert checks[1] and checks[32] == checks[1]


@pytest.mark.cuda
def test_check_cost_of_an_8b_shaped_model_on_cuda():
    """Llama-3-8B's shapes (hidden 4096, MLP 14336, vocab 128256) in bfloat16, 2 layers:
    the checks (one per kind of module, the head with its real weight) take well under a
    second once CUDA is initialised."""
    ft.apply_fk(tiny_causal_lm(UNKNOWN).cuda())  # CUDA, cuBLAS and fk's kernels loaded
    config = transformers.CONFIG_MAPPING[UNKNOWN](
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    _verify._CACHE.clear()
    torch.cuda.synchronize()
    t = time.perf_counter()
    ft.apply_fk(model)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    print(f"apply_fk with checks, 8B shapes on {torch.cuda.get_device_name()}: {elapsed:.3f} s")
    assert ft.patched(model) == {"rms_norm": 5, "swiglu": 2, "fused_linear_cross_entropy": 1,
                                 "cross_entropy": 1}
    assert elapsed < 1.0


# --- every causal-LM model type transformers can build tiny --------------------------------

def _causal_lm_types():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@pytest.mark.parametrize("model_type", _causal_lm_types())
def test_every_causal_lm_type_keeps_its_numerics(model_type):
    """apply_fk(strict=False) on each model type's tiny model: the training loss and every
    parameter's gradient are the unpatched model's within float32 tolerance (dropout on where
    the config has it: the same seed gives the same masks)."""
    try:
        ref = tiny_causal_lm(model_type)
    except Exception as e:  # noqa: BLE001 - the model's own construction, not fk's
        pytest.skip(f"{model_type} does not build tiny: {type(e).__name__}: {str(e)[:120]}")
    head = ref.get_output_embeddings()
    vocab = head.weight.shape[0] if head is not None else 64
    ids = torch.randint(3, min(vocab, 64), (1, 8), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :2] = -100

    def run(m):
        m.train()
        m.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        out = m(input_ids=ids, labels=labels)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad for n, p in m.named_parameters()
                                   if p.grad is not None}

    try:
        with torch.no_grad():  # some models settle their configuration on the first call
            ref.train()
            ref(input_ids=ids, labels=labels)
        want, want_grads = run(ref)
        model = copy.deepcopy(ref)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"{model_type} does not run tiny: {type(e).__name__}: {str(e)[:120]}")
    ft.apply_fk(model, strict=False)
    loss, grads = run(model)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert grads.keys() == want_grads.keys()
    for n in want_grads:
        torch.testing.assert_close(grads[n], want_grads[n], rtol=1e-4, atol=1e-6, msg=n)


# --- patching on load, and with the Trainer ----------------------------------------------

@pytest.fixture
def saved_model(tmp_path):
    model = tiny_hf_model("llama")
    model.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny", model


def test_auto_class_patches_on_load(saved_model):
    path, ref = saved_model
    model = ft.AutoFkModelForCausalLM.from_pretrained(path, swiglu=False)
    assert isinstance(model, type(ref))
    assert "swiglu" not in ft.patched(model) and ft.patched(model)["rms_norm"] == 5
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    model = ft.AutoFkModelForCausalLM.from_config(ref.config)
    assert ft.patched(model)["swiglu"] == 2
    config = tiny_causal_lm(UNKNOWN).config
    assert ft.patched(ft.AutoFkModelForCausalLM.from_config(config))["swiglu"] == 1
    with pytest.raises(EnvironmentError):
        ft.AutoFkModelForCausalLM()


def _dataset(n=16, seq=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 96, (n, seq), generator=g)
    return [{"input_ids": i, "labels": i.clone()} for i in ids]


def _train(model, tmp_path, callbacks=()):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
        seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_dataset(),
                                   callbacks=list(callbacks))
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_trainer_with_auto_class_and_with_callback(saved_model, tmp_path):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    path, _ = saved_model
    plain = _train(transformers.AutoModelForCausalLM.from_pretrained(path), tmp_path / "a")
    model = ft.AutoFkModelForCausalLM.from_pretrained(path)
    loaded = _train(model, tmp_path / "b")
    assert ft.patched(model)["fused_linear_cross_entropy"] == 1
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    called = _train(model, tmp_path / "c", [ft.FkCallback(rope=False)])
    assert ft.patched(model)["rms_norm"] == 5 and "rope" not in ft.patched(model)
    assert len(plain) == 4
    torch.testing.assert_close(loaded, plain, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(called, plain, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError):
        ft.FkCallback(no_such_option=True)
