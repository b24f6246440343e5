// fk::layer_norm: LayerNorm over the last dimension, fp32 statistics, optional affine.
#pragma once

#include <optional>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: x, weight and bias checks (same message everywhere).
void check_layer_norm(const Tensor& x, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias);
void check_layer_norm_backward(const Tensor& grad_y, const Tensor& x,
                               const std::optional<Tensor>& weight, const Tensor& mean,
                               const Tensor& rstd);

}  // namespace fk::ops
