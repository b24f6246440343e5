"""fk.liger: Liger Kernel's public API on fk. Constructor signatures and defaults are checked
against Liger Kernel 0.8.5's, written down here as data (liger_kernel itself is not a test
dependency); every module and function against fk's own op on the CPU."""
import inspect
import types

import pytest
import torch
import torch.nn.functional as F

import fk
import fk.liger as liger_kernel
from fk.liger.transformers import functional as LF
from helpers import tiny_hf_model

LT = liger_kernel.transformers
EMPTY = inspect.Parameter.empty

# Liger Kernel 0.8.5's constructor arguments and defaults (liger_kernel/transformers/*.py).
LIGER_SIGNATURES = {
    "LigerRMSNorm": dict(hidden_size=EMPTY, eps=1e-6, offset=0.0, casting_mode="llama",
                         init_fn="ones", in_place=True, row_mode=None, elementwise_affine=True),
    "LigerFusedAddRMSNorm": dict(hidden_size=EMPTY, eps=1e-6, offset=0.0, casting_mode="llama",
                                 init_fn="ones", in_place=False),
    "LigerLayerNorm": dict(hidden_size=EMPTY, eps=1e-6, bias=False, init_fn="ones", impl=None,
                           mode=None, backend=None),
    "LigerSwiGLUMLP": dict(config=EMPTY, intermediate_size=None),
    "LigerGEGLUMLP": dict(config=EMPTY),
    "LigerCrossEntropyLoss": dict(weight=None, ignore_index=-100, lse_square_scale=0.0,
                                  label_smoothing=0.0, reduction="mean", softcap=None,
                                  return_z_loss=False, return_token_accuracy=False,
                                  return_predicted_tokens=False),
    "LigerFusedLinearCrossEntropyLoss": dict(
        ce_weight=None, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0,
        reduction="mean", softcap=None, return_z_loss=False, accum_dtype=None,
        use_token_scaling=False, return_token_accuracy=False, return_predicted_tokens=False),
    "LigerSoftmax": dict(),
    "LigerJSD": dict(beta=0.5, ignore_index=-100),
    "LigerKLDIVLoss": dict(eps=1e-10),
    "LigerTVDLoss": dict(reduction="batchmean", ignore_index=-100),
    "LigerFusedLinearJSD": dict(jsd_beta=0.5, ignore_index=-100, temperature=1.0,
                                accum_dtype=None),
    "LigerDyT": dict(hidden_size=EMPTY, beta=True, init_alpha=0.5),
    "LigerPolyNorm": dict(eps=1e-6, in_place=True),
    "LigerSparsemax": dict(dim=-1),
}
LIGER_FUNCTIONS = {
    "liger_cross_entropy": dict(input=EMPTY, target=EMPTY, weight=None, size_average=None,
                                ignore_index=-100, reduce=None, reduction="mean",
                                label_smoothing=0.0, lse_square_scale=0.0, softcap=None,
                                return_z_loss=False, return_token_accuracy=False,
                                return_predicted_tokens=False),
    "liger_fused_linear_cross_entropy": dict(
        input=EMPTY, weight=EMPTY, target=EMPTY, bias=None, ce_weight=None, ignore_index=-100,
        lse_square_scale=0.0, label_smoothing=0.0, reduction="mean", softcap=None,
        return_z_loss=False, accum_dtype=None, use_token_scaling=False,
        return_token_accuracy=False, return_predicted_tokens=False, chunk_mem_const=1),
    "liger_fused_linear_jsd": dict(student_input=EMPTY, student_weight=EMPTY,
                                   teacher_input=EMPTY, teacher_weight=EMPTY,
                                   shift_labels=None, jsd_beta=0.5, ignore_index=-100,
                                   temperature=1.0, accum_dtype=None),
    "liger_jsd": dict(input=EMPTY, target=EMPTY, shift_labels=None, beta=0.5, ignore_index=-100),
    "liger_kl_div": dict(input=EMPTY, target=EMPTY, size_average=True, reduce=True,
                         reduction="mean", log_target=False, eps=1e-10),
    "liger_tvd": dict(input=EMPTY, target=EMPTY, shift_labels=None, reduction="mean",
                      ignore_index=-100),
    "liger_sparsemax": dict(input=EMPTY, dim=-1),
    "liger_rms_norm": dict(X=EMPTY, W=EMPTY, eps=EMPTY, offset=0.0, casting_mode="llama",
                           in_place=True),
    "liger_fused_add_rms_norm": dict(X=EMPTY, R=EMPTY, W=EMPTY, eps=EMPTY, offset=0.0,
                                     casting_mode="llama", in_place=True),
    "liger_layer_norm": dict(X=EMPTY, W=EMPTY, B=EMPTY, eps=EMPTY),
    "liger_poly_norm": dict(X=EMPTY, W=EMPTY, B=EMPTY, eps=1e-6, in_place=True),
    "liger_rope": dict(q=EMPTY, k=EMPTY, cos=EMPTY, sin=EMPTY, position_ids=None,
                       unsqueeze_dim=1, rotary_dim=None),
    "liger_swiglu": dict(a=EMPTY, b=EMPTY),
    "liger_geglu": dict(a=EMPTY, b=EMPTY),
    "liger_softmax": dict(x=EMPTY),
    "liger_dyt": dict(x=EMPTY, alpha=EMPTY, gamma=EMPTY, beta=EMPTY),
}
# apply_liger_kernel_to_<type>'s keywords and defaults.
_SW = dict(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True,
           swiglu=True, model=None)
