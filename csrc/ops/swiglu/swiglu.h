// fk::swiglu: c = silu(a) * b, elementwise; silu and the product in fp32.
#pragma once

#include "ops/glu/glu.h"

namespace fk::ops {

inline constexpr glu::OpNames kSwigluNames{"fk::swiglu", "fk::_swiglu_backward",
                                           "fk::_swiglu_backward_"};

// Shared by every backend: same device, same dtype, same shape, supported dtype.
void check_swiglu(const Tensor& a, const Tensor& b);
void check_swiglu_backward(const Tensor& grad_c, const Tensor& a, const Tensor& b);
void check_swiglu_backward_in_place(const Tensor& grad_c, const Tensor& a, const Tensor& b);
// gate_multiplier and down_multiplier finite; `op` names the caller (python/fk/ops/swiglu.py
// raises the same messages from the fake kernels).
void check_swiglu_multipliers(const char* op, double gate_multiplier, double down_multiplier);

}  // namespace fk::ops
