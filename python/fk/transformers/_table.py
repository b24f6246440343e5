"""Which Hugging Face classes fk replaces, per model type.

One row per ``config.model_type``. A row names classes of the model's modeling module; the
generic mechanism in ``_patch.py`` finds their instances in a model and gives each the fk
forward of its kind (``_forwards.py``). Nothing here is model code.
"""
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class NormSpec:
    """How a model's RMSNorm rounds: see ``fk.rms_norm``'s ``casting_mode``."""
    offset: float
    casting_mode: str
    eps_attr: str


LLAMA_NORM = NormSpec(offset=0.0, casting_mode="llama", eps_attr="variance_epsilon")
# Gemma stores weight - 1 and computes everything in float32, rounding once at the end.
GEMMA_NORM = NormSpec(offset=1.0, casting_mode="gemma", eps_attr="eps")
# OLMo 2 multiplies the float32 normalized values by the weight before rounding.
OLMO2_NORM = NormSpec(offset=0.0, casting_mode="gemma", eps_attr="variance_epsilon")
# Llama's rounding with the epsilon in ``eps`` (Llama 4's RMSNorm, and its weightless L2Norm).
LLAMA_EPS_NORM = NormSpec(offset=0.0, casting_mode="llama", eps_attr="eps")


@dataclass(frozen=True)
class LayerNormSpec:
    """A model's own LayerNorm class (mean-centred, float32 inside, rounded once at the end,
    as ``fk.layer_norm``): where its epsilon is, or its fixed value."""
    eps_attr: Optional[str] = None
    eps: float = 1e-5


# Cohere: a weight and no bias; the weight is applied in float32 before the one rounding.
COHERE_LAYER_NORM = LayerNormSpec(eps_attr="variance_epsilon")
# OLMo: no weight and no bias, epsilon fixed at 1e-5.
OLMO_LAYER_NORM = LayerNormSpec(eps=1e-5)


@dataclass(frozen=True)
class ModelSpec:
    module: str                       # the modeling module, under transformers.models
    norm: NormSpec
    rms_norms: Tuple[str, ...]        # RMSNorm classes (every norm of the model: q/k norms too)
    mlps: Tuple[str, ...] = ()        # gate_proj / up_proj / down_proj / act_fn MLPs
    fused_mlps: Tuple[str, ...] = ()  # gate_up_proj / down_proj / activation_fn (Phi-3)
    experts: Tuple[str, ...] = ()     # MoE experts with a stacked gate_up_proj parameter
    # MoE experts run as one bmm over (experts, tokens, hidden) inputs, gate_up_proj of shape
    # (experts, hidden, 2 * inter) (Llama 4)
    bmm_experts: Tuple[str, ...] = ()
    attentions: Tuple[str, ...] = ()  # call the module-level apply_rotary_pos_emb
    causal_lm: Optional[str] = None   # the ...ForCausalLM (...ForConditionalGeneration) class
    moe: bool = False                 # router aux loss (output_router_logits)
    logits_scaling: bool = False      # logits divided by config.logits_scaling (Granite)
    softcap: bool = False             # config.final_logit_softcapping (Gemma 2 / 3)
    logit_scale: bool = False         # logits multiplied by the head's logit_scale (Cohere)
    # logits multiplied by this attribute of the causal LM (a dotted path: Falcon-H1's
    # "model.lm_head_multiplier")
    logit_multiplier: Optional[str] = None
    # The model's apply_rotary_pos_emb: "half" (Llama's rotate_half), "interleaved" (pairs
    # (2i, 2i+1), cos / sin already repeated per pair: Cohere), "glm" (pairs (2i, 2i+1) with
    # the first half of cos / sin repeated per pair, partial rotary: GLM, ERNIE 4.5),
    # "pair" (rotate-half with one cos / sin value per pair: GPT-OSS), "deepseek" (rotate-half,
    # and its apply_rotary_pos_emb_interleave), "llama4" (its complex apply_rotary_emb).
    rope_style: str = "half"
    layer_norms: Tuple[str, ...] = ()  # the model's own LayerNorm classes (torch's: generic)
    layer_norm: Optional[LayerNormSpec] = None
    mlp_dropout: Optional[str] = None  # the MLP's attribute: dropout p on its output (Seed-OSS)
    # the MLP's gate_multiplier (on gate_proj's output, before the activation) and
    # down_multiplier (on its output): Falcon-H1
    mlp_multipliers: bool = False
    # Vision-language models (the causal_lm class is their ...ForConditionalGeneration): the
    # language model's settings are in config.text_config, the output class (named here) also
    # carries rope_deltas, and the MoE router loss is added only when output_router_logits is
    # passed to the forward.
    output: Optional[str] = None
    # The base model takes the labels too (Gemma 3's and PaliGemma's: their attention mask
    # depends on them in training).
    labels_to_base: bool = False
    # The language model is any model type (Llava, PaliGemma): its modules are patched by
    # the row of config.text_config.model_type (norm, MLP, attention, rotary style), this
    # row giving the ...ForConditionalGeneration and its loss.
    language_row: bool = False