_GE = dict(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True,
           geglu=True, model=None)
LIGER_APPLY = dict(llama=_SW, mistral=_SW, mixtral=_SW, qwen2=_SW, qwen3=_SW, qwen3_moe=_SW,
                   phi3=_SW, olmo2=_SW, gemma=_GE, gemma2=_GE, gemma3_text=_GE,
                   granite=dict(_SW, cross_entropy=True, fused_linear_cross_entropy=False))


def _defaults(f, skip_self=True):
    ps = list(inspect.signature(f).parameters.values())
    return {p.name: p.default for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                          p.KEYWORD_ONLY)}


@pytest.mark.parametrize("name", sorted(LIGER_SIGNATURES))
def test_module_signature_is_liger(name):
    assert _defaults(getattr(LT, name).__init__) == dict(self=EMPTY, **LIGER_SIGNATURES[name])


@pytest.mark.parametrize("name", sorted(LIGER_FUNCTIONS))
def test_function_signature_is_liger(name):
    assert _defaults(getattr(LF, name)) == LIGER_FUNCTIONS[name]


@pytest.mark.parametrize("model_type", sorted(LIGER_APPLY))
def test_apply_signature_is_liger(model_type):
    fn = getattr(LT, f"apply_liger_kernel_to_{model_type}")
    assert _defaults(fn) == LIGER_APPLY[model_type]


def test_import_paths():
    from fk.liger.transformers import (LigerRMSNorm, _apply_liger_kernel_to_instance,  # noqa
                                       apply_liger_kernel_to_llama)
    from fk.liger.transformers.functional import liger_cross_entropy  # noqa: F401
    from fk.liger.transformers.rope import liger_rotary_pos_emb  # noqa: F401
    assert LT.LigerRMSNorm is LigerRMSNorm
    for name in LT.__all__:
        assert getattr(LT, name) is not None


# --- modules against fk's ops ---------------------------------------------------------------

