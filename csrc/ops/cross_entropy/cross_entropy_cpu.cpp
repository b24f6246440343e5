// CPU reference of fk::cross_entropy in ATen operators (through the stable dispatcher),
// float32 math (float64 for float64 logits): the same per-row formulas as the CUDA kernels
// (triton_src/cross_entropy.py).
#include <limits>

#include "ops/cross_entropy/cross_entropy.h"

namespace fk::ops {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// A 0-dim tensor of `dtype` on `like`'s device.
Tensor constant(double v, ScalarType dtype, const Tensor& like) {
  return aten::full({}, v, dtype, like.device());
}

// Non-ignored rows, rows whose target is a class in [0, V), and the targets with the
// others replaced by class 0 (their values are then masked).
struct Targets {
  Tensor keep, valid, y;
};
Targets targets(const Tensor& target, int64_t V, int64_t ignore_index) {
  auto keep = aten::ne(target, aten::scalar_int(ignore_index));
  auto valid = aten::logical_and(aten::ge(target, aten::scalar_int(0)),
                                 aten::lt(target, aten::scalar_int(V)));
  auto y = aten::where(valid, target, aten::scalar_int(0));
  return {keep, valid, y};
}

// The gradient of each row's loss (times grad_rows, (M, 1), where defined): x the
// (softcapped) logits in the loss dtype, t = tanh(logits / softcap) (with a softcap), lse
// their logsumexp per row, w_y the rows' target weights (NaN for a target out of range),
// p_y the token-scaling factors (or undefined); zero rows where ignored.
Tensor gradient(const Tensor& x, const Tensor& t, const Tensor& lse, const Targets& tg,
                const Tensor& w_y, const Tensor& weight, const Tensor& inv_dw,
                const Tensor& inv_dn, const Tensor& p_y, const Tensor& grad_rows,
                const CeOptions& o) {
  const auto dtype = x.scalar_type();
  const int64_t V = x.size(1);
  const double ls = o.label_smoothing, s = o.lse_square_scale;
  auto sw = weight.defined() ? aten::sum_all(weight) : constant(static_cast<double>(V), dtype, x);
  auto p = aten::exp(x - aten::unsqueeze(lse, 1));
  auto a = ((1 - ls) * w_y + (ls / V) * sw) * inv_dw + 2 * s * lse * inv_dn;
  auto g = p * aten::unsqueeze(a, 1);
  aten::scatter_add_(g, 1, aten::unsqueeze(tg.y, 1),
                     aten::unsqueeze(-(1 - ls) * w_y * inv_dw, 1));
  if (ls > 0) {
    g = g - (ls / V) * inv_dw *
                (weight.defined() ? weight : aten::full({V}, 1.0, dtype, x.device()));
  }
  if (o.softcap) g = g * (1.0 - t * t);
  if (p_y.defined()) g = g * aten::unsqueeze(p_y, 1);
  if (grad_rows.defined()) g = g * grad_rows;
  return aten::where(aten::unsqueeze(tg.keep, 1), g, constant(0.0, dtype, x));
}

// The rows' target weights: the class weight of the target (1 without weights), NaN for a
// target outside [0, V).
Tensor target_weights(const Targets& tg, const Tensor& weight, ScalarType dtype,
                      const Tensor& like) {
  auto w_y = weight.defined() ? aten::index_select(weight, 0, tg.y) : constant(1.0, dtype, like);
  return aten::where(tg.valid, w_y, constant(kNan, dtype, like));
}

}  // namespace

Tensor cross_entropy_den_cpu(const Tensor& target, const Tensor& weight, int64_t V,
                             int64_t ignore_index, ScalarType dtype) {
  const auto [keep, valid, y] = targets(target, V, ignore_index);
  const auto nan = constant(kNan, dtype, target), zero = constant(0.0, dtype, target);
  auto count = aten::where(valid, constant(1.0, dtype, target), nan);
  auto w = count;
  if (weight.defined()) w = aten::where(valid, aten::index_select(weight, 0, y), nan);
  return aten::stack({aten::sum_all(aten::where(keep, w, zero)),
                      aten::sum_all(aten::where(keep, count, zero))},
                     0);
}

