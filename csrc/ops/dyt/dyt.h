// fk::dyt: Dynamic Tanh, y = gamma * tanh(alpha * x) + beta over the last dimension.
#pragma once

#include <optional>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: x and the parameters (alpha one element; gamma and beta (N,);
// all three of one dtype, float32 or x's dtype; on x's device). `op` names the operator of
// the message.
void check_dyt(const Tensor& x, const Tensor& alpha, const Tensor& gamma,
               const std::optional<Tensor>& beta, const char* op = "fk::dyt");
void check_dyt_backward(const Tensor& grad_y, const Tensor& x, const Tensor& alpha,
                        const Tensor& gamma, const std::optional<Tensor>& beta);

}  // namespace fk::ops