def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_rms_norm_modules():
    m = LT.LigerRMSNorm(16)
    assert torch.equal(m.weight, torch.ones(16)) and m.variance_epsilon == 1e-6
    with torch.no_grad():
        m.weight.add_(_x(16, seed=1) * 0.1)
    x = _x(3, 16)
    torch.testing.assert_close(m(x), fk.rms_norm(x, m.weight, 1e-6), atol=0, rtol=0)
    z = LT.LigerRMSNorm(16, offset=1.0, casting_mode="gemma", init_fn="zeros")
    assert torch.equal(z.weight, torch.zeros(16))
    torch.testing.assert_close(z(x), fk.rms_norm(x, z.weight, 1e-6, 1.0, "gemma"))
    assert LT.LigerRMSNorm(16, elementwise_affine=False).weight is None
    torch.testing.assert_close(LT.LigerRMSNorm(16, elementwise_affine=False)(x), fk.rms_norm(x))
    g = LT.LigerRMSNormForGemma(16)
    assert (g.offset, g.casting_mode) == (1.0, "gemma") and torch.equal(g.weight, torch.zeros(16))
    with pytest.raises(ValueError, match="init_fn"):
        LT.LigerRMSNorm(16, init_fn="normal")
    a = LT.LigerFusedAddRMSNorm(16)
    r = _x(3, 16, seed=2)
    for got, want in zip(a(x, r), fk.fused_add_rms_norm(x, r, a.weight, 1e-6)):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_norms_take_float32_weights_with_16_bit_inputs():
    """Float32 parameters under autocast meet bf16 activations: the result has x's dtype."""
    x = _x(3, 16).bfloat16()
    m = LT.LigerRMSNorm(16)
    y = m(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, fk.rms_norm(x, m.weight.bfloat16()), atol=0, rtol=0)
    y.float().sum().backward()
    assert m.weight.grad.dtype == torch.float32
    ln = LT.LigerLayerNorm(16)
    assert ln(x).dtype == torch.bfloat16
    assert LT.LigerFusedAddRMSNorm(16)(x, x)[0].dtype == torch.bfloat16


def test_layer_norm_module():
    m = LT.LigerLayerNorm(16)
    assert m.eps == 1e-6 and torch.equal(m.bias, torch.zeros(16)) and m.bias.requires_grad
    assert LT.LigerLayerNorm(16, bias=True).bias.abs().sum() > 0
    x = _x(3, 16)
    torch.testing.assert_close(m(x), fk.layer_norm(x, m.weight, m.bias, 1e-6), atol=0, rtol=0)
    for kw in (dict(impl="triton"), dict(mode="fast"), dict(backend="cuda")):
        with pytest.raises(NotImplementedError, match=list(kw)[0]):
            LT.LigerLayerNorm(16, **kw)


def _config(act="silu"):
    return types.SimpleNamespace(hidden_size=16, intermediate_size=24, hidden_act=act)


def test_mlps():
    torch.manual_seed(0)
    x = _x(2, 3, 16)
    m = LT.LigerSwiGLUMLP(_config())
    torch.testing.assert_close(m(x), m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x)))
    assert LT.LigerSwiGLUMLP(_config(), intermediate_size=8).gate_proj.out_features == 8
    with pytest.raises(ValueError, match="gelu"):
        LT.LigerSwiGLUMLP(_config("gelu"))
    g = LT.LigerGEGLUMLP(_config("gelu"))  # the tanh GELU whatever hidden_act says
    want = g.down_proj(F.gelu(g.gate_proj(x), approximate="tanh") * g.up_proj(x))
    torch.testing.assert_close(g(x), want)
    g(x).sum().backward()
    assert g.gate_proj.weight.grad is not None


