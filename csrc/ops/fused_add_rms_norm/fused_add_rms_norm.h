// fk::fused_add_rms_norm: residual_out = x + residual (in x's dtype), y = rms_norm(residual_out).
#pragma once

#include <optional>
#include <string>

#include "ops/rms_norm/rms_norm.h"
#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: x and residual alike (shape, dtype, device), rms_norm's weight
// and casting-mode checks; returns the parsed casting mode.
RmsCasting check_fused_add_rms_norm(const Tensor& x, const Tensor& residual,
                                    const std::optional<Tensor>& weight,
                                    const std::string& casting_mode);
RmsCasting check_fused_add_rms_norm_backward(const Tensor& grad_y,
                                             const std::optional<Tensor>& grad_residual_out,
                                             const Tensor& residual_out,
                                             const std::optional<Tensor>& weight,
                                             const Tensor& rstd,
                                             const std::string& casting_mode);

}  // namespace fk::ops
