// fk::kl_div: torch.nn.functional.kl_div (input log-probabilities, target probabilities or
// log-probabilities) with reductions "none" / "sum" / "mean" / "batchmean" and Liger
// Kernel's eps clamp of the target before its log; for a reduction the gradient with respect
// to input is computed in the forward pass.
#pragma once

#include <string>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// Values of the reductions (the Triton kernels only see "none" or a scale factor).
enum class KlReduction : int { None = 0, Sum = 1, Mean = 2, BatchMean = 3 };

// Shared by every backend: input and target of the same shape, device and floating dtype;
// reduction one of the four; eps >= 0. Returns the parsed reduction. `op` names the caller.
// python/fk/ops/kl_div.py raises the same messages from the fake kernels.
KlReduction check_kl_div(const char* op, const Tensor& input, const Tensor& target,
                         const std::string& reduction, double eps);
// grad_output and target of the same shape, device and floating dtype.
void check_kl_div_backward(const char* op, const Tensor& grad_output, const Tensor& target);

// The factor a reduction scales the sum of the pointwise losses by: 1 ("sum"), 1 / numel
// ("mean"), 1 / size(0) ("batchmean"; 1 for a 0-dim input, as torch).
double kl_div_scale(KlReduction reduction, const Tensor& input);

// Device halves (kl_div_cpu.cpp / kl_div_cuda.cpp), for contiguous non-empty x and t of one
// dtype. reduce: the 0-dim loss (float32; float64 for float64 input) = scale * sum of the
// pointwise losses; with `grad` defined (contiguous, x's shape and dtype) also writes
// scale * d loss / d x into it. pointwise: out = the pointwise losses (backward false; a =
// the input) or out = a * d loss / d x (backward true; a = grad_output), in x's dtype.
Tensor kl_div_reduce_cpu(const Tensor& x, const Tensor& t, const Tensor& grad, double scale,
                         double eps, bool log_target);
void kl_div_pointwise_cpu(const Tensor& a, const Tensor& t, const Tensor& out, double eps,
                          bool log_target, bool backward);
Tensor kl_div_reduce_cuda(const Tensor& x, const Tensor& t, const Tensor& grad, double scale,
                          double eps, bool log_target);
void kl_div_pointwise_cuda(const Tensor& a, const Tensor& t, const Tensor& out, double eps,
                           bool log_target, bool backward);

// --- the registered internal ops (the CPU and CUDA backends register these) -------------

std::tuple<Tensor, Tensor> kl_div_forward_impl(Tensor input, Tensor target,
                                               std::string reduction, bool log_target,
                                               double eps, bool compute_grad);
Tensor kl_div_backward_impl(Tensor grad_output, Tensor target, bool log_target);

}  // namespace fk::ops
