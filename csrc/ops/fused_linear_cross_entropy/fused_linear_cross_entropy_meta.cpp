// Meta (shape / dtype only) kernel of fk::fused_linear_cross_entropy, SymInt-aware.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/fused_linear_cross_entropy/fused_linear_cross_entropy.h"

namespace fk::ops {
namespace {

FlceResult fused_linear_cross_entropy_forward_meta(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype, std::array<bool, 3> grad_mask,
    const std::optional<at::Tensor>& grad_rows) {
  const auto o = check_fused_linear_cross_entropy(x, weight, target, bias, ce_weight,
                                                  ignore_index, label_smoothing, reduction,
                                                  lse_square_scale, softcap, chunk_size,
                                                  accum_dtype);
  auto opts = x.options().dtype(ce_loss_dtype(x));
  at::Tensor loss, z;
  if (o.reduction == CeReduction::None) {
    loss = at::empty_symint({x.sym_size(0)}, opts);
    z = at::empty_symint({x.sym_size(0)}, opts);
  } else {
    loss = at::empty({}, opts);
    z = at::empty({}, opts);
  }
  at::Tensor gx, gw, gb;
  if (grad_mask[0]) gx = at::empty_symint(x.sym_sizes(), x.options());
  if (grad_mask[1]) gw = at::empty_symint(weight.sym_sizes(), weight.options());
  if (grad_mask[2] && bias.has_value() && bias->defined()) {
    gb = at::empty_symint(bias->sym_sizes(), bias->options());
  }
  return {loss, z, gx, gw, gb};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("_fused_linear_cross_entropy_forward",
         fk::ops::fused_linear_cross_entropy_forward_meta);
}
