"""fk for Hugging Face Transformers models: one line patches a model instance.

    import fk.transformers
    model = AutoModelForCausalLM.from_config(config)
    fk.transformers.apply_fk(model)        # fk kernels in this model (and only this one)
    fk.transformers.revert_fk(model)       # back to the original, exactly

What is replaced, per module kind (each switched by the keyword of the same name):

- ``rms_norm``: every RMSNorm of the model (including Qwen 3's and Gemma 3's q/k norms and
  OLMo 2's), with the model's own rounding: Llama-style, Gemma-style (``offset=1``, float32
  throughout: also Qwen3-Next's) or OLMo 2-style (float32 product with the weight: also
  GPT-OSS's); Llama 4's weightless q/k L2Norm as an RMSNorm without weight. Gated norms
  (a second input: Qwen3-Next's and Falcon-H1's ``...RMSNormGated``) stay Hugging Face's.
- ``rope``: the rotary embedding in attention, q and k in one launch: rotate-half (Llama;
  GPT-OSS's with one cos/sin value per pair), or interleaved pairs ``(x[2i], x[2i+1])``
  (GLM, ERNIE 4.5, Cohere; DeepSeek-V3's ``rope_interleave``, whose output is
  de-interleaved, on the MLA rotary part), Llama 4's complex rotation
  (``fk.llama4_rope``); partial rotary where the model has it (Phi, Phi-3, GLM with
  ``partial_rotary_factor``, Qwen3-Next).
- ``swiglu`` / ``geglu``: the gate of the MLPs (``act(gate_proj(x)) * up_proj(x)``), by the
  model's activation: SiLU -> swiglu, tanh GELU (Gemma) -> geglu "tanh", exact GELU -> geglu
  "none"; also the stacked ``gate_up_proj`` of Phi-3 and GLM / GLM-4, Falcon-H1's MLP with
  its gate / down multipliers, and the MoE experts of Mixtral / Qwen3-MoE / DeepSeek-V3 /
  Granite MoE / Qwen3-Next / Llama 4. MLPs without a gate (Phi's, StarCoder 2's) and
  GPT-OSS's clamped experts stay Hugging Face's.
- ``fused_linear_cross_entropy``: in training (``model.training`` and ``labels`` given) the
  causal-LM loss comes from the hidden states through ``fk.fused_linear_cross_entropy``:
  the ``(tokens, vocab)`` logits are never built and ``outputs.logits`` is None. Hugging
  Face's conventions hold: labels shifted inside, ``ignore_index=-100``,
  ``num_items_in_batch`` (a sum divided by it, for gradient accumulation), ``shift_labels``,
  ``logits_to_keep``, Gemma's final logit softcapping, Granite's ``logits_scaling``,
  Cohere's ``logit_scale``, Falcon-H1's ``lm_head_multiplier``, and the MoE router
  auxiliary loss. In eval mode or without
  labels the model's forward runs as before and returns logits.
- ``cross_entropy``: where logits are built (eval with labels, or with
  ``fused_linear_cross_entropy=False``), the loss through ``fk.cross_entropy``.
- ``layer_norm``: any ``torch.nn.LayerNorm`` over the last dimension (Phi's, StarCoder 2's),
  and the models' own LayerNorms: Cohere's (no bias) and OLMo's (no weight, no bias), all
  float32 inside and rounded once, as theirs. Cohere's q / k norms (a weight per head) stay.
- ``tiled_mlp`` (off by default): the whole ``gate_proj`` / ``up_proj`` / ``down_proj`` MLP
  of the SwiGLU and GeGLU models (not the stacked MLPs of Phi-3 / GLM nor MoE experts) runs as
  ``fk.nn.TiledSwiGLUMLP`` / ``TiledGEGLUMLP`` would, on the module's own parameters: over
  the tokens in ``num_shards`` shards (None: ``ceil(seq / hidden_size)``), keeping no
  activations for the backward, which recomputes them shard by shard. It takes the place
  of ``swiglu`` / ``geglu`` on those modules. For very long sequences.

Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE; their
``...ForConditionalGeneration``): the language model as above (its multimodal RoPE cos/sin
are combined by the model's rotary-embedding module, so ``rope`` is the plain rotate-half
rotation; Qwen3-VL-MoE's experts are left as they are), the loss through the model's forward
with images or video as inputs, and in the vision tower the modules that are exactly fk's:
torch LayerNorms (Qwen2-VL, Qwen3-VL) and Qwen2.5-VL's RMSNorms and gated SiLU MLP. The vision
attention and the non-gated vision MLPs keep Hugging Face's code. Likewise Gemma 3
(``Gemma3ForConditionalGeneration``), Llava and PaliGemma (their language model by its own
model type's row: Llama, Mistral, Gemma, Gemma 2, ...; a language model outside the table
is patched checked, unless ``strict=True``) and Mllama: the language model's
modules, the loss (with the labels and token types passed on to the base model where its
attention mask depends on them), and the vision towers' torch LayerNorms.

Distributed training runs on torch's own engines. Under DDP, and under FSDP2
(``torch.distributed.fsdp.fully_shard``) per decoder layer and on the root, a patched model
trains as the unpatched one does, with ``num_items_in_batch`` for gradient accumulation and
activation checkpointing on top; ``apply_fk`` may come before or after ``fully_shard``
(whose classes it sees through). The fused loss runs inside the head's call (the head
module gets fk's forward for that, its own without labels), so a head sharded as its own
FSDP unit is gathered for it and its gradient reduce-scattered like any other; in the root
unit it is gathered with the root. Tied embeddings must stay in one unit with the head (as
FSDP2 requires of shared parameters: sharding the head alone unties them, with or without
fk). A head still distributed in the loss (tensor-parallel) raises; use
``fused_linear_cross_entropy=False`` there. The norms, rope, gates and cross entropy take
DTensors (see ``fk/ops/_sharding.py``), so modules parallelized with
``torch.distributed.tensor.parallel`` (SequenceParallel norms) keep fk's kernels.

Other models (``strict``): on a model type outside the table, or on any model with
``strict=False``, the modules the table does not name are found by what they are (a norm: a
1-D ``weight`` and an ``eps`` / ``variance_epsilon``; a gated MLP: ``gate_proj`` /
``up_proj`` / ``down_proj`` and an activation fk has; the causal-LM head and its loss) and
each is patched only if its own forward and fk's agree on a small random input (output and
gradients, within the dtype's tolerance; once per module class and configuration). Rotary
embeddings are patched for the table's model types only. :func:`report` tells what was
patched, what was checked and rejected (and why) and what was not recognized.
``strict=True``: the table only; another model type raises ``ValueError``.

On load and with the Trainer: ``AutoFkModelForCausalLM.from_pretrained(path, **options)``
(or ``.from_config``) returns the patched model (apply_fk's keywords among the others); a
model built elsewhere can be patched by ``apply_fk(model)`` before ``Trainer(model=...)``, or
by ``Trainer(..., callbacks=[FkCallback(**options)])`` when training begins (patch before
the Trainer wraps the model for FSDP / DeepSpeed).

Only instance attributes change; classes, parameters and buffers are untouched, so other
instances of the same classes keep Hugging Face's code and the state dict is unchanged.
Mixed dtypes (float32 weights under autocast): the norms cast their weight to the input's
dtype and return that dtype; the fused loss runs in the autocast dtype.
"""
from typing import Optional

