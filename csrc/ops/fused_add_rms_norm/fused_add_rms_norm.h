// fk::fused_add_rms_norm: residual_out = x + residual (in x's dtype), y = rms_norm(residual_out).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

#include "ops/rms_norm/rms_norm.h"

namespace fk::ops {

// Shared by every backend: x and residual alike (shape, dtype, device), rms_norm's weight
// and casting-mode checks; returns the parsed casting mode.
RmsCasting check_fused_add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                    const std::optional<at::Tensor>& weight,
                                    std::string_view casting_mode);
RmsCasting check_fused_add_rms_norm_backward(const at::Tensor& grad_y,
                                             const std::optional<at::Tensor>& grad_residual_out,
                                             const at::Tensor& residual_out,
                                             const std::optional<at::Tensor>& weight,
                                             const at::Tensor& rstd,
                                             std::string_view casting_mode);

// Calls through the dispatcher.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward_call(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, double offset, std::string_view casting_mode);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward_call(
    const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_residual_out,
    const at::Tensor& residual_out, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double offset, std::string_view casting_mode,
    std::array<bool, 2> output_mask);

}  // namespace fk::ops
