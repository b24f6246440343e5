"""The one mechanism: find the table's classes in a model and bind fk forwards to those
instances, remembering what each instance held so that ``revert`` restores it exactly.

Only instance attributes change (``forward``, ``_apply_gate``, ``_loss_function``; the head's
``forward`` along with the fused loss); classes, parameters and buffers are never touched, so
other models of the same class are unaffected and the state dict stays the same.
"""
import collections
import dataclasses
import importlib
import inspect
from types import MethodType

import torch

from . import _forwards as fw
from ._table import MODELS

# Per patched module: {"kinds": [kind, ...], "attrs": {name: (present, value)}}.
_SAVED = "_fk_saved"

KINDS = ("rms_norm", "rope", "swiglu", "geglu", "cross_entropy", "fused_linear_cross_entropy",
         "layer_norm")
# Switched on by their keyword (off by default); they replace a kind of KINDS where they apply.
OPT_IN_KINDS = ("tiled_mlp",)


def _set(module, kind, **attrs):
    d = module.__dict__
    saved = d.setdefault(_SAVED, {"kinds": [], "attrs": {}})
    if kind is not None:  # None: a helper of another module's kind, not counted by patched
        saved["kinds"].append(kind)
    for name, value in attrs.items():
        if name not in saved["attrs"]:
            saved["attrs"][name] = (name in d, d.get(name))
        d[name] = value


def _bind(module, f, **kw):
    """``f`` bound to ``module`` with keyword arguments ``kw``, as a plain Python function
    (torch.compile needs a forward with a code object; a functools.partial has none)."""
    if not kw:
        return MethodType(f, module)

    def bound(self, *args, **kwargs):
        return f(self, *args, **kwargs, **kw)

    bound.__name__, bound.__qualname__, bound.__doc__ = f.__name__, f.__qualname__, f.__doc__
    return MethodType(bound, module)


def _model_class(m):
    """The module's class as the model defines it. FSDP2's ``fully_shard`` gives a module it
    shards a class of its own, ``FSDP<name>(FSDPModule, <name>)``: that is the class after
    FSDP's in the MRO (so a model sharded before it is patched is patched the same)."""
    t = type(m)
    if not torch.distributed.is_available():
        return t
    from torch.distributed.fsdp import FSDPModule
    if not isinstance(m, FSDPModule):
        return t
    return next(c for c in t.__mro__[1:] if not issubclass(c, FSDPModule))


def apply(model, flags):
    """Patches ``model``: the table's classes for its model type; with ``strict`` False, or
    None on a model type outside the table, also every other module that passes its check
    (``_verify.py``). ``strict`` True: the table only (an unknown model type raises)."""
    flags = dict(flags)
    strict = flags.pop("strict", True)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    spec = MODELS.get(model_type)
    if spec is None and (strict or config is None):
        raise ValueError(f"fk.transformers.apply_fk: model type {model_type!r} is not "
                         f"supported; supported model types: {', '.join(sorted(MODELS))}"
                         + ("" if config is None else
                            " (strict=False patches the modules of other models that pass "
                            "a numerical check)"))
    revert(model)  # patching twice gives the same model as patching once
    if spec is not None:
        _apply_table(model, spec, flags)
    # A Llava / PaliGemma around a language model outside the table: its modules are
    # checked as another model's would be (strict None), or left (strict True).
    unknown_language = spec is not None and spec.language_row and _language_spec(model) is None
    if spec is None or strict is False or (unknown_language and strict is None):
        from . import _verify
        skip = {id(m) for m in model.modules() if _SAVED in m.__dict__}
        entries = _verify.patch_checked(model, flags, skip, _set, _bind)
        model.__dict__[_verify.REPORT] = entries
    return model


def _language_spec(model):
    """The table's row for the language model of a ``language_row`` model (Llava,
    PaliGemma), or None when its model type has none (or only a row of its own kind)."""
    text_type = getattr(getattr(model.config, "text_config", None), "model_type", None)
    spec = MODELS.get(text_type)
    if spec is None or spec.language_row or spec.output is not None:
        return None
    return spec


def _modeling(spec):
    return importlib.import_module(f"transformers.models.{spec.module}.modeling_{spec.module}")


