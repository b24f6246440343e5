// fk::geglu: c = gelu(a) * b, elementwise; gelu (exact or its tanh form) and the product in
// fp32.
#pragma once

#include <string>

#include "ops/glu/glu.h"

namespace fk::ops {

inline constexpr glu::OpNames kGegluNames{"fk::geglu", "fk::_geglu_backward",
                                          "fk::_geglu_backward_"};

// gelu's form, torch.nn.functional.gelu's `approximate`: "none" (erf) or "tanh".
enum class GeluApprox { None, Tanh };

// Shared by every backend: the checks of every gated activation (glu.h) and a valid
// `approximate`, which they return parsed.
GeluApprox check_geglu(const Tensor& a, const Tensor& b, const std::string& approximate);
GeluApprox check_geglu_backward(const Tensor& grad_c, const Tensor& a, const Tensor& b,
                                const std::string& approximate);
GeluApprox check_geglu_backward_in_place(const Tensor& grad_c, const Tensor& a,
                                         const Tensor& b, const std::string& approximate);

}  // namespace fk::ops
