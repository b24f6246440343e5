// Autograd kernel of fk::fused_linear_cross_entropy.
//
// Reductions "mean" and "sum": the forward computes grad_x, grad_weight and grad_bias for
// a grad_output of 1 (only those that are needed) and keeps them; the backward scales them
// by grad_output (in place, on the device, nothing at all for 1; see scale_stored_grad).
// Reduction "none": each row's grad_output must weigh the logits' gradient before the
// products sum over rows, so the forward keeps x, weight, target (and bias) and the
// backward runs the chunked pass again with grad_output per row. The internal op is not
// differentiable: a double backward raises "the derivative for ... is not implemented".
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/fused_linear_cross_entropy/fused_linear_cross_entropy.h"

namespace fk::ops {
namespace {

using torch::autograd::variable_list;

class FusedLinearCrossEntropyFunction
    : public torch::autograd::Function<FusedLinearCrossEntropyFunction> {
 public:
  static variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& target,
                               const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& ce_weight, int64_t ignore_index,
                               double label_smoothing, c10::string_view reduction,
                               double lse_square_scale, std::optional<double> softcap,
                               std::optional<int64_t> chunk_size,
                               std::optional<at::ScalarType> accum_dtype,
                               std::array<bool, 3> grad_mask) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const bool deferred = reduction == "none";
    const std::array<bool, 3> now = deferred ? std::array<bool, 3>{false, false, false}
                                             : grad_mask;
    auto [loss, z, gx, gw, gb] = fused_linear_cross_entropy_forward_call(
        x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
        lse_square_scale, softcap, chunk_size, accum_dtype, now, std::nullopt);
    ctx->saved_data["deferred"] = deferred;
    if (deferred) {
      ctx->save_for_backward({x, weight, target, bias.value_or(at::Tensor()),
                              ce_weight.value_or(at::Tensor())});
      ctx->saved_data["ignore_index"] = ignore_index;
      ctx->saved_data["label_smoothing"] = label_smoothing;
      ctx->saved_data["lse_square_scale"] = lse_square_scale;
      ctx->saved_data["softcap"] = softcap;
      ctx->saved_data["chunk_size"] = chunk_size;
      ctx->saved_data["accum_dtype"] = accum_dtype.has_value()
                                           ? static_cast<int64_t>(*accum_dtype) : int64_t{-1};
      ctx->saved_data["grad_mask"] = std::vector<bool>(grad_mask.begin(), grad_mask.end());
    } else {
      ctx->save_for_backward({gx, gw, gb});
    }
    return {loss, z};
  }

  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grads) {
    variable_list out(13);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;  // only z_loss was used: it carries no gradient
    auto saved = ctx->get_saved_variables();
    if (ctx->saved_data["deferred"].toBool()) {
      auto opt = [](const at::Tensor& t) {
        return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
      };
      const int64_t accum = ctx->saved_data["accum_dtype"].toInt();
      const auto mask = ctx->saved_data["grad_mask"].toBoolList();
      auto r = fused_linear_cross_entropy_forward_call(
          saved[0], saved[1], saved[2], opt(saved[3]), opt(saved[4]),
          ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["label_smoothing"].toDouble(),
          "none", ctx->saved_data["lse_square_scale"].toDouble(),
          ctx->saved_data["softcap"].toOptional<double>(),
          ctx->saved_data["chunk_size"].toOptional<int64_t>(),
          accum < 0 ? std::nullopt : std::optional<at::ScalarType>(
                                         static_cast<at::ScalarType>(accum)),
          {mask[0], mask[1], mask[2]}, g);
      out[0] = std::get<2>(r);
      out[1] = std::get<3>(r);
      out[3] = std::get<4>(r);
      return out;
    }
    if (saved[0].defined()) out[0] = scale_stored_grad(saved[0], g);
    if (saved[1].defined()) out[1] = scale_stored_grad(saved[1], g);
    if (saved[2].defined()) out[3] = scale_stored_grad(saved[2].unsqueeze(0), g).squeeze(0);
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor> fused_linear_cross_entropy_autograd(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype) {
  const bool grad_mode = at::GradMode::is_enabled();
  const std::array<bool, 3> mask = {
      grad_mode && x.requires_grad(), grad_mode && weight.requires_grad(),
      grad_mode && bias.has_value() && bias->defined() && bias->requires_grad()};
  if (!mask[0] && !mask[1] && !mask[2]) {
    // No gradient wanted (ce_weight is not differentiated): losses only.
    at::AutoDispatchBelowADInplaceOrView guard;
    auto r = fused_linear_cross_entropy_forward_call(
        x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
        lse_square_scale, softcap, chunk_size, accum_dtype, {false, false, false}, std::nullopt);
    return {std::get<0>(r), std::get<1>(r)};
  }
  auto out = FusedLinearCrossEntropyFunction::apply(
      x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
      lse_square_scale, softcap, chunk_size, accum_dtype, mask);
  // z_loss is part of loss already and is returned for logging: no gradient through it.
  return {out[0], out[1].detach()};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("fused_linear_cross_entropy", fk::ops::fused_linear_cross_entropy_autograd);
  m.impl("_fused_linear_cross_entropy_forward",
         torch::autograd::autogradNotImplementedFallback());
}
