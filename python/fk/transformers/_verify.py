"""Patching modules the table does not name, after checking them.

A module is a candidate by what it is, not by its class name:

- a norm: a leaf with a 1-D ``weight`` and an ``eps`` (or ``variance_epsilon``) number;
  tried as fk's RMSNorm the three ways the models round it (Llama's, Gemma's ``1 + weight``,
  OLMo 2's) and as a LayerNorm;
- a gated MLP: ``gate_proj`` / ``up_proj`` / ``down_proj`` linears and an ``act_fn`` fk has
  a gate for (SiLU -> swiglu, tanh GELU / exact GELU -> geglu), or the stacked
  ``gate_up_proj`` / ``down_proj`` with ``activation_fn`` (Phi-3's layout);
- the causal-LM head: a model with an ``lm_head`` linear, its base model under
  ``base_model_prefix``, a forward with Llama's arguments returning ``CausalLMOutputWithPast``.

Each candidate is patched only after a check: its own forward and the fk forward run on a
small random input of its dtype and device (training mode: output and the gradients of the
input and of every parameter; eval mode: output) and must agree within the dtype's
tolerance. The norms' 1-D parameters are replaced by random ones for the check (a freshly
initialised weight of ones would hide ``weight`` versus ``1 + weight``); the input has rows
from ``sqrt(eps) / 2`` to 30 times unit scale, so that the epsilon's place and a clamp on
the activation show. A float32 norm is checked in bfloat16 as well, which tells the rounding
variants apart (where several pass, the closest is taken). The head is checked with its
base model stubbed out: the model's own forward runs on random hidden states, so the check
costs one small matmul with the head. A check that raises rejects the candidate.

Verdicts are cached per module class and the values that can change its numerics (its and
its submodules' scalar attributes, parameter shapes, dtype, device type, the config it
holds), so a model checks each kind of module once.
"""
import dataclasses
import math
import sys
from types import MethodType

import torch

from . import _forwards as fw
from ._table import LLAMA_NORM, GEMMA_NORM, OLMO2_NORM, LayerNormSpec, ModelSpec, NormSpec

# (fk's rtol, atol relative to the reference's largest magnitude) per dtype.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-10, 1e-10),
              torch.bfloat16: (3e-2, 3e-2), torch.float16: (5e-3, 5e-3)}

# Row scales of the check inputs (multiples of unit scale), besides the two near sqrt(eps).
_SCALES = (1.0, 0.1, 3.0, 1.0, 10.0, 30.0)

_CACHE = {}

_CHUNK = 1 << 24  # elements per chunk of a comparison