def _dense(prefix, module, norm=LLAMA_NORM, **kw):
    return ModelSpec(module=module, norm=norm,
                     rms_norms=kw.pop("rms_norms", (f"{prefix}RMSNorm",)),
                     mlps=kw.pop("mlps", (f"{prefix}MLP",)), attentions=(f"{prefix}Attention",),
                     causal_lm=f"{prefix}ForCausalLM", **kw)


MODELS = {
    "llama": _dense("Llama", "llama"),
    "mistral": _dense("Mistral", "mistral"),
    "mixtral": _dense("Mixtral", "mixtral", mlps=(), experts=("MixtralExperts",), moe=True),
    "qwen2": _dense("Qwen2", "qwen2"),
    "qwen3": _dense("Qwen3", "qwen3"),
    "qwen3_moe": _dense("Qwen3Moe", "qwen3_moe", experts=("Qwen3MoeExperts",), moe=True),
    "gemma": _dense("Gemma", "gemma", norm=GEMMA_NORM),
    "gemma2": _dense("Gemma2", "gemma2", norm=GEMMA_NORM, softcap=True),
    "gemma3_text": _dense("Gemma3", "gemma3", norm=GEMMA_NORM, softcap=True),
    "phi3": _dense("Phi3", "phi3", mlps=(), fused_mlps=("Phi3MLP",)),
    "olmo2": _dense("Olmo2", "olmo2", norm=OLMO2_NORM),
    "granite": _dense("Granite", "granite", logits_scaling=True),
    # GLM / GLM-4: Phi-3's stacked gate_up_proj MLP; interleaved partial rotary.
    "glm": _dense("Glm", "glm", mlps=(), fused_mlps=("GlmMLP",), rope_style="glm"),
    "glm4": _dense("Glm4", "glm4", mlps=(), fused_mlps=("Glm4MLP",), rope_style="glm"),
    # OLMo: a LayerNorm with no weight and no bias (fk.layer_norm with both None).
    "olmo": _dense("Olmo", "olmo", rms_norms=(), layer_norms=("OlmoLayerNorm",),
                   layer_norm=OLMO_LAYER_NORM),
    "olmo3": _dense("Olmo3", "olmo3", norm=OLMO2_NORM),
    "smollm3": _dense("SmolLM3", "smollm3"),
    # Phi: torch LayerNorms (the generic layer_norm kind); its fc1 / gelu / fc2 MLP has no gate
    # and stays Hugging Face's.
    "phi": _dense("Phi", "phi", rms_norms=(), mlps=()),
    # StarCoder 2: torch LayerNorms; its c_fc / gelu / c_proj MLP has no gate and stays.
    "starcoder2": _dense("Starcoder2", "starcoder2", rms_norms=(), mlps=()),
    # Cohere / Cohere 2: a bias-free LayerNorm, interleaved rotary, logits times logit_scale.
    # Cohere's optional q / k norms have a (heads, head_dim) weight: fk.layer_norm takes a
    # weight over the last dim only, so they stay Hugging Face's.
    "cohere": _dense("Cohere", "cohere", rms_norms=(), layer_norms=("CohereLayerNorm",),
                     layer_norm=COHERE_LAYER_NORM, rope_style="interleaved",
                     logit_scale=True),
    "cohere2": _dense("Cohere2", "cohere2", rms_norms=(), layer_norms=("Cohere2LayerNorm",),
                      layer_norm=COHERE_LAYER_NORM, rope_style="interleaved",
                      logit_scale=True),
    "exaone4": _dense("Exaone4", "exaone4"),
    # ERNIE 4.5: GLM's interleaved rotary over the whole head, in float32.
    "ernie4_5": _dense("Ernie4_5", "ernie4_5", rope_style="glm"),
    "hunyuan_v1_dense": _dense("HunYuanDenseV1", "hunyuan_v1_dense"),
    # Seed-OSS: its MLP ends with a dropout of p = residual_dropout (kept, in training).
    "seed_oss": _dense("SeedOss", "seed_oss", mlp_dropout="residual_dropout"),
}