def test_cross_entropy_losses():
    logits, t = _x(6, 11), torch.tensor([1, 2, -100, 4, 5, 0])
    m = LT.LigerCrossEntropyLoss(label_smoothing=0.1, lse_square_scale=1e-3)
    torch.testing.assert_close(m(logits.clone(), t),
                               fk.cross_entropy(logits.clone(), t, label_smoothing=0.1,
                                                lse_square_scale=1e-3), atol=0, rtol=0)
    out = LT.LigerCrossEntropyLoss(return_z_loss=True, lse_square_scale=1e-3)(logits.clone(), t)
    assert isinstance(out, LT.CrossEntropyOutput) and out.z_loss is not None
    assert out.token_accuracy is None and out.predicted_tokens is None
    x, w = _x(6, 8, seed=1), _x(11, 8, seed=2)
    flce = LT.LigerFusedLinearCrossEntropyLoss(reduction="sum", softcap=3.0)
    torch.testing.assert_close(flce(w, x, t), fk.fused_linear_cross_entropy(
        x, w, t, reduction="sum", softcap=3.0), atol=0, rtol=0)
    torch.testing.assert_close(LF.liger_fused_linear_cross_entropy(x, w, t),
                               fk.fused_linear_cross_entropy(x, w, t), atol=0, rtol=0)
    z = LF.liger_fused_linear_cross_entropy(x, w, t, lse_square_scale=1e-3, return_z_loss=True)
    assert isinstance(z, LF.CrossEntropyOutput)
    # Liger's fused loss is float32 for 16-bit inputs too (fk's default is the input's dtype).
    xb, wb = x.bfloat16(), w.bfloat16()
    assert LF.liger_fused_linear_cross_entropy(xb, wb, t).dtype == torch.float32
    assert LT.LigerFusedLinearCrossEntropyLoss()(wb, xb, t).dtype == torch.float32


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_extra_outputs_and_token_scaling(reduction):
    """Token accuracy, predicted tokens and token scaling pass through to fk's ops (the same
    values; Liger marks an ignored row's prediction -1, fk -100)."""
    logits, t = _x(6, 11), torch.tensor([1, 2, -100, 4, 5, 0])
    logits[0, 1] = 9.0  # row 0 predicted right
    want = fk.cross_entropy(logits.clone(), t, reduction=reduction, lse_square_scale=1e-3,
                            return_z_loss=True, return_token_accuracy=True,
                            return_predicted_tokens=True)
    liger_pred = want.predicted_tokens.clone()
    liger_pred[2] = -1
    assert int(want.predicted_tokens[2]) == -100 and int(liger_pred[0]) == 1

    def check(out, z=True, acc=True, pred=True):
        assert isinstance(out, LT.CrossEntropyOutput)
        torch.testing.assert_close(out.loss, want.loss, atol=0, rtol=0)
        assert (out.z_loss is not None) == z and (out.token_accuracy is not None) == acc
        assert (out.predicted_tokens is not None) == pred
        if acc:
            torch.testing.assert_close(out.token_accuracy, want.token_accuracy, atol=0, rtol=0)
        if pred:
            assert torch.equal(out.predicted_tokens, liger_pred)

    kw = dict(reduction=reduction, lse_square_scale=1e-3)
    check(LT.LigerCrossEntropyLoss(return_z_loss=True, return_token_accuracy=True,
                                   return_predicted_tokens=True, **kw)(logits.clone(), t))
    check(LT.LigerCrossEntropyLoss(return_token_accuracy=True, **kw)(logits.clone(), t),
          z=False, pred=False)
    check(LF.liger_cross_entropy(logits.clone(), t, return_predicted_tokens=True, **kw),
          z=False, acc=False)

    x, w = _x(6, 8, seed=1), _x(11, 8, seed=2)
    x[0] = 0.5 * w[1]  # row 0's logits peak at its target
    for scaling in (False, True):
        want = fk.fused_linear_cross_entropy(
            x, w, t, reduction=reduction, lse_square_scale=1e-3, return_z_loss=True,
            loss_dtype=torch.float32, use_token_scaling=scaling, return_token_accuracy=True,
            return_predicted_tokens=True)
        liger_pred = want.predicted_tokens.clamp(min=-1)
        check(LT.LigerFusedLinearCrossEntropyLoss(
            return_z_loss=True, use_token_scaling=scaling, return_token_accuracy=True,
            return_predicted_tokens=True, **kw)(w, x, t))
        check(LF.liger_fused_linear_cross_entropy(
            x, w, t, use_token_scaling=scaling, return_token_accuracy=True, **kw),
            z=False, pred=False)
        plain = LF.liger_fused_linear_cross_entropy(x, w, t, use_token_scaling=scaling, **kw)
        torch.testing.assert_close(plain, want.loss, atol=0, rtol=0)
    assert LT.LigerFusedLinearCrossEntropyLoss(use_token_scaling=True).use_token_scaling


