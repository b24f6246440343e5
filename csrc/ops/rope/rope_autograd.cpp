// Autograd kernel of fk::rope: the backward applies the transposed rotation to the output
// gradients; it keeps only cos and sin. cos and sin are constants (no gradient).
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/rope/rope.h"

namespace fk::ops {
namespace {

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                std::optional<int64_t> rotary_dim,
                                                bool interleaved) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [qo, ko] = rope_call(q, k, cos, sin, rotary_dim, interleaved);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["rotary_dim"] = rotary_dim.has_value() ? c10::IValue(*rotary_dim)
                                                           : c10::IValue();
    ctx->saved_data["interleaved"] = interleaved;
    return {qo, ko};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [dq, dk] = rope_backward_call(grads[0], grads[1], saved[0], saved[1],
                                       ctx->saved_data["rotary_dim"].toOptional<int64_t>(),
                                       ctx->saved_data["interleaved"].toBool());
    return {dq, dk, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> rope_autograd(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                 std::optional<int64_t> rotary_dim,
                                                 bool interleaved) {
  auto out = RopeFunction::apply(q, k, cos, sin, rotary_dim, interleaved);
  return {out[0], out[1]};
}

// rope_ has no derivative: it refuses tensors autograd would need to track, and bumps the
// version counters of q and k so that a tensor saved for some backward is not read after
// it was overwritten.
void rope_inplace_autograd(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                           const at::Tensor& sin, std::optional<int64_t> rotary_dim,
                           bool interleaved) {
  TORCH_CHECK(!at::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad()),
              "fk::rope_ is not differentiable: q and k require grad; use fk::rope, or "
              "call it under no_grad");
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    rope_inplace_call(q, k, cos, sin, rotary_dim, interleaved);
  }
  q.unsafeGetTensorImpl()->bump_version();
  k.unsafeGetTensorImpl()->bump_version();
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("rope", fk::ops::rope_autograd);
  m.impl("rope_", fk::ops::rope_inplace_autograd);
  // The internal backward is not differentiable: differentiating it (double backward)
  // raises "the derivative for ... is not implemented".
  m.impl("_rope_backward", torch::autograd::autogradNotImplementedFallback());
}