from ._patch import KINDS, OPT_IN_KINDS, apply as _apply, patched, report, revert as _revert
from ._table import MODELS

#: The ``config.model_type`` values apply_fk knows.
SUPPORTED_MODEL_TYPES = tuple(sorted(MODELS))


def apply_fk(model, rms_norm: bool = True, rope: bool = True, swiglu: bool = True,
             geglu: bool = True, cross_entropy: bool = True,
             fused_linear_cross_entropy: bool = True, layer_norm: bool = True,
             tiled_mlp: bool = False, num_shards: Optional[int] = None,
             strict: Optional[bool] = None):
    """Patch ``model`` (a Hugging Face ``PreTrainedModel`` instance: a ``...ForCausalLM`` or
    its base model; for the vision-language types, the ``...ForConditionalGeneration``) to
    run fk's kernels. Returns ``model``.

    ``strict``: None (default) patches a model type of :data:`SUPPORTED_MODEL_TYPES` by the
    table and any other one by checked patching (see the module's doc); False adds checked
    patching of what the table leaves to a supported type; True raises ``ValueError``
    naming the supported model types when ``model.config.model_type`` is not one of them.
    Calling it again re-patches with the new options (it reverts first), so patching twice
    is the same as patching once.
    """
    return _apply(model, dict(rms_norm=rms_norm, rope=rope, swiglu=swiglu, geglu=geglu,
                              cross_entropy=cross_entropy,
                              fused_linear_cross_entropy=fused_linear_cross_entropy,
                              layer_norm=layer_norm, tiled_mlp=tiled_mlp,
                              num_shards=num_shards, strict=strict))


def revert_fk(model):
    """Undo :func:`apply_fk` on ``model``: every patched module gets back exactly the
    attributes it had. Harmless on a model that is not patched. Returns ``model``."""
    return _revert(model)


def __getattr__(name):  # transformers is imported only when these are asked for
    if name in ("AutoFkModelForCausalLM", "FkCallback"):
        from . import _auto
        return getattr(_auto, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["apply_fk", "revert_fk", "patched", "report", "SUPPORTED_MODEL_TYPES", "KINDS",
           "OPT_IN_KINDS", "AutoFkModelForCausalLM", "FkCallback"]
