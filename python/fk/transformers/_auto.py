"""Patching on load, and with ``transformers.Trainer``.

    model = fk.transformers.AutoFkModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    trainer = Trainer(model=model, ...)

or, for a model built elsewhere, ``callbacks=[fk.transformers.FkCallback()]`` in the Trainer.
"""
import inspect

from transformers import AutoModelForCausalLM, TrainerCallback


def _options(kwargs):
    """Pops apply_fk's keyword arguments out of ``kwargs``."""
    from . import apply_fk
    names = [n for n in inspect.signature(apply_fk).parameters if n != "model"]
    return {n: kwargs.pop(n) for n in names if n in kwargs}


class AutoFkModelForCausalLM:
    """``AutoModelForCausalLM`` whose models come out patched by
    :func:`fk.transformers.apply_fk`. Its keyword arguments (``rms_norm=``, ``strict=``,
    ``tiled_mlp=``, ...) may be given to ``from_pretrained`` / ``from_config`` with the
    others; the rest go to ``AutoModelForCausalLM``."""

    def __init__(self, *args, **kwargs):
        raise EnvironmentError("AutoFkModelForCausalLM is built with from_pretrained() or "
                               "from_config()")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        from . import apply_fk
        options = _options(kwargs)
        model = AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path,
                                                     *model_args, **kwargs)
        return apply_fk(model, **options)

    @classmethod
    def from_config(cls, config, **kwargs):
        from . import apply_fk
        options = _options(kwargs)
        return apply_fk(AutoModelForCausalLM.from_config(config, **kwargs), **options)


def _unwrap(model):
    """The Hugging Face model inside a DataParallel / DistributedDataParallel wrapper or a
    torch.compile'd module."""
    while not hasattr(model, "config"):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            break
        model = inner
    return model


class FkCallback(TrainerCallback):
    """Patches the Trainer's model with :func:`fk.transformers.apply_fk` (the given options)
    when training begins, unless it is patched already. For FSDP or DeepSpeed, patch before
    the Trainer wraps the model instead (``apply_fk(model)`` before ``Trainer(...)``, or
    :class:`AutoFkModelForCausalLM`): the checks of checked patching need whole parameters."""

    def __init__(self, **options):
        from . import apply_fk
        inspect.signature(apply_fk).bind(None, **options)  # unknown options fail here
        self.options = options

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from . import apply_fk, patched
        if model is None:
            return
        model = _unwrap(model)
        if not patched(model):
            apply_fk(model, **self.options)
