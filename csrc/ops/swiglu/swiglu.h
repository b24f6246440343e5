// fk::swiglu: c = silu(a) * b, elementwise; silu and the product in fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "ops/glu/glu.h"

namespace fk::ops {

inline constexpr glu::OpNames kSwigluNames{"fk::swiglu", "fk::_swiglu_backward",
                                           "fk::_swiglu_backward_"};

// Shared by every backend: same device, same dtype, same shape, supported dtype.
void check_swiglu(const at::Tensor& a, const at::Tensor& b);
void check_swiglu_backward(const at::Tensor& grad_c, const at::Tensor& a, const at::Tensor& b);
void check_swiglu_backward_in_place(const at::Tensor& grad_c, const at::Tensor& a,
                                    const at::Tensor& b);

// Calls through the dispatcher (used by the autograd kernel and the public C++ API).
at::Tensor swiglu_call(const at::Tensor& a, const at::Tensor& b, bool backward_in_place);
void swiglu_backward_in_place_call(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b);
std::tuple<at::Tensor, at::Tensor> swiglu_backward_call(const at::Tensor& grad_c,
                                                        const at::Tensor& a,
                                                        const at::Tensor& b);

}  // namespace fk::ops
