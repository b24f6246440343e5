// fk's C++ API: the ops of libfk, callable from LibTorch programs.
//
// Each function calls the registered torch operator (torch.ops.fk.<name>) through the
// dispatcher, so CPU / CUDA / autograd behave exactly as from Python. Linking against
// libfk (find_package(fk) -> fk::fk) registers the operators.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

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

}  // namespace fk
