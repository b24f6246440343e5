// Meta (shape / dtype only) kernels of fk::rms_norm, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/rms_norm/rms_norm.h"

namespace fk::ops {
namespace {

at::Tensor rstd_like(const at::Tensor& x) {
  auto sizes = x.sym_sizes();
  auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::empty_symint(sizes.slice(0, sizes.size() - 1), x.options().dtype(acc));
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_meta(const at::Tensor& x,
                                                         const std::optional<at::Tensor>& weight,
                                                         double, double,
                                                         c10::string_view casting_mode) {
  check_rms_norm(x, weight, casting_mode);
  return {at::empty_symint(x.sym_sizes(), x.options()), rstd_like(x)};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_meta(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double, c10::string_view casting_mode,
    std::array<bool, 2> output_mask) {
  check_rms_norm_backward(grad_y, x, weight, rstd, casting_mode);
  at::Tensor dw;
  if (output_mask[1] && weight.has_value() && weight->defined()) {
    dw = at::empty_symint(weight->sym_sizes(), weight->options());
  }
  return {at::empty_symint(x.sym_sizes(), x.options()), dw};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("_rms_norm_forward", fk::ops::rms_norm_forward_meta);
  m.impl("_rms_norm_backward", fk::ops::rms_norm_backward_meta);
}
