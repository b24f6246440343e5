// Meta (shape / dtype only) kernels of fk::layer_norm, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/layer_norm/layer_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

at::Tensor stat_like(const at::Tensor& x) {
  auto sizes = x.sym_sizes();
  return at::empty_symint(sizes.slice(0, sizes.size() - 1),
                          x.options().dtype(checks::acc_type(x)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_meta(
    const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double) {
  check_layer_norm(x, weight, bias);
  return {at::empty_symint(x.sym_sizes(), x.options()), stat_like(x), stat_like(x)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_meta(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd, std::array<bool, 3> output_mask) {
  check_layer_norm_backward(grad_y, x, weight, mean, rstd);
  at::Tensor dx, dw, db;
  if (output_mask[0]) dx = at::empty_symint(x.sym_sizes(), x.options());
  c10::SymInt n = x.sym_size(-1);
  if (output_mask[1]) dw = at::empty_symint({n}, x.options());
  if (output_mask[2]) db = at::empty_symint({n}, x.options());
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("_layer_norm_forward", fk::ops::layer_norm_forward_meta);
  m.impl("_layer_norm_backward", fk::ops::layer_norm_backward_meta);
}
