// fk::swiglu_linear: z = silu(x @ w_gate^T) * (x @ w_up^T), the gated projection of a
// Llama MLP in one GEMM kernel; fp32 accumulation, SiLU and the product in fp32.
//
// What backward needs is not the pre-activations a = x w_gate^T, b = x w_up^T but two
// factors of them, formed once in the forward epilogue (or recomputed by the backward):
//   s = silu(a)           db = dz * s
//   t = b * silu'(a)      da = dz * t
// both of z's shape and x's dtype. The backward GEMMs form da, db from dz, s, t as they
// load their operands.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <tuple>

namespace fk::ops {

// Shared by every backend: dtypes, devices and shapes of x (..., K), w_gate and w_up (N, K).
void check_swiglu_linear(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up);
// The same, plus grad_out, s and t of shape (..., N) matching x and the weights.
void check_swiglu_linear_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                  const at::Tensor& w_gate, const at::Tensor& w_up,
                                  const at::Tensor& s, const at::Tensor& t);

// Calls through the dispatcher.
// (z, s, t): z when output_mask[0], s and t when output_mask[1]; the others undefined.
std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_linear_forward_call(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
    std::array<bool, 2> output_mask);
// (grad_x, grad_w_gate, grad_w_up), each undefined where its output_mask entry is false.
std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_linear_backward_call(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& w_gate,
    const at::Tensor& w_up, const at::Tensor& s, const at::Tensor& t,
    std::array<bool, 3> output_mask);

}  // namespace fk::ops
