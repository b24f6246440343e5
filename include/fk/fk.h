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

// The version of the torch this libfk was built against, e.g. "2.11.0+cu130".
const char* built_torch_version();

// silu(x @ w_gate^T) * (x @ w_up^T) in one GEMM kernel. x: (..., K); w_gate, w_up: (N, K)
// (nn.Linear weights) of x's dtype and device; result (..., N). recompute: keep only x and
// the weights for the backward, which then repeats the forward GEMM.
at::Tensor swiglu_linear(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                         bool recompute = false);

}  // namespace fk