def _vision_language(prefix, module, mlps, attention=None, norm=None, moe=False):
    """A Qwen-VL row: the language model's norms, MLPs and attention (the multimodal rotary
    embedding module combines the t/h/w sections into one (batch, seq, head_dim) cos/sin,
    which the attention applies through the plain rotate-half ``apply_rotary_pos_emb``)."""
    return ModelSpec(module=module, norm=LLAMA_NORM, rms_norms=(norm or f"{prefix}RMSNorm",),
                     mlps=mlps, attentions=(attention or f"{prefix}Attention",),
                     causal_lm=f"{prefix}ForConditionalGeneration", moe=moe,
                     output=f"{prefix}CausalLMOutputWithPast")


MODELS.update({
    # Qwen2-VL's vision tower has torch LayerNorms (the layer_norm kind) and a non-gated
    # quick-GELU MLP (not patched).
    "qwen2_vl": _vision_language("Qwen2VL", "qwen2_vl", mlps=("Qwen2MLP",)),
    # Qwen2.5-VL's vision tower has the same Llama-style RMSNorm class as the language model
    # and a gated MLP with biases (Qwen2_5_VLMLP, SiLU for the released models): both are
    # patched as well.
    "qwen2_5_vl": _vision_language("Qwen2_5_VL", "qwen2_5_vl",
                                   mlps=("Qwen2MLP", "Qwen2_5_VLMLP")),
    # Qwen3-VL: q/k norms; the vision tower has torch LayerNorms and a non-gated MLP.
    "qwen3_vl": _vision_language("Qwen3VL", "qwen3_vl", mlps=("Qwen3VLTextMLP",),
                                 attention="Qwen3VLTextAttention", norm="Qwen3VLTextRMSNorm"),
    # The MoE experts (Qwen3VLMoeTextExperts) are left to Hugging Face; the dense MLPs of the
    # mlp_only_layers are patched.
    "qwen3_vl_moe": _vision_language("Qwen3VLMoe", "qwen3_vl_moe", mlps=("Qwen3VLMoeTextMLP",),
                                     attention="Qwen3VLMoeTextAttention",
                                     norm="Qwen3VLMoeTextRMSNorm", moe=True),
})


