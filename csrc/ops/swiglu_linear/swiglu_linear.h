// fk::swiglu_linear: z = silu(x @ w_gate^T) * (x @ w_up^T), the gated projection of a
// Llama MLP in one GEMM kernel; fp32 accumulation, SiLU and the product in fp32.
//
// What backward needs is not the pre-activations a = x w_gate^T, b = x w_up^T but two
// factors of them, formed once in the forward epilogue (or recomputed by the backward):
//   s = silu(a)           db = dz * s
//   t = b * silu'(a)      da = dz * t
// both of z's shape and x's dtype. The backward forms da, db in one elementwise pass
// (fk::_swiglu_linear_gate_grads, or its in-place form writing them over t and s) and the
// products dx = da w_gate + db w_up, dW = d{a,b}^T x through ATen (cuBLAS on CUDA).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <tuple>

namespace fk::ops {

// Shared by every backend: dtypes, devices and shapes of x (..., K), w_gate and w_up (N, K).
void check_swiglu_linear(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up);
// grad_out, t and s: same device, dtype and shape.
void check_swiglu_linear_gate_grads(const at::Tensor& grad_out, const at::Tensor& t,
                                    const at::Tensor& s);
// The same, and t and s contiguous and separate (the in-place form writes into them).
void check_swiglu_linear_gate_grads_in_place(const at::Tensor& grad_out, const at::Tensor& t,
                                             const at::Tensor& s);

// Calls through the dispatcher.
// (z, s, t): z when output_mask[0], s and t when output_mask[1]; the others undefined.
std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_linear_forward_call(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
    std::array<bool, 2> output_mask);
// (grad_out * t, grad_out * s) as new tensors.
std::tuple<at::Tensor, at::Tensor> swiglu_linear_gate_grads_call(const at::Tensor& grad_out,
                                                                 const at::Tensor& t,
                                                                 const at::Tensor& s);
// The same written into t and s.
void swiglu_linear_gate_grads_in_place_call(const at::Tensor& grad_out, at::Tensor& t,
                                            at::Tensor& s);

}  // namespace fk::ops
