// fk's C++ API: the ops of libfk, callable from LibTorch programs.
//
// Each function calls the registered torch operator (torch.ops.fk.<name>) through the
// dispatcher, so CPU / CUDA / autograd behave exactly as from Python. Linking against
// libfk (find_package(fk) -> fk::fk) registers the operators.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace fk {

// silu(a) * b, elementwise. a and b: same shape, dtype (float32 / bfloat16 / float16, or
// float64 on CPU) and device. backward_in_place: the backward may write the gradients into
// a's and b's memory (for intermediates nothing else reads, e.g. inside an MLP).
at::Tensor swiglu(const at::Tensor& a, const at::Tensor& b, bool backward_in_place = false);

// RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * (offset + weight).
// casting_mode: "llama" (Hugging Face Llama), "gemma" (all fp32), "none".
at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                    double eps = 1e-6, double offset = 0.0,
                    const std::string& casting_mode = "llama");

// Residual add fused with RMSNorm, as in a decoder layer: residual_out = x + residual (in
// x's dtype), y = rms_norm(residual_out, weight, eps, offset, casting_mode). Returns
// (y, residual_out).
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const std::optional<at::Tensor>& weight,
                                                      double eps = 1e-6, double offset = 0.0,
                                                      const std::string& casting_mode = "llama");
// Cross entropy of (N, V) logits and (N,) int64 targets with torch's weight, ignore_index,
// label_smoothing and reduction ("mean" / "sum" / "none"), plus lse_square_scale *
// logsumexp^2 per row (z-loss) and an optional softcap (logits -> softcap * tanh(logits /
// softcap)). Returns the float32 loss. grad_in_logits: the gradient is written into the
// logits' memory during the forward (when they require grad); their values are gone after.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                         const std::optional<at::Tensor>& weight = std::nullopt,
                         int64_t ignore_index = -100, double label_smoothing = 0.0,
                         const std::string& reduction = "mean", double lse_square_scale = 0.0,
                         std::optional<double> softcap = std::nullopt,
                         bool grad_in_logits = true);

// cross_entropy(x @ weight^T + bias, target, ce_weight, ...) without the (N, V) logits:
// x (N, H), weight (V, H), bias (V,); chunk_size rows at a time (from the shapes when
// unset); grad_weight / grad_bias summed in accum_dtype (default: the weight's dtype).
at::Tensor fused_linear_cross_entropy(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias = std::nullopt,
    const std::optional<at::Tensor>& ce_weight = std::nullopt, int64_t ignore_index = -100,
    double label_smoothing = 0.0, const std::string& reduction = "mean",
    double lse_square_scale = 0.0, std::optional<double> softcap = std::nullopt,
    std::optional<int64_t> chunk_size = std::nullopt,
    std::optional<at::ScalarType> accum_dtype = std::nullopt);

// The version of the torch this libfk was built against, e.g. "2.11.0+cu130".
const char* built_torch_version();

// silu(x @ w_gate^T) * (x @ w_up^T) in one GEMM kernel. x: (..., K); w_gate, w_up: (N, K)
// (nn.Linear weights) of x's dtype and device; result (..., N). recompute: keep only x and
// the weights for the backward, which then repeats the forward GEMM.
at::Tensor swiglu_linear(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                         bool recompute = false);
// Softmax over dim, computed in fp32 and rounded to x's dtype (like torch.softmax; a row of
// only -inf gives NaN). Any dim; the last one is the fast path (others cost a copy in and out).
at::Tensor softmax(const at::Tensor& x, int64_t dim = -1);
// gelu(a) * b, elementwise, like swiglu. approximate: "tanh" (Gemma's gelu_pytorch_tanh) or
// "none" (exact, erf), as in torch.nn.functional.gelu. backward_in_place: as swiglu's.
at::Tensor geglu(const at::Tensor& a, const at::Tensor& b, const std::string& approximate = "tanh",
                 bool backward_in_place = false);
// LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias, with
// mean and biased variance in fp32; weight and bias (shape (x.size(-1),)) each optional.
at::Tensor layer_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight = std::nullopt,
                      const std::optional<at::Tensor>& bias = std::nullopt, double eps = 1e-5);
// Rotary position embedding of q (B, Hq, S, D) and k (B, Hkv, S, D), Hugging Face
// convention: x * cos + rotate_half(x) * sin on the first rotary_dim dims (default: cos's
// last dim), in fp32. cos / sin: (S, W), (1 or B, S, W) or (1 or B, 1, S, W), float32 or
// q's dtype, W = rotary_dim or rotary_dim / 2. interleaved: pairs (2i, 2i + 1) (GPT-J).
// Returns new (q_out, k_out) laid out like q and k; rope_ writes into q and k instead.
std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        std::optional<int64_t> rotary_dim = std::nullopt,
                                        bool interleaved = false);
void rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
           std::optional<int64_t> rotary_dim = std::nullopt, bool interleaved = false);

}  // namespace fk
