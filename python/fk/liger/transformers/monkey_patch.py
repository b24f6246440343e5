"""``apply_liger_kernel_to_<model>`` for the model types fk.transformers supports, mapped to
:func:`fk.transformers.apply_fk`.

With ``model=...`` the instance is patched (fk's own per-instance patching). With
``model=None`` (Liger's "patch before loading" use) the model type's
``<Prefix>PreTrainedModel.post_init`` is wrapped so that every model of that type built
afterwards is patched as it is constructed (``from_pretrained``, ``from_config``, the
constructor); :func:`revert_liger_kernel_patches` removes those wrappers. Models that already
exist are not changed (unlike Liger, whose class replacements reach the forward of existing
causal-LM instances).
"""
import functools
import importlib
import inspect
import logging

logger = logging.getLogger(__name__)

# model type -> (keyword of the gate: "swiglu" or "geglu", Liger's default for cross_entropy,
# Liger's default for fused_linear_cross_entropy)
_TYPES = {
    "llama": ("swiglu", False, True), "mistral": ("swiglu", False, True),
    "mixtral": ("swiglu", False, True), "qwen2": ("swiglu", False, True),
    "qwen3": ("swiglu", False, True), "qwen3_moe": ("swiglu", False, True),
    "gemma": ("geglu", False, True), "gemma2": ("geglu", False, True),
    "gemma3_text": ("geglu", False, True), "phi3": ("swiglu", False, True),
    "olmo2": ("swiglu", False, True), "granite": ("swiglu", True, False),
}

# model type -> the original post_init of its PreTrainedModel class, while wrapped.
_HOOKED = {}


def _flags(gate, rope, cross_entropy, fused_linear_cross_entropy, rms_norm, gate_on):
    if cross_entropy and fused_linear_cross_entropy:
        raise ValueError("cross_entropy and fused_linear_cross_entropy cannot both be True.")
    return dict(rope=rope, cross_entropy=cross_entropy,
                fused_linear_cross_entropy=fused_linear_cross_entropy, rms_norm=rms_norm,
                swiglu=gate_on and gate == "swiglu", geglu=gate_on and gate == "geglu",
                layer_norm=False)


def _pretrained_class(model_type):
    from ...transformers._table import MODELS
    spec = MODELS[model_type]
    modeling = importlib.import_module(
        f"transformers.models.{spec.module}.modeling_{spec.module}")
    prefix = spec.causal_lm[:-len("ForCausalLM")]
    return getattr(modeling, f"{prefix}PreTrainedModel")


def _hook(model_type, flags):
    from ...transformers import apply_fk
    cls = _pretrained_class(model_type)
    original = _HOOKED.get(model_type, (None, cls.__dict__.get("post_init")))[1]
    base = original if original is not None else cls.post_init

    @functools.wraps(base)
    def post_init(self, *args, **kwargs):
        out = base(self, *args, **kwargs)
        if getattr(getattr(self, "config", None), "model_type", None) == model_type:
            apply_fk(self, **flags)
        return out

    cls.post_init = post_init
    _HOOKED[model_type] = (cls, original)


def revert_liger_kernel_patches():
    """Remove every ``post_init`` wrapper installed by ``apply_liger_kernel_to_<model>()``
    without a model (instances already patched stay patched: ``fk.transformers.revert_fk``
    undoes those)."""
    for cls, original in _HOOKED.values():
        if original is None:
            del cls.post_init
        else:
            cls.post_init = original
    _HOOKED.clear()


def _make(model_type):
    gate, ce_default, flce_default = _TYPES[model_type]

    def apply(rope=True, cross_entropy=ce_default,
              fused_linear_cross_entropy=flce_default, rms_norm=True, gate_on=True,
              model=None):
        flags = _flags(gate, rope, cross_entropy, fused_linear_cross_entropy, rms_norm, gate_on)
        if model is not None:
            from ...transformers import apply_fk
            apply_fk(model, **flags)
        else:
            _hook(model_type, flags)

    # Liger's signature: the gate's keyword is swiglu= or geglu= by model.
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
              for n, d in (("rope", True), ("cross_entropy", ce_default),
                           ("fused_linear_cross_entropy", flce_default), ("rms_norm", True),
                           (gate, True), ("model", None))]

    def wrapper(*args, **kwargs):
        bound = inspect.Signature(params).bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        a["gate_on"] = a.pop(gate)
        apply(**a)

    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__name__ = wrapper.__qualname__ = f"apply_liger_kernel_to_{model_type}"
    wrapper.__doc__ = (f"Liger's ``apply_liger_kernel_to_{model_type}`` on fk: patch ``model`` "
                       f"(or, with model=None, every {model_type} model built from now on) "
                       f"through fk.transformers.apply_fk.")
    return wrapper


MODEL_TYPE_TO_APPLY_LIGER_FN = {t: _make(t) for t in _TYPES}
# Liger names Gemma 3's text model apply_liger_kernel_to_gemma3_text.
for _t, _fn in MODEL_TYPE_TO_APPLY_LIGER_FN.items():
    globals()[_fn.__name__] = _fn


def _apply_liger_kernel(model_type: str, **kwargs) -> None:
    """Liger's patch-by-model-type entry: the keywords the model type's function takes."""
    fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if fn is None:
        logger.info("There are currently no fk kernels supported for model type: %s.",
                    model_type)
        return
    names = inspect.signature(fn).parameters
    fn(**{k: v for k, v in kwargs.items() if k in names})


def _apply_liger_kernel_to_instance(model, **kwargs) -> None:
    """Patch one model instance by its ``config.model_type`` (unsupported types: logged,
    nothing changed, as in Liger); keywords the type's function does not take are dropped."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if fn is None:
        logger.info("There are currently no fk kernels supported for model type: %s.",
                    model_type)
        return
    names = inspect.signature(fn).parameters
    fn(model=model, **{k: v for k, v in kwargs.items() if k in names and k != "model"})


__all__ = ["MODEL_TYPE_TO_APPLY_LIGER_FN", "revert_liger_kernel_patches", "_apply_liger_kernel",
           "_apply_liger_kernel_to_instance"] + [
    f.__name__ for f in MODEL_TYPE_TO_APPLY_LIGER_FN.values()]
