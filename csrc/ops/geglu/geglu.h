// fk::geglu: c = gelu(a) * b, elementwise; gelu (exact or its tanh form) and the product in
// fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>
#include <tuple>

#include "ops/glu/glu.h"

namespace fk::ops {

inline constexpr glu::OpNames kGegluNames{"fk::geglu", "fk::_geglu_backward",
                                          "fk::_geglu_backward_"};

// gelu's form, torch.nn.functional.gelu's `approximate`: "none" (erf) or "tanh".
enum class GeluApprox { None, Tanh };

// Shared by every backend: the checks of every gated activation (glu.h) and a valid
// `approximate`, which they return parsed.
GeluApprox check_geglu(const at::Tensor& a, const at::Tensor& b, std::string_view approximate);
GeluApprox check_geglu_backward(const at::Tensor& grad_c, const at::Tensor& a,
                                const at::Tensor& b, std::string_view approximate);
GeluApprox check_geglu_backward_in_place(const at::Tensor& grad_c, const at::Tensor& a,
                                         const at::Tensor& b, std::string_view approximate);

// Calls through the dispatcher (used by the autograd kernel and the public C++ API).
at::Tensor geglu_call(const at::Tensor& a, const at::Tensor& b, std::string_view approximate,
                      bool backward_in_place);
void geglu_backward_in_place_call(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b,
                                  std::string_view approximate);
std::tuple<at::Tensor, at::Tensor> geglu_backward_call(const at::Tensor& grad_c,
                                                       const at::Tensor& a, const at::Tensor& b,
                                                       std::string_view approximate);

}  // namespace fk::ops
