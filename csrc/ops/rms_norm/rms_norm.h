// fk::rms_norm: RMSNorm over the last dimension with Llama / Gemma / plain casting.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

namespace fk::ops {

// Casting modes; the values are what the Triton kernels take (triton_src/rms_norm.py).
enum class RmsCasting : int { None = 0, Llama = 1, Gemma = 2 };

// Parses "none" / "llama" / "gemma"; anything else is an error listing the valid modes.
RmsCasting parse_rms_casting(std::string_view mode);

// Shared by every backend: x and weight checks, returns the parsed casting mode.
RmsCasting check_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          std::string_view casting_mode);
RmsCasting check_rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                   const std::optional<at::Tensor>& weight,
                                   const at::Tensor& rstd, std::string_view casting_mode);

// Calls through the dispatcher.
std::tuple<at::Tensor, at::Tensor> rms_norm_forward_call(const at::Tensor& x,
                                                         const std::optional<at::Tensor>& weight,
                                                         double eps, double offset,
                                                         std::string_view casting_mode);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_call(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double offset, std::string_view casting_mode,
    std::array<bool, 2> output_mask);

}  // namespace fk::ops
