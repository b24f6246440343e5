// Meta (shape / dtype only) kernels of fk::fused_add_rms_norm, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/fused_add_rms_norm/fused_add_rms_norm.h"

namespace fk::ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_add_rms_norm_forward_meta(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double, double, c10::string_view casting_mode) {
  check_fused_add_rms_norm(x, residual, weight, casting_mode);
  auto sizes = x.sym_sizes();
  auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return {at::empty_symint(sizes, x.options()), at::empty_symint(sizes, x.options()),
          at::empty_symint(sizes.slice(0, sizes.size() - 1), x.options().dtype(acc))};
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_backward_meta(
    const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_residual_out,
    const at::Tensor& residual_out, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double, c10::string_view casting_mode,
    std::array<bool, 2> output_mask) {
  check_fused_add_rms_norm_backward(grad_y, grad_residual_out, residual_out, weight, rstd,
                                    casting_mode);
  at::Tensor dx, dw;
  if (output_mask[0]) dx = at::empty_symint(residual_out.sym_sizes(), residual_out.options());
  if (output_mask[1] && weight.has_value() && weight->defined()) {
    dw = at::empty_symint(weight->sym_sizes(), weight->options());
  }
  return {dx, dw};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("_fused_add_rms_norm_forward", fk::ops::fused_add_rms_norm_forward_meta);
  m.impl("_fused_add_rms_norm_backward", fk::ops::fused_add_rms_norm_backward_meta);
}
