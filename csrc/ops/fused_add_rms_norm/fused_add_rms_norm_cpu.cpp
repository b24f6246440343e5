// CPU reference of fk::fused_add_rms_norm: the add in x's dtype, then rms_norm's CPU
// reference (fp32 accumulation, fp64 for fp64 inputs) on its result.
#include "ops/fused_add_rms_norm/fused_add_rms_norm.h"

namespace fk::ops {
namespace {

std::tuple<Tensor, Tensor, Tensor> fused_add_rms_norm_forward_cpu(
    Tensor x, Tensor residual, std::optional<Tensor> weight, double eps, double offset,
    std::string casting_mode) {
  const auto casting = check_fused_add_rms_norm(x, residual, weight, casting_mode);
  // torch adds bf16 / fp16 tensors in fp32 and rounds once, as the CUDA kernel does.
  auto residual_out = aten::contiguous(aten::add(x, residual));
  auto [y, rstd] = rms_norm_forward_reference(residual_out, weight, eps, offset, casting);
  return {y, residual_out, rstd};
}

std::tuple<Tensor, Tensor> fused_add_rms_norm_backward_cpu(
    Tensor grad_y, std::optional<Tensor> grad_residual_out, Tensor residual_out,
    std::optional<Tensor> weight, Tensor rstd, double offset, std::string casting_mode,
    std::vector<bool> output_mask) {
  const auto casting = check_fused_add_rms_norm_backward(grad_y, grad_residual_out, residual_out,
                                                         weight, rstd, casting_mode);
  auto [dx, dw] = rms_norm_backward_reference(grad_y, residual_out, weight, rstd, offset, casting,
                                              output_mask[1],
                                              has(grad_residual_out) ? *grad_residual_out
                                                                     : Tensor());
  return {output_mask[0] ? dx : Tensor(), dw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_fused_add_rms_norm_forward", TORCH_BOX(&fk::ops::fused_add_rms_norm_forward_cpu));
  m.impl("_fused_add_rms_norm_backward", TORCH_BOX(&fk::ops::fused_add_rms_norm_backward_cpu));
}