def test_distillation_losses():
    lq = torch.log_softmax(_x(5, 9), -1)
    lp = torch.log_softmax(_x(5, 9, seed=1), -1)
    labels = torch.tensor([1, -100, 2, 3, 4])
    torch.testing.assert_close(LT.LigerJSD(beta=0.3)(lq, lp, labels),
                               fk.jsd(lq, lp, labels, 0.3), atol=0, rtol=0)
    kl = LT.LigerKLDIVLoss(reduction="batchmean", log_target=True)
    assert isinstance(kl, torch.nn.KLDivLoss) and kl.eps == 1e-10
    torch.testing.assert_close(kl(lq, lp), fk.kl_div(lq, lp, "batchmean", True), atol=0, rtol=0)
    assert LT.LigerKLDIVLoss().reduction == "mean"
    p, q = lp.exp(), lq.exp()
    torch.testing.assert_close(LT.LigerTVDLoss()(p, q, labels),
                               fk.tvd(p, q, labels, "batchmean"), atol=0, rtol=0)
    torch.testing.assert_close(LF.liger_tvd(p, q), fk.tvd(p, q, reduction="mean"))
    torch.testing.assert_close(LF.liger_kl_div(lq, lp), fk.kl_div(lq, lp, "mean"))
    torch.testing.assert_close(LF.liger_jsd(lq, lp, labels), fk.jsd(lq, lp, labels))
    xs, ws, xt, wt = _x(5, 8), _x(9, 8, seed=1), _x(5, 6, seed=2), _x(9, 6, seed=3)
    m = LT.LigerFusedLinearJSD(jsd_beta=0.2, temperature=2.0)
    want = fk.fused_linear_jsd(xs, ws, xt, wt, labels, 0.2, -100, 2.0)
    torch.testing.assert_close(m(xs, ws, xt, wt, labels), want, atol=0, rtol=0)
    torch.testing.assert_close(LF.liger_fused_linear_jsd(xs, ws, xt, wt, labels, 0.2, -100, 2.0),
                               want, atol=0, rtol=0)
    LT.LigerFusedLinearJSD(accum_dtype=torch.float32)(xs, ws, xt, wt)  # the weight's dtype
    with pytest.raises(NotImplementedError, match="accum_dtype"):
        LT.LigerFusedLinearJSD(accum_dtype=torch.float32)(xs.bfloat16(), ws.bfloat16(),
                                                          xt.bfloat16(), wt.bfloat16())
    with pytest.raises(ValueError, match="temperature"):
        LT.LigerFusedLinearJSD(temperature=0)


def test_elementwise_modules():
    x = _x(3, 16)
    d = LT.LigerDyT(16)
    assert d.alpha.item() == 0.5 and torch.equal(d.gamma, torch.ones(16))
    assert torch.equal(d.beta, torch.zeros(16)) and LT.LigerDyT(16, beta=False).beta is None
    torch.testing.assert_close(d(x), fk.dyt(x, d.alpha, d.gamma, d.beta), atol=0, rtol=0)
    p = LT.LigerPolyNorm()
    assert torch.equal(p.weight, torch.full((3,), 1 / 3)) and p.bias.item() == 1.0
    assert p.bias.shape == ()
    torch.testing.assert_close(p(x), fk.poly_norm(x, p.weight, p.bias, 1e-6), atol=0, rtol=0)
    torch.testing.assert_close(LT.LigerSoftmax()(x), fk.softmax(x), atol=0, rtol=0)
    torch.testing.assert_close(LT.LigerSparsemax(dim=0)(x), fk.sparsemax(x, 0), atol=0, rtol=0)
    a, b = _x(3, 8), _x(3, 8, seed=1)
    torch.testing.assert_close(LF.liger_swiglu(a, b), fk.swiglu(a, b))
    torch.testing.assert_close(LF.liger_geglu(a, b), fk.geglu(a, b, approximate="tanh"))
    torch.testing.assert_close(LF.liger_softmax(x), fk.softmax(x))
    torch.testing.assert_close(LF.liger_sparsemax(x), fk.sparsemax(x))
    torch.testing.assert_close(LF.liger_dyt(x, d.alpha, d.gamma, d.beta), d(x))
    w = _x(16, seed=3)
    torch.testing.assert_close(LF.liger_rms_norm(x, w, 1e-5), fk.rms_norm(x, w, 1e-5))
    torch.testing.assert_close(LF.liger_layer_norm(x, w, w, 1e-5), fk.layer_norm(x, w, w, 1e-5))
    torch.testing.assert_close(LF.liger_poly_norm(x, p.weight, p.bias), p(x))
    torch.testing.assert_close(LF.liger_fused_add_rms_norm(x, x, w, 1e-5)[0],
                               fk.fused_add_rms_norm(x, x, w, 1e-5)[0])


