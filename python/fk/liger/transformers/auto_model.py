"""``AutoLigerKernelForCausalLM``: ``AutoModelForCausalLM`` with fk's kernels patched in."""
import inspect

from .monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance


class AutoLigerKernelForCausalLM:
    """``from_pretrained`` / ``from_config`` as ``AutoModelForCausalLM``'s; keywords of the
    model type's ``apply_liger_kernel_to_<type>`` (``rope=``, ``swiglu=``, ...) are taken
    out and used to patch the model built (unsupported model types load unpatched)."""

    @classmethod
    def _split(cls, kwargs):
        names = set()
        for fn in MODEL_TYPE_TO_APPLY_LIGER_FN.values():
            names.update(inspect.signature(fn).parameters)
        names.discard("model")
        return ({k: kwargs.pop(k) for k in list(kwargs) if k in names}, kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        from transformers import AutoModelForCausalLM
        patch, kwargs = cls._split(kwargs)
        model = AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path,
                                                     *model_args, **kwargs)
        _apply_liger_kernel_to_instance(model, **patch)
        return model

    @classmethod
    def from_config(cls, config, **kwargs):
        from transformers import AutoModelForCausalLM
        patch, kwargs = cls._split(kwargs)
        model = AutoModelForCausalLM.from_config(config, **kwargs)
        _apply_liger_kernel_to_instance(model, **patch)
        return model
