// fk::poly_norm: PolyNorm, w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b over the last
// dimension, norm(u) = u * rsqrt(mean(u^2) + eps).
#pragma once

#include <optional>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: x, weight (3,) and bias (one element), the two parameters of one
// dtype (float32 or x's) on x's device.
void check_poly_norm(const Tensor& x, const Tensor& weight, const Tensor& bias);
void check_poly_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Tensor& rstd);

}  // namespace fk::ops
