"""Liger Kernel's public API on fk's kernels: a Liger user switches with one import.

    import fk.liger as liger_kernel                         # or, path by path:
    from fk.liger.transformers import LigerRMSNorm, apply_liger_kernel_to_llama
    from fk.liger.transformers.functional import liger_cross_entropy
    from fk.liger.transformers.rope import liger_rotary_pos_emb

Modules keep Liger's names, constructor arguments, defaults and parameter names; functions
keep Liger's signatures; ``apply_liger_kernel_to_<model>`` keeps Liger's keywords and maps
them onto :func:`fk.transformers.apply_fk`. Options whose result fk cannot reproduce raise
``NotImplementedError`` naming them; options that only pick Liger's kernel variants or its
memory tactics (``in_place``, ``row_mode``) are accepted and have no effect on results.
"""
import importlib as _importlib


def __getattr__(name):
    # fk.liger.transformers imports nothing from Hugging Face until a patch function runs;
    # it still loads on first use, as Liger's subpackages do.
    if name == "transformers":
        return _importlib.import_module(".transformers", __name__)
    raise AttributeError(f"module 'fk.liger' has no attribute {name!r}")


__all__ = ["transformers"]