def test_rope():
    q, k = _x(2, 4, 5, 8), _x(2, 2, 5, 8, seed=1)
    cos, sin = _x(1, 5, 8, seed=2), _x(1, 5, 8, seed=3)
    want = fk.rope(q, k, cos, sin)
    for got in (LT.liger_rotary_pos_emb(q, k, cos, sin),
                LT.rope.liger_rotary_pos_emb(q, k, cos.unsqueeze(1), sin.unsqueeze(1)),
                LF.liger_rope(q, k, cos, sin, position_ids=torch.arange(5))):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=0, rtol=0)
    qt, kt = LT.liger_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin,
                                     unsqueeze_dim=2)
    torch.testing.assert_close(qt.transpose(1, 2), want[0])
    with pytest.raises(NotImplementedError, match="unsqueeze_dim"):
        LT.liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)


# --- patching Hugging Face models -----------------------------------------------------------

def test_apply_to_instance_maps_to_apply_fk():
    import fk.transformers as ft
    model = tiny_hf_model("llama")
    LT.apply_liger_kernel_to_llama(model=model)
    assert ft.patched(model) == ft.patched(ft.apply_fk(tiny_hf_model("llama"), cross_entropy=False,
                                                      layer_norm=False))
    LT.apply_liger_kernel_to_llama(rope=False, swiglu=False, model=model)
    kinds = ft.patched(model)
    assert "rope" not in kinds and "swiglu" not in kinds and kinds["rms_norm"] > 0
    g = tiny_hf_model("gemma")
    LT._apply_liger_kernel_to_instance(g, geglu=False, swiglu=True, unknown=1)
    assert "geglu" not in ft.patched(g) and ft.patched(g)["fused_linear_cross_entropy"] == 1
    with pytest.raises(ValueError, match="cannot both be True"):
        LT.apply_liger_kernel_to_llama(cross_entropy=True, model=model)
    other = types.SimpleNamespace(config=types.SimpleNamespace(model_type="bert"))
    LT._apply_liger_kernel_to_instance(other)  # unsupported: nothing happens, as in Liger


def test_apply_without_model_patches_models_built_later():
    import fk.transformers as ft
    try:
        LT.apply_liger_kernel_to_qwen3(rope=False)
        LT.apply_liger_kernel_to_qwen3(rope=False)  # twice: one wrapper
        model = tiny_hf_model("qwen3")
        kinds = ft.patched(model)
        assert kinds["rms_norm"] > 0 and "rope" not in kinds
        assert not ft.patched(tiny_hf_model("llama"))
        ids = torch.randint(0, 96, (2, 7))
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        assert torch.isfinite(loss)
    finally:
        LT.revert_liger_kernel_patches()
    assert not ft.patched(tiny_hf_model("qwen3"))


def test_auto_model():
    from transformers import AutoConfig
    import fk.transformers as ft
    config = tiny_hf_model("mistral").config
    model = LT.AutoLigerKernelForCausalLM.from_config(AutoConfig.for_model(**config.to_dict()),
                                                      swiglu=False)
    kinds = ft.patched(model)
    assert kinds["rms_norm"] > 0 and "swiglu" not in kinds