REPORT = "_fk_report"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of :func:`fk.transformers.report`: ``status`` is "patched", "rejected",
    "off" (a candidate whose kinds apply_fk's options switch off) or "not recognized"."""
    name: str
    cls: str
    status: str
    kind: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str
    choice: object = None  # the variant that passed


class Mismatch(Exception):
    pass


# --- comparing ----------------------------------------------------------------------------

def _max(values):
    """The largest of ``values``, NaN if one is (Python's max keeps whichever comes first)."""
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _diff(got, want, what):
    """How far ``got`` is from ``want`` in units of the tolerance (<= 1 passes); raises
    Mismatch naming ``what`` otherwise."""
    if got is None or want is None:
        if got is None and want is None:
            return 0.0
        raise Mismatch(f"{what}: one side has none")
    if got.shape != want.shape or got.dtype != want.dtype:
        raise Mismatch(f"{what}: {tuple(got.shape)} {got.dtype} vs "
                       f"{tuple(want.shape)} {want.dtype}")
    rtol, atol = TOLERANCES.get(want.dtype, TOLERANCES[torch.float32])
    g, w = got.detach().reshape(-1), want.detach().reshape(-1)
    if w.numel() == 0:
        return 0.0
    # float32 arithmetic (a 16-bit value and its tolerance fit), in chunks: a large weight's
    # gradient (the head's) gets no full-size float32 temporaries.
    up = (lambda t: t) if w.dtype == torch.float64 else (lambda t: t.float())
    chunks = [slice(i, i + _CHUNK) for i in range(0, w.numel(), _CHUNK)]
    scale = _max(up(w[c]).abs().max().item() for c in chunks)
    if not math.isfinite(scale):  # want has inf / NaN: got must have the same there
        finite = torch.isfinite(w)
        if not torch.equal(finite, torch.isfinite(g)) or not torch.equal(g[~finite],
                                                                          w[~finite]):
            raise Mismatch(f"{what}: non-finite values differ")
        return _diff(g[finite], w[finite], what)
    scale = scale or 1.0
    # NaN in got where want is finite makes the ratio NaN, which fails the test below.
    ratio = _max((up(g[c]) - up(w[c])).abs_().div_(up(w[c]).abs().mul_(rtol).add_(
        atol * scale)).max().item() for c in chunks)
    if not ratio <= 1.0:
        raise Mismatch(f"{what}: differs by {ratio:.3g}x the {str(want.dtype)[6:]} tolerance")
    return ratio


def _closeness(pairs):
    """Mean relative distance over all pairs (to rank variants that all pass)."""
    num = den = 0.0
    for got, want in pairs:
        if got is None:
            continue
        num += (got.detach().double() - want.detach().double()).abs().sum().item()
        den += want.detach().double().abs().sum().item()
    return num / den if den else 0.0


# --- running a module both ways -----------------------------------------------------------

def _generator():
    return torch.Generator().manual_seed(1234)


def _randn(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device, dtype)


def _check_params(module, dtype, device, gen):
    """The parameters the check runs with: random 1-D ones (norm weights, biases), the
    module's own for the rest (cast to ``dtype``), as leaves that require grad."""
    out = {}
    for name, p in module.named_parameters():
        if p.dim() <= 1:
            t = _randn(p.shape, dtype, device, gen)
        else:
            t = p.detach().to(dtype)
        out[name] = t.requires_grad_()
    return out


class _modes:
    """Sets ``training`` on a module tree, restoring each module's flag on exit."""

    def __init__(self, module, training):
        self.module, self.training = module, training

    def __enter__(self):
        self.saved = [(m, m.training) for m in self.module.modules()]
        for m, _ in self.saved:
            m.training = self.training

    def __exit__(self, *exc):
        for m, t in self.saved:
            m.training = t


def _run(module, forward, params, x, grad_out, training):
    """(output, grads of x and params) of ``module`` with ``forward`` (None: its own), in
    training (with gradients) or eval mode."""
    d = module.__dict__
    if forward is not None:
        d["forward"] = forward
    try:
        with _modes(module, training):
            if not training:
                with torch.no_grad():
                    return torch.func.functional_call(module, params, (x,)), ()
            y = torch.func.functional_call(module, params, (x,))
            if isinstance(y, tuple):
                y = y[0]
            leaves = [x, *params.values()]
            grads = torch.autograd.grad(y, leaves, grad_out(y), allow_unused=True)
            return y, grads
    finally:
        if forward is not None:
            d.pop("forward", None)


def _compare(module, forward, x, dtype, device, rank):
    """Runs module vs fk forward (training with gradients, then eval); returns
    (worst ratio, closeness (None unless ``rank``)) or raises Mismatch."""
    gen = _generator()
    params = _check_params(module, dtype, device, gen)
    gseed = torch.randint(0, 2 ** 31, (1,), generator=gen).item()

    def grad_out(y):
        return _randn(y.shape, y.dtype, y.device, torch.Generator().manual_seed(gseed))

    names = ["output", "input gradient"] + [f"{n} gradient" for n in params]
    worst, pairs = 0.0, []
    for training in (True, False):
        xi = x.detach().clone().requires_grad_(training)
        # The same random stream for both: a dropout of p > 0 then differs (fk has none).
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(gseed)
            want, want_grads = _run(module, None, params, xi, grad_out, training)
            torch.manual_seed(gseed)
            got, got_grads = _run(module, forward, params, xi, grad_out, training)
        mode = "training" if training else "eval"
        for name, g, w in zip(names, (got, *got_grads), (want, *want_grads)):
            worst = max(worst, _diff(g, w, f"{mode} {name}"))
            if rank:
                pairs.append((g, w))
    return worst, _closeness(pairs) if rank else None


def _choose(module, variants, make_input, dtypes, device):
    """The first of the closest ``variants`` ((label, forward)) that passes in every dtype
    of ``dtypes``, as a Verdict."""
    results, reasons = [], []
    for label, forward in variants:
        try:
            worst, close = 0.0, 0.0
            for dtype in dtypes:
                w, c = _compare(module, forward, make_input(dtype), dtype, device,
                                len(variants) > 1)
                worst, close = max(worst, w), close + (c or 0.0)
            results.append((close, worst, label))
        except Mismatch as e:
            reasons.append(f"{label}: {e}")
        except Exception as e:  # noqa: BLE001 - a check that cannot run rejects
            reasons.append(f"{label}: check raised {type(e).__name__}: {str(e)[:200]}")
    if not results:
        return Verdict(False, "; ".join(reasons))
    close, worst, label = min(results, key=lambda r: r[0])
    checked = "+".join(str(d)[6:] for d in dtypes)
    return Verdict(True, f"{label}, checked in {checked} (worst {worst:.2g}x tolerance)", label)


# --- candidates ---------------------------------------------------------------------------

def _eps(module):
    for attr in ("variance_epsilon", "eps"):
        v = module.__dict__.get(attr)
        if isinstance(v, float) and not isinstance(v, bool):
            return attr, v
    return None, None


def takes_one_input(m):
    """Whether the class's forward takes exactly one argument (the fk forwards take one: a
    forward with more, e.g. a gated norm's ``(x, gate=None)``, would be called with them)."""
    import inspect
    try:
        params = list(inspect.signature(type(m).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY,
                                                   params[0].POSITIONAL_OR_KEYWORD)


def _by_name(m, forward):
    """``forward`` (bound, one input) also taking its input by the name the class's forward
    gives it (``self.mlp(hidden_states=h)``)."""
    import inspect
    name = list(inspect.signature(type(m).forward).parameters)[1]

    def fk_forward(*args, **kwargs):
        if name in kwargs:
            args = (*args, kwargs.pop(name))
        return forward(*args, **kwargs)
    fk_forward.__name__ = fk_forward.__qualname__ = forward.__name__
    fk_forward.__doc__ = forward.__doc__
    return fk_forward


def _norm_candidate(m):
    if next(m.children(), None) is not None:
        return False
    attr, eps = _eps(m)
    weight = m._parameters.get("weight")
    return attr is not None and weight is not None and weight.dim() == 1


def _mlp_layout(m):
    """"split" (gate_proj / up_proj / down_proj / act_fn), "stacked" (gate_up_proj /
    down_proj / activation_fn) or None."""
    lin = torch.nn.Linear
    down = getattr(m, "down_proj", None)
    if not isinstance(down, lin):
        return None
    if isinstance(getattr(m, "gate_proj", None), lin) and isinstance(
            getattr(m, "up_proj", None), lin) and isinstance(
            getattr(m, "act_fn", None), torch.nn.Module):
        return "split"
    if isinstance(getattr(m, "gate_up_proj", None), lin) and isinstance(
            getattr(m, "activation_fn", None), torch.nn.Module):
        return "stacked"
    return None


def _scalars(m):
    out = []
    for k, v in vars(m).items():
        if k.startswith("_") or k == "training":
            continue
        if isinstance(v, (bool, int, float, str, type(None))):
            out.append((k, v))
        elif isinstance(v, (tuple, list)) and all(
                isinstance(i, (bool, int, float, str, type(None))) for i in v):
            out.append((k, tuple(v)))
        elif hasattr(v, "to_json_string"):  # a config the forward may read
            try:
                out.append((k, v.to_json_string(use_diff=False)))
            except Exception:  # noqa: BLE001
                out.append((k, repr(v)))
    return tuple(sorted(out))


def _key(m, kind, dtype, device, extra=()):
    tree = tuple((name, type(s), _scalars(s),
                  tuple((n, tuple(p.shape)) for n, p in s._parameters.items() if p is not None))
                 for name, s in m.named_modules())
    return (type(m), kind, dtype, device.type, tree, extra)


def _first_param(m):
    return next(m.parameters(), None)


def _norm_variants(m, flags):
    attr, _ = _eps(m)
    out = []
    if flags["rms_norm"]:
        for label, spec in (("llama", LLAMA_NORM), ("gemma", GEMMA_NORM),
                            ("olmo2", OLMO2_NORM)):
            spec = NormSpec(spec.offset, spec.casting_mode, attr)
            out.append(("rms_norm", label, fw.rms_norm_forward, dict(norm=spec)))
    if flags["layer_norm"]:
        out.append(("layer_norm", "layer_norm", fw.model_layer_norm_forward,
                    dict(spec=LayerNormSpec(eps_attr=attr))))
    return out


def _mlp_variants(m, layout, flags):
    act = m.act_fn if layout == "split" else m.activation_fn
    gate = fw.gate_for(act, flags["swiglu"], flags["geglu"])
    if gate is None:
        return []
    kind = "swiglu" if gate == "swiglu" else "geglu"
    if layout == "stacked":
        return [(kind, gate, fw.fused_mlp_forward, dict(gate=gate))]
    if flags.get("tiled_mlp"):
        return [("tiled_mlp", gate, fw.tiled_mlp_forward,
                 dict(gate=gate, num_shards=flags.get("num_shards"), dropout=None))]
    return [(kind, gate, fw.mlp_forward, dict(gate=gate, dropout=None))]


def _check_module(m, variants, make_input, dtypes, device, bind, key):
    verdict = _CACHE.get(key)
    if verdict is None:
        forwards = [(label, _by_name(m, bind(m, f, **kw))) for _, label, f, kw in variants]
        verdict = _choose(m, forwards, make_input, dtypes, device)
        _CACHE[key] = verdict
    return verdict


def _norm_input(m, dim):
    _, eps = _eps(m)
    tiny = math.sqrt(max(eps, 1e-12))
    scales = torch.tensor([tiny * 0.5, tiny * 2.0, *_SCALES])

    def make(dtype):
        gen = torch.Generator().manual_seed(99)
        x = torch.randn(1, len(scales), dim, generator=gen) * scales[None, :, None]
        p = _first_param(m)
        return x.to(p.device, dtype)
    return make


def _mlp_input(m, dim):
    def make(dtype):
        gen = torch.Generator().manual_seed(98)
        scales = torch.tensor(_SCALES)
        x = torch.randn(1, len(scales), dim, generator=gen) * scales[None, :, None]
        return x.to(_first_param(m).device, dtype)
    return make


# --- the causal-LM head -------------------------------------------------------------------

# The arguments fk's causal-LM forward handles (as Llama's forward names them).
_HEAD_ARGS = {"self", "input_ids", "attention_mask", "position_ids", "past_key_values",
              "inputs_embeds", "labels", "use_cache", "logits_to_keep", "cache_position",
              "return_dict", "output_attentions", "output_hidden_states", "kwargs"}


def _head_candidate(model):
    import inspect
    lm_head = getattr(model, "lm_head", None)
    prefix = getattr(model, "base_model_prefix", None)
    if not isinstance(lm_head, torch.nn.Linear) or not prefix or not isinstance(
            getattr(model, prefix, None), torch.nn.Module):
        return None
    try:
        params = set(inspect.signature(type(model).forward).parameters)
    except (TypeError, ValueError):
        return "its forward has no signature"
    if "labels" not in params:
        return "its forward takes no labels"
    extra = params - _HEAD_ARGS
    if extra:
        return f"its forward takes arguments fk's does not handle: {', '.join(sorted(extra))}"
    return True


def _head_spec(model):
    config = model.config
    return ModelSpec(
        module=type(model).__module__, norm=LLAMA_NORM, rms_norms=(),
        causal_lm=type(model).__name__,
        softcap=getattr(config, "final_logit_softcapping", None) is not None,
        logits_scaling=getattr(config, "logits_scaling", None) is not None,
        logit_scale=isinstance(getattr(model, "logit_scale", None), (int, float)))


class _Stub:
    """Stands for the base model: returns the given hidden states."""

    def __init__(self, hidden):
        self.hidden = hidden

    def __call__(self, *args, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPast
        return BaseModelOutputWithPast(last_hidden_state=self.hidden)


def _run_head(model, forward, hidden, ids, labels, training, loss_function=None, **kw):
    d = model.__dict__
    prefix = model.base_model_prefix
    saved_training, had_loss = model.training, "_loss_function" in d
    saved_loss = d.get("_loss_function")
    d[prefix] = _Stub(hidden)
    try:
        model.training = training
        if loss_function is not None:
            d["_loss_function"] = loss_function
        f = forward if forward is not None else MethodType(type(model).forward, model)
        out = f(input_ids=ids, labels=labels, **kw)
        return out
    finally:
        d.pop(prefix, None)
        model.training = saved_training
        if had_loss:
            d["_loss_function"] = saved_loss
        else:
            d.pop("_loss_function", None)


def check_head(model, fused_forward, loss_function):
    """Checks fk's fused-loss forward (``fused_forward``, bound; None: not wanted) and
    loss function (None: not wanted) against the model's own on random hidden states.
    Returns {kind: Verdict}."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    head = model.lm_head
    w = head.weight
    dtype, device = w.dtype, w.device
    vocab, dim = head.out_features, head.in_features
    gen = torch.Generator().manual_seed(97)
    ids = torch.randint(0, vocab, (2, 6), generator=gen)
    labels = ids.clone()
    labels[0, :2] = -100
    ids, labels = ids.to(device), labels.to(device)
    hidden0 = torch.randn(2, 6, dim, generator=gen).to(device, dtype)
    leaves_of = [p for p in head.parameters()]
    out = {}

    def run(forward, training, loss_function=None, head_grads=True, **kw):
        hidden = hidden0.clone().requires_grad_(True)
        with torch.enable_grad():
            o = _run_head(model, forward, hidden, ids, labels, training, loss_function, **kw)
            if type(o) is not CausalLMOutputWithPast:
                raise Mismatch(f"returns {type(o).__name__}, not CausalLMOutputWithPast")
            leaves = [hidden, *leaves_of] if head_grads else [hidden]
            grads = torch.autograd.grad(o.loss, leaves, allow_unused=True)
        return o, grads

    def compare(kind, got_fn, want_fn):
        try:
            worst = 0.0
            # The second time (a sum over the labels divided by num_items_in_batch) without
            # the head's gradients: the first compared them, and they are the large ones.
            for kw in ({}, {"num_items_in_batch": torch.tensor(7, device=device),
                            "head_grads": False}):
                (o, g), (r, rg) = got_fn(**kw), want_fn(**kw)
                worst = max(worst, _diff(o.loss, r.loss, "loss"))
                if o.logits is not None:
                    worst = max(worst, _diff(o.logits, r.logits, "logits"))
                names = ["hidden-state gradient"] + [f"lm_head.{n} gradient"
                                                     for n, _ in head.named_parameters()]
                for name, a, b in zip(names, g, rg):
                    worst = max(worst, _diff(a, b, name))
            out[kind] = Verdict(True, f"checked in {str(dtype)[6:]} with the base model "
                                      f"stubbed (worst {worst:.2g}x tolerance)")
        except Mismatch as e:
            out[kind] = Verdict(False, str(e))
        except Exception as e:  # noqa: BLE001
            out[kind] = Verdict(False, f"check raised {type(e).__name__}: {str(e)[:200]}")

    with torch.autocast(device.type, enabled=False):
        if fused_forward is not None:
            compare("fused_linear_cross_entropy",
                    lambda **kw: run(fused_forward, True, **kw),
                    lambda **kw: run(None, True, **kw))
        if loss_function is not None:
            compare("cross_entropy",
                    lambda **kw: run(None, False, loss_function, **kw),
                    lambda **kw: run(None, False, **kw))
    return out


# --- the pass over a model ----------------------------------------------------------------

def patch_checked(model, flags, skip, set_, bind):
    """Patches every candidate of ``model`` not in ``skip`` (ids of modules already
    patched) that passes its check, through ``set_(module, kind, **attrs)``; returns the
    report entries of the candidates (patched and rejected). The checks run with autograd
    on and autocast off, whatever the caller's context."""
    with torch.inference_mode(False), torch.enable_grad():
        autocast = [torch.autocast(d, enabled=False) for d in ("cpu", "cuda")
                    if d == "cpu" or torch.cuda.is_available()]
        for a in autocast:
            a.__enter__()
        try:
            return _patch_checked(model, flags, skip, set_, bind)
        finally:
            for a in reversed(autocast):
                a.__exit__(None, None, None)


def _patch_checked(model, flags, skip, set_, bind):
    entries = []
    names = {id(m): n for n, m in model.named_modules()}
    for m in model.modules():
        if id(m) in skip or "forward" in m.__dict__:
            continue
        name, cls = names[id(m)] or "(model)", type(m).__name__
        p = _first_param(m)
        if p is None or p.device.type == "meta":
            continue
        device = p.device
        if (_norm_candidate(m) or _mlp_layout(m) is not None) and not takes_one_input(m):
            entries.append(Entry(name, cls, "not recognized", "",
                                 "its forward takes more than one input"))
            continue
        if _norm_candidate(m):
            variants = _norm_variants(m, flags)
            if not variants:
                entries.append(Entry(name, cls, "off", "rms_norm/layer_norm",
                                     "rms_norm and layer_norm are switched off"))
                continue
            dtype = m.weight.dtype
            dtypes = (dtype, torch.bfloat16) if dtype == torch.float32 else (dtype,)
            key = _key(m, "norm", dtype, device, tuple(v[1] for v in variants))
            v = _check_module(m, variants, _norm_input(m, m.weight.numel()), dtypes, device,
                              bind, key)
            kinds = {label: (kind, f, kw) for kind, label, f, kw in variants}
            if v.ok:
                kind, f, kw = kinds[v.choice]
                set_(m, kind, forward=_by_name(m, bind(m, f, **kw)))
                entries.append(Entry(name, cls, "patched", kind, v.detail))
            else:
                entries.append(Entry(name, cls, "rejected", "rms_norm/layer_norm", v.detail))
            continue
        layout = _mlp_layout(m)
        if layout is not None:
            variants = _mlp_variants(m, layout, flags)
            if not variants:
                act = m.act_fn if layout == "split" else m.activation_fn
                if fw.gate_for(act, True, True) is None:
                    entries.append(Entry(name, cls, "not recognized", "swiglu/geglu",
                                         f"activation {type(act).__name__}: fk has no gate "
                                         f"for it"))
                else:
                    entries.append(Entry(name, cls, "off", "swiglu/geglu",
                                         "its gate's kind is switched off"))
                continue
            dtype = p.dtype
            proj = m.gate_proj if layout == "split" else m.gate_up_proj
            key = _key(m, "mlp", dtype, device, tuple(v[1] for v in variants))
            v = _check_module(m, variants, _mlp_input(m, proj.in_features), (dtype,), device,
                              bind, key)
            kind, _, f, kw = variants[0]
            if v.ok:
                set_(m, kind, forward=_by_name(m, bind(m, f, **kw)))
                entries.append(Entry(name, cls, "patched", kind, f"{v.detail}"))
            else:
                entries.append(Entry(name, cls, "rejected", kind, v.detail))
            continue
        if getattr(m, "config", None) is not None and hasattr(m, "lm_head"):
            entries.extend(_patch_head(m, name, flags, set_, bind))
    return entries


def _patch_head(m, name, flags, set_, bind):
    import inspect
    cls = type(m).__name__
    fits = _head_candidate(m)
    if fits is None:
        return []
    if fits is not True:
        return [Entry(name, cls, "not recognized", "fused_linear_cross_entropy", fits)]
    spec = _head_spec(m)
    forward = None
    if flags["fused_linear_cross_entropy"]:
        forward = bind(m, fw.causal_lm_forward, spec=spec, modeling=sys.modules[type(m).__module__])
        forward.__func__.__signature__ = inspect.signature(type(m).forward)
    loss = None
    if flags["cross_entropy"] and getattr(m, "loss_type", None) in (None, "ForCausalLM"):
        loss = fw.causal_lm_loss
    w = m.lm_head.weight
    try:
        config = m.config.to_json_string(use_diff=False)
    except Exception:  # noqa: BLE001 - a config that does not serialise: not cached
        config = object()
    key = (type(m), "head", w.dtype, w.device.type, config, forward is not None,
           loss is not None, spec)
    verdicts = _CACHE.get(key)
    if verdicts is None:
        verdicts = _CACHE[key] = check_head(m, forward, loss)
    entries = []
    for kind, v in verdicts.items():
        if v.ok:
            if kind == "cross_entropy":
                set_(m, kind, _loss_function=loss)
            else:
                set_(m, kind, forward=forward)
            entries.append(Entry(name, cls, "patched", kind, v.detail))
        else:
            entries.append(Entry(name, cls, "rejected", kind, v.detail))
    return entries


# --- the report ---------------------------------------------------------------------------

_LOOKS_LIKE = ("Norm", "MLP", "Mlp", "Experts", "Attention", "FeedForward")


def unrecognized(model, known):
    """Entries for the modules whose class name says norm / MLP / experts / attention that
    nothing patched or checked (``known``: ids of those that were)."""
    out = []
    for name, m in model.named_modules():
        if id(m) in known:
            continue
        cls = type(m).__name__
        if any(s in cls for s in _LOOKS_LIKE):
            if "Attention" in cls:
                why = "rotary embedding: patched for the table's model types only"
            elif _mlp_layout(m) is None and "Norm" not in cls:
                why = "no gate_proj / up_proj / down_proj (or gate_up_proj) gated layout"
            else:
                why = "no weight over the last dim with an eps (or variance_epsilon)"
            out.append(Entry(name or "(model)", cls, "not recognized", "", why))
    return out


class Report(list):
    """What :func:`fk.transformers.apply_fk` did to a model: a list of :class:`Entry`;
    ``str()`` groups them by status, class and kind."""

    def by_status(self, status):
        return [e for e in self if e.status == status]

    def __str__(self):
        lines = []
        for status in ("patched", "rejected", "off", "not recognized"):
            groups = {}
            for e in self.by_status(status):
                groups.setdefault((e.cls, e.kind, e.detail), []).append(e.name)
            if not groups:
                continue
            lines.append(f"{status}:")
            for (cls, kind, detail), names in groups.items():
                where = names[0] if len(names) == 1 else f"{len(names)} modules, e.g. {names[0]}"
                kind = f" [{kind}]" if kind else ""
                lines.append(f"  {cls}{kind} ({where}): {detail}")
        return "\n".join(lines) or "nothing patched, nothing checked"
