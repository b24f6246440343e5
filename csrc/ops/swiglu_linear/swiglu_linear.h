// fk::swiglu_linear: z = silu(x @ w_gate^T) * (x @ w_up^T), the gated projection of a
// Llama MLP in one GEMM kernel; fp32 accumulation, SiLU and the product in fp32.
//
// What backward needs is not the pre-activations a = x w_gate^T, b = x w_up^T but two
// factors of them, formed once in the forward epilogue (or recomputed by the backward):
//   s = silu(a)           db = dz * s
//   t = b * silu'(a)      da = dz * t
// both of z's shape and x's dtype. The backward (python/fk/ops/swiglu_linear.py) forms
// da, db in one elementwise pass (fk::_swiglu_linear_gate_grads, or its in-place form
// writing them over t and s) and the products dx = da w_gate + db w_up, dW = d{a,b}^T x
// through torch (cuBLAS on CUDA).
#pragma once

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: dtypes, devices and shapes of x (..., K), w_gate and w_up (N, K).
void check_swiglu_linear(const Tensor& x, const Tensor& w_gate, const Tensor& w_up);
// grad_out, t and s: same device, dtype and shape.
void check_swiglu_linear_gate_grads(const Tensor& grad_out, const Tensor& t, const Tensor& s);
// The same, and t and s contiguous and separate (the in-place form writes into them).
void check_swiglu_linear_gate_grads_in_place(const Tensor& grad_out, const Tensor& t,
                                             const Tensor& s);

}  // namespace fk::ops