def _apply_table(model, spec, flags):
    modeling = _modeling(spec)
    causal_lm = getattr(modeling, spec.causal_lm) if spec.causal_lm else None
    head_spec = spec
    if spec.language_row:  # the language model's modules by its own model type's row
        spec = _language_spec(model) or dataclasses.replace(spec, language_row=False)
    module_modeling = _modeling(spec)

    def classes(names):
        return tuple(getattr(module_modeling, n) for n in names)

    norms, mlps, fused_mlps, experts, attentions = map(
        classes, (spec.rms_norms, spec.mlps, spec.fused_mlps, spec.experts, spec.attentions))
    layer_norms = classes(spec.layer_norms)
    bmm_experts = classes(spec.bmm_experts)

    for m in model.modules():
        t = _model_class(m)
        if t in norms:
            if flags["rms_norm"]:
                _set(m, "rms_norm", forward=_bind(m, fw.rms_norm_forward, norm=spec.norm))
        elif t in mlps and flags.get("tiled_mlp") and not spec.mlp_multipliers:
            gate = fw.gate_for(_act(m), True, True)
            if gate is not None:
                _set(m, "tiled_mlp", forward=_bind(m, fw.tiled_mlp_forward, gate=gate,
                                                   num_shards=flags.get("num_shards"),
                                                   dropout=spec.mlp_dropout))
        elif t in bmm_experts:
            gate = fw.gate_for(m.act_fn, flags["swiglu"], flags["geglu"])
            if gate is not None:
                _set(m, "swiglu" if gate == "swiglu" else "geglu",
                     forward=_bind(m, fw.bmm_experts_forward, gate=gate))
        elif t in mlps or t in fused_mlps or t in experts:
            act = m.activation_fn if t in fused_mlps else _act(m)
            gate = fw.gate_for(act, flags["swiglu"], flags["geglu"])
            if gate is None:
                continue
            kind = "swiglu" if gate == "swiglu" else "geglu"
            if t in mlps:
                _set(m, kind, forward=_bind(m, fw.mlp_forward, gate=gate,
                                            dropout=spec.mlp_dropout,
                                            multipliers=spec.mlp_multipliers))
            elif t in fused_mlps:
                _set(m, kind, forward=_bind(m, fw.fused_mlp_forward, gate=gate))
            else:
                _set(m, kind, _apply_gate=_bind(m, fw.experts_apply_gate, gate=gate),
                     forward=_bind(m, fw.experts_forward))
        elif t in layer_norms:
            # fk.layer_norm's weight spans the last dim only (Cohere's q / k norms have one
            # per head: those stay Hugging Face's).
            weight = getattr(m, "weight", None)
            if flags["layer_norm"] and (weight is None or weight.dim() == 1):
                _set(m, "layer_norm",
                     forward=_bind(m, fw.model_layer_norm_forward, spec=spec.layer_norm))
        elif t in attentions:
            if flags["rope"]:
                _set(m, "rope", forward=_bind(m, fw.rope_forward(t, spec.rope_style)))
        elif t is causal_lm:
            if flags["fused_linear_cross_entropy"]:
                forward = _bind(m, fw.causal_lm_forward, spec=head_spec, modeling=modeling)
                # generate() checks its keyword arguments (pixel_values, ...) against the
                # forward's signature: show it the original one.
                forward.__func__.__signature__ = inspect.signature(t.forward)
                _set(m, "fused_linear_cross_entropy", forward=forward)
                # The loss runs inside the head's call (hooks on the head, such as FSDP2's
                # gathering its sharded weight, run around it): see fw.lm_head_forward.
                head = getattr(m, "lm_head", None)
                if isinstance(head, torch.nn.Linear):
                    _set(head, None, forward=_bind(head, fw.lm_head_forward))
            if flags["cross_entropy"] and getattr(m, "loss_type", None) in (
                    None, "ForCausalLM", "ForConditionalGeneration"):
                _set(m, "cross_entropy", _loss_function=fw.causal_lm_loss)
        elif t is torch.nn.LayerNorm:
            if flags["layer_norm"] and len(m.normalized_shape) == 1:
                _set(m, "layer_norm", forward=_bind(m, fw.layer_norm_forward))


def _act(mlp):
    """A gate / up / down MLP's activation module (``act_fn``; Llama 4's: ``activation_fn``)."""
    act = getattr(mlp, "act_fn", None)
    return act if act is not None else getattr(mlp, "activation_fn", None)


def revert(model):
    model.__dict__.pop("_fk_report", None)
    for m in model.modules():
        saved = m.__dict__.pop(_SAVED, None)
        if saved is None:
            continue
        for name, (present, value) in saved["attrs"].items():
            if present:
                m.__dict__[name] = value
            else:
                m.__dict__.pop(name, None)
    return model


def patched(model):
    """{kind: number of modules} that fk currently replaces in ``model``."""
    counts = collections.Counter()
    for m in model.modules():
        counts.update(m.__dict__.get(_SAVED, {}).get("kinds", ()))
    return dict(counts)


def report(model):
    """What fk did to ``model`` (see ``_verify.Report``): each patched module with its kind
    (from the table, or checked), each checked and rejected one with the reason, and the
    modules that look like norms, MLPs or attention that nothing recognized."""
    from . import _verify
    checked = model.__dict__.get(_verify.REPORT, [])
    names = {id(m): n or "(model)" for n, m in model.named_modules()}
    by_name = {e.name for e in checked}
    entries, known = [], set()
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for m in model.modules():
        saved = m.__dict__.get(_SAVED)
        if saved is not None:
            known.add(id(m))
            if names[id(m)] not in by_name:
                for kind in saved["kinds"]:
                    entries.append(_verify.Entry(names[id(m)], type(m).__name__, "patched",
                                                 kind, f"table ({model_type})"))
    known |= {id(m) for m in model.modules() if names[id(m)] in by_name}
    return _verify.Report(entries + list(checked) + _verify.unrecognized(model, known))
