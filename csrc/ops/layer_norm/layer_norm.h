// fk::layer_norm: LayerNorm over the last dimension, fp32 statistics, optional affine.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

namespace fk::ops {

// Shared by every backend: x, weight and bias checks (same message everywhere).
void check_layer_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias);
void check_layer_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                               const at::Tensor& rstd);

// Calls through the dispatcher. Forward: (y, mean, rstd). Backward: (grad_x, grad_weight,
// grad_bias), each undefined where its output_mask entry is false.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_call(
    const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_call(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd, std::array<bool, 3> output_mask);

inline bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

}  // namespace fk::ops
