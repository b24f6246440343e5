// Meta (shape / dtype only) kernels of fk::cross_entropy, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/cross_entropy/cross_entropy.h"

namespace fk::ops {
namespace {

std::tuple<at::Tensor, at::Tensor> losses_like(const at::Tensor& logits, CeReduction reduction) {
  auto opts = logits.options().dtype(ce_loss_dtype(logits));
  if (reduction == CeReduction::None) {
    return {at::empty_symint({logits.sym_size(0)}, opts),
            at::empty_symint({logits.sym_size(0)}, opts)};
  }
  return {at::empty({}, opts), at::empty({}, opts)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_meta(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, bool compute_grad) {
  const auto o = check_cross_entropy("fk::cross_entropy", logits, target, weight, ignore_index,
                                     label_smoothing, reduction, lse_square_scale, softcap);
  auto [loss, z] = losses_like(logits, o.reduction);
  at::Tensor grad;
  if (compute_grad) grad = at::empty_symint(logits.sym_sizes(), logits.options());
  return {loss, z, grad};
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward_inplace_meta(
    at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap) {
  const auto o = check_cross_entropy("fk::_cross_entropy_forward_", logits, target, weight,
                                     ignore_index, label_smoothing, reduction, lse_square_scale,
                                     softcap);
  return losses_like(logits, o.reduction);
}

at::Tensor cross_entropy_backward_meta(const at::Tensor& grad, const at::Tensor& grad_loss) {
  check_cross_entropy_backward("fk::_cross_entropy_backward", grad, grad_loss);
  return at::empty_symint(grad.sym_sizes(), grad.options());
}

void cross_entropy_backward_inplace_meta(at::Tensor& grad, const at::Tensor& grad_loss) {
  check_cross_entropy_backward("fk::_cross_entropy_backward_", grad, grad_loss);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("_cross_entropy_forward", fk::ops::cross_entropy_forward_meta);
  m.impl("_cross_entropy_forward_", fk::ops::cross_entropy_forward_inplace_meta);
  m.impl("_cross_entropy_backward", fk::ops::cross_entropy_backward_meta);
  m.impl("_cross_entropy_backward_", fk::ops::cross_entropy_backward_inplace_meta);
}
