// fk::group_norm: GroupNorm over (N, C, *): per (sample, group of C / num_groups channels),
// (x - mean) * rsqrt(var + eps) (biased variance) scaled and shifted per channel.
#pragma once

#include <optional>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// The (N, C, HW) view sizes of x: HW is the product of the dims after the channel dim (1
// for a 2-D x).
struct GroupNormShape {
  int64_t n, c, hw;
};
GroupNormShape group_norm_shape(const Tensor& x);

// Shared by every backend: x (N, C, *), num_groups dividing C, weight / bias (C,) or absent,
// float32 or x's dtype, on x's device.
void check_group_norm(const Tensor& x, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias, int64_t num_groups);
void check_group_norm_backward(const Tensor& grad_y, const Tensor& x,
                               const std::optional<Tensor>& weight,
                               const std::optional<Tensor>& bias, const Tensor& mean,
                               const Tensor& rstd, int64_t num_groups);

}  // namespace fk::ops