MODELS.update({
    # GPT-OSS: RMSNorm rounding as OLMo 2's; rotate-half with one cos / sin value per pair.
    # Its experts (clamped SwiGLU with alpha and limit, (up + 1) * glu, on interleaved
    # gate / up columns) and its attention sinks (in the attention function, not the rope)
    # stay Hugging Face's.
    "gpt_oss": ModelSpec(module="gpt_oss", norm=OLMO2_NORM, rms_norms=("GptOssRMSNorm",),
                         attentions=("GptOssAttention",), causal_lm="GptOssForCausalLM",
                         moe=True, rope_style="pair"),
    # DeepSeek-V3: MLA attention's rotary part (q_rot / k_rot) through rope_style "deepseek"
    # (with or without config.rope_interleave); its q_a / kv_a norms are the same RMSNorm
    # class; dense MLPs of the first layers and the routed experts (shared experts are a
    # DeepseekV3MLP). No router loss in its causal LM.
    "deepseek_v3": _dense("DeepseekV3", "deepseek_v3", experts=("DeepseekV3Experts",),
                          rope_style="deepseek"),
    # Granite MoE: Granite's logits_scaling, Mixtral's expert layout and router loss.
    "granitemoe": _dense("GraniteMoe", "granitemoe", mlps=(), experts=("GraniteMoeExperts",),
                         moe=True, logits_scaling=True),
    # Qwen3-Next: Gemma-style (1 + weight) RMSNorm in float32 with its epsilon in "eps" (the
    # layer norms, the final norm and the full-attention layers' q / k norms); partial
    # rotate-half rotary. The gated delta-net layers and their Qwen3NextRMSNormGated (a norm
    # times silu of a second input) stay Hugging Face's.
    "qwen3_next": _dense("Qwen3Next", "qwen3_next",
                         norm=NormSpec(offset=1.0, casting_mode="gemma", eps_attr="eps"),
                         experts=("Qwen3NextExperts",), moe=True),
    # Falcon-H1: the attention's rotary, the RMSNorms and the MLP (with its gate and down
    # multipliers); logits times model.lm_head_multiplier. The Mamba-2 mixer (and its
    # FalconH1RMSNormGated) stays Hugging Face's.
    "falcon_h1": _dense("FalconH1", "falcon_h1", mlp_multipliers=True,
                        logit_multiplier="model.lm_head_multiplier"),
    # Llama 4's text model (Llama4ForCausalLM): Llama's rounding with the epsilon in "eps",
    # the weightless q / k L2Norm as fk.rms_norm without weight, the complex interleaved
    # rotary through fk.llama4_rope, the shared expert's gated MLP (activation_fn) and the
    # routed experts' gate (their bmm kept).
    "llama4_text": ModelSpec(module="llama4", norm=LLAMA_EPS_NORM,
                             rms_norms=("Llama4TextRMSNorm", "Llama4TextL2Norm"),
                             mlps=("Llama4TextMLP",), bmm_experts=("Llama4TextExperts",),
                             attentions=("Llama4TextAttention",),
                             causal_lm="Llama4ForCausalLM", rope_style="llama4"),
})


MODELS.update({
    # Gemma 3 with its vision tower (Gemma3ForConditionalGeneration): the language model as
    # gemma3_text's (the multimodal projector's soft-embedding norm is a Gemma3RMSNorm too);
    # no final logit softcapping in this class's forward. SigLIP's torch LayerNorms are the
    # layer_norm kind; its attention and non-gated MLP stay Hugging Face's.
    "gemma3": ModelSpec(module="gemma3", norm=GEMMA_NORM, rms_norms=("Gemma3RMSNorm",),
                        mlps=("Gemma3MLP",), attentions=("Gemma3Attention",),
                        causal_lm="Gemma3ForConditionalGeneration",
                        output="Gemma3CausalLMOutputWithPast", labels_to_base=True),
    # Llava / PaliGemma: the language model by its own row (Llama, Mistral, Gemma, Gemma 2,
    # ...); the vision towers' (CLIP, SigLIP) torch LayerNorms; their attention and MLPs stay.
    "llava": ModelSpec(module="llava", norm=LLAMA_NORM, rms_norms=(),
                       causal_lm="LlavaForConditionalGeneration",
                       output="LlavaCausalLMOutputWithPast", language_row=True),
    "paligemma": ModelSpec(module="paligemma", norm=GEMMA_NORM, rms_norms=(),
                           causal_lm="PaliGemmaForConditionalGeneration",
                           output="PaliGemmaCausalLMOutputWithPast", labels_to_base=True,
                           language_row=True),
    # Mllama: the text model's RMSNorms, gated MLPs and self-attention rotary; the
    # cross-attention layers have no rotary (their q / k norms are MllamaTextRMSNorm:
    # patched). The vision model's torch LayerNorms; its attention and non-gated MLP stay.
    "mllama": ModelSpec(module="mllama", norm=LLAMA_NORM, rms_norms=("MllamaTextRMSNorm",),
                        mlps=("MllamaTextMLP",), attentions=("MllamaTextSelfAttention",),
                        causal_lm="MllamaForConditionalGeneration"),
})
