// CPU reference of fk::fused_add_rms_norm: the add in x's dtype, then rms_norm's CPU
// reference (fp32 accumulation, fp64 for fp64 inputs) on its result.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/fused_add_rms_norm/fused_add_rms_norm.h"

namespace fk::ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward_cpu(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, double offset, c10::string_view casting_mode) {
  const auto casting = check_fused_add_rms_norm(x, residual, weight, casting_mode);
  // torch adds bf16 / fp16 tensors in fp32 and rounds once, as the CUDA kernel does.
  auto residual_out = at::add(x, residual).contiguous();
  auto [y, rstd] = rms_norm_forward_reference(residual_out, weight, eps, offset, casting);
  return {y, residual_out, rstd};
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward_cpu(
    const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_residual_out,
    const at::Tensor& residual_out, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double offset, c10::string_view casting_mode,
    std::array<bool, 2> output_mask) {
  const auto casting = check_fused_add_rms_norm_backward(grad_y, grad_residual_out, residual_out,
                                                         weight, rstd, casting_mode);
  auto [dx, dw] = rms_norm_backward_reference(grad_y, residual_out, weight, rstd, offset, casting,
                                              output_mask[1],
                                              grad_residual_out.value_or(at::Tensor()));
  return {output_mask[0] ? dx : at::Tensor(), dw};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_fused_add_rms_norm_forward", fk::ops::fused_add_rms_norm_forward_cpu);
  m.impl("_fused_add_rms_norm_backward", fk::ops::fused_add_rms_norm_backward_cpu);
}
