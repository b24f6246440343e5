// Autograd kernel of fk::cross_entropy. The forward computes the gradient of the loss for
// a grad_output of 1 and keeps it; the backward scales it by grad_output.
//
// Where the gradient lives: with grad_in_logits (the default) in the logits' own memory,
// in plain eager execution only (no dispatch mode, no functional / fake / subclass
// tensors, as under torch.compile or opcheck: there a new buffer is used). The logits'
// version counter is bumped, so anything else that saved them for its backward raises
// autograd's "modified by an inplace operation" error instead of reading gradients. The
// backward scales in place unless the graph is retained (a second backward would scale
// twice) or a higher-order graph is built; the internal ops are not differentiable, so a
// double backward raises "the derivative for ... is not implemented".
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include "ops/cross_entropy/cross_entropy.h"

namespace fk::ops {

bool plain_eager(std::initializer_list<const at::Tensor*> tensors) {
  if (c10::impl::dispatch_mode_enabled()) return false;
  const auto wrapped = c10::DispatchKeySet({c10::DispatchKey::Python,
                                            c10::DispatchKey::Functionalize});
  for (const at::Tensor* t : tensors) {
    if (t->key_set().has_any(wrapped) || t->layout() != at::kStrided) return false;
  }
  return true;
}

at::Tensor scale_stored_grad(at::Tensor stored, const at::Tensor& grad_loss) {
  if (at::GradMode::is_enabled()) {
    // Building a higher-order graph: the first-order gradient, marked as depending on the
    // stored one, so that differentiating it raises instead of reading as a constant.
    return cross_entropy_backward_call(stored.detach().requires_grad_(), grad_loss);
  }
  if (!torch::autograd::get_current_graph_task_keep_graph() && stored.is_contiguous() &&
      plain_eager({&stored, &grad_loss})) {
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      cross_entropy_backward_inplace_call(stored, grad_loss);
    }
    stored.unsafeGetTensorImpl()->bump_version();
    // A new tensor object on the same memory, so a leaf's .grad takes it without a copy.
    return stored.detach();
  }
  return cross_entropy_backward_call(stored, grad_loss);
}

namespace {

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
      const std::optional<at::Tensor>& weight, int64_t ignore_index, double label_smoothing,
      c10::string_view reduction, double lse_square_scale, std::optional<double> softcap,
      bool grad_in_logits) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor loss, z, grad;
    if (grad_in_logits && plain_eager({&logits, &target})) {
      // The gradient goes into the logits, or into the one contiguous copy of them.
      at::Tensor x = logits.is_contiguous() ? logits : logits.contiguous();
      std::tie(loss, z) = cross_entropy_forward_inplace_call(
          x, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale, softcap);
      if (x.is_same(logits)) logits.unsafeGetTensorImpl()->bump_version();
      // Saved as is (not a detached alias, which below autograd would get a version
      // counter of its own): a later write into the logits makes the backward raise.
      grad = x;
    } else {
      std::tie(loss, z, grad) = cross_entropy_forward_call(
          logits, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale,
          softcap, true);
    }
    ctx->save_for_backward({grad});
    return {loss, z};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor grad = ctx->get_saved_variables()[0];
    torch::autograd::variable_list out(9);
    // An undefined grad_output: only z_loss was used, and it carries no gradient.
    if (grads[0].defined()) out[0] = scale_stored_grad(grad, grads[0]);
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor> cross_entropy_autograd(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, bool grad_in_logits) {
  if (!at::GradMode::is_enabled() || !logits.requires_grad()) {
    // No gradient wanted (class weights are not differentiated, as in torch): losses only.
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, z, grad] = cross_entropy_forward_call(logits, target, weight, ignore_index,
                                                      label_smoothing, reduction,
                                                      lse_square_scale, softcap, false);
    return {loss, z};
  }
  auto out = CrossEntropyFunction::apply(logits, target, weight, ignore_index, label_smoothing,
                                         reduction, lse_square_scale, softcap, grad_in_logits);
  // z_loss is part of loss already and is returned for logging: no gradient through it.
  return {out[0], out[1].detach()};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("cross_entropy", fk::ops::cross_entropy_autograd);
  // Internal ops are not differentiable: differentiating them (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_cross_entropy_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_cross_entropy_forward_", torch::autograd::autogradNotImplementedFallback());
  m.impl("_cross_entropy_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_cross_entropy_backward_", torch::autograd::autogradNotImplementedFallback());
}
