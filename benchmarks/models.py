"""Model shapes used by the benchmarks (values from the Hugging Face configs)."""
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    # RMSNorm flavour: Gemma stores (weight - 1), so it uses offset 1.0, and computes the
    # whole norm in float32 ("gemma" casting); the others follow Llama.
    rms_offset: float = 0.0
    rms_casting_mode: str = "llama"
    # MLP gate activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma).
    mlp_act: str = "silu"

    def scaled(self, div: int) -> "ModelConfig":
        """A copy with every width divided by ``div`` (for quick smoke runs)."""
        return replace(self, name=f"{self.name}/{div}",
                       hidden_size=max(self.hidden_size // div, 8),
                       intermediate_size=max(self.intermediate_size // div, 8),
                       vocab_size=max(self.vocab_size // div, 8),
                       head_dim=max(self.head_dim // div, 8))


MODELS = {m.name: m for m in [
    ModelConfig("llama_3_8b", 4096, 14336, 128256, 32, 8, 128, 1e-5),
    ModelConfig("llama_3_2_1b", 2048, 8192, 128256, 32, 8, 64, 1e-5),
    ModelConfig("qwen2_5_7b", 3584, 18944, 152064, 28, 4, 128, 1e-6),
    ModelConfig("qwen3_8b", 4096, 12288, 151936, 32, 8, 128, 1e-6),
    # Qwen3-30B-A3B: MoE (128 experts of width 768, top 8); its dense intermediate size.
    ModelConfig("qwen3_30b_a3b", 2048, 6144, 151936, 32, 4, 128, 1e-6),
    ModelConfig("gemma_2_9b", 3584, 14336, 256000, 16, 8, 256, 1e-6,
                rms_offset=1.0, rms_casting_mode="gemma", mlp_act="gelu_tanh"),
    ModelConfig("mistral_7b", 4096, 14336, 32000, 32, 8, 128, 1e-5),
    # Llama 4 Scout's text model (its dense MLP width; the MoE experts use 8192).
    ModelConfig("llama_4_scout", 5120, 16384, 202048, 40, 8, 128, 1e-5),
    ModelConfig("qwen2_vl_7b", 3584, 18944, 152064, 28, 4, 128, 1e-6),
]}


def get_model(name: str) -> ModelConfig:
    try:
        return MODELS[name]
    except KeyError:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}") from None