void cross_entropy_rows_cpu(const Tensor& logits, const Tensor& grad, const Tensor& target,
                            const Tensor& weight, const Tensor& den, const Tensor& loss_rows,
                            const Tensor& z_rows, const Tensor& pred, const CeOptions& o,
                            const Tensor& lse_rows) {
  const auto dtype = loss_rows.scalar_type();
  const int64_t V = logits.size(1);
  const double ls = o.label_smoothing, s = o.lse_square_scale;
  auto x = aten::to(logits, dtype);
  Tensor t;  // tanh(x / softcap)
  if (o.softcap) {
    t = aten::tanh(x / *o.softcap);
    x = t * *o.softcap;
  }
  auto lse = aten::logsumexp(x, {1});
  const auto tg = targets(target, V, o.ignore_index);
  const auto& [keep, valid, y] = tg;
  const auto nan = constant(kNan, dtype, logits);
  auto x_y = aten::where(valid, aten::squeeze(aten::gather(x, 1, aten::unsqueeze(y, 1)), 1), nan);
  auto w_y = target_weights(tg, weight, dtype, logits);
  Tensor inv_dw = constant(1.0, dtype, logits), inv_dn = inv_dw;
  if (o.reduction == CeReduction::Mean) {
    inv_dw = aten::reciprocal(aten::select(den, 0, 0));
    inv_dn = aten::reciprocal(aten::select(den, 0, 1));
  }
  // sum_j w_j (lse - x_j) = sw * lse - sx
  auto sw = weight.defined() ? aten::sum_all(weight)
                             : constant(static_cast<double>(V), dtype, logits);
  auto ce = w_y * (lse - x_y);
  if (ls > 0) {
    auto sx = weight.defined() ? aten::sum(x * weight, {1}) : aten::sum(x, {1});
    ce = (1 - ls) * ce + (ls / V) * (sw * lse - sx);
  }
  auto z = s * lse * lse;
  Tensor p_y;  // token scaling: softmax(x)_y, a constant factor of the row
  if (o.token_scaling) {
    p_y = aten::exp(x_y - lse);
    ce = ce * p_y;
    z = z * p_y;
  }
  if (pred.defined()) {
    const auto arg = aten::call("aten::argmax", "", x, std::optional<int64_t>(1), false);
    aten::copy_(pred, aten::where(keep, arg, aten::scalar_int(kCeIgnoredPrediction)));
  }
  aten::copy_(loss_rows, aten::where(keep, ce * inv_dw + z * inv_dn, inv_dw * 0.0));
  aten::copy_(z_rows, aten::where(keep, z * inv_dn, inv_dn * 0.0));
  if (lse_rows.defined()) {
    aten::copy_(lse_rows, aten::where(keep, lse, constant(0.0, dtype, logits)));
  }
  if (!grad.defined()) return;
  aten::copy_(grad, gradient(x, t, lse, tg, w_y, weight, inv_dw, inv_dn, p_y, Tensor(), o));
}

void cross_entropy_rows_backward_cpu(const Tensor& logits, const Tensor& grad,
                                     const Tensor& target, const Tensor& weight,
                                     const Tensor& den, const Tensor& lse,
                                     const Tensor& grad_loss, const CeOptions& o) {
  const auto dtype = lse.scalar_type();
  auto x = aten::to(logits, dtype);
  Tensor t;
  if (o.softcap) {
    t = aten::tanh(x / *o.softcap);
    x = t * *o.softcap;
  }
  const auto tg = targets(target, x.size(1), o.ignore_index);
  const auto w_y = target_weights(tg, weight, dtype, logits);
  const auto inv_dw = aten::reciprocal(aten::select(den, 0, 0));
  const auto inv_dn = aten::reciprocal(aten::select(den, 0, 1));
  const auto g_rows = grad_loss.dim() == 0 ? grad_loss : aten::unsqueeze(grad_loss, 1);
  aten::copy_(grad, gradient(x, t, lse, tg, w_y, weight, inv_dw, inv_dn, Tensor(), g_rows, o));
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_cross_entropy_forward", TORCH_BOX(&fk::ops::cross_entropy_forward_impl));
  m.impl("_cross_entropy_forward_", TORCH_BOX(&fk::ops::cross_entropy_forward_inplace_impl));
  m.impl("_cross_entropy_backward", TORCH_BOX(&fk::ops::cross_entropy_backward_impl));
  m.impl("_cross_entropy_backward_", TORCH_BOX(&fk::ops::cross_entropy_backward_inplace_impl));
  m.impl("_cross_entropy_deferred_forward",
         TORCH_BOX(&fk::ops::cross_entropy_deferred_forward_impl));
  m.impl("_cross_entropy_deferred_backward",
         TORCH_BOX(&fk::ops::cross_entropy_deferred_backward_impl));
  m.impl("_cross_entropy_deferred_backward_",
         TORCH_BOX(&fk::ops::cross_entropy_deferred_backward_inplace_impl));
}
