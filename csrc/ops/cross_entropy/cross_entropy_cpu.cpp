// CPU reference of fk::cross_entropy in plain ATen, float32 math (float64 for float64
// logits): the same per-row formulas as the CUDA kernels (triton_src/cross_entropy.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "ops/cross_entropy/cross_entropy.h"

namespace fk::ops {

at::Tensor cross_entropy_den_cpu(const at::Tensor& target, const at::Tensor& weight, int64_t V,
                                 int64_t ignore_index, at::ScalarType dtype) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto opts = target.options().dtype(dtype);
  auto keep = target != ignore_index;
  auto valid = (target >= 0).logical_and(target < V);
  auto count = at::where(valid, at::ones({}, opts), at::full({}, nan, opts));
  auto w = count;
  if (weight.defined()) w = at::where(valid, weight.index({target.clamp(0, V - 1)}), nan);
  auto zero = at::zeros({}, opts);
  return at::stack({at::where(keep, w, zero).sum(), at::where(keep, count, zero).sum()});
}

void cross_entropy_rows_cpu(const at::Tensor& logits, const at::Tensor& grad,
                            const at::Tensor& target, const at::Tensor& weight,
                            const at::Tensor& den, const at::Tensor& loss_rows,
                            const at::Tensor& z_rows, const CeOptions& o) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto dtype = loss_rows.scalar_type();
  const int64_t V = logits.size(1);
  const double ls = o.label_smoothing, s = o.lse_square_scale;
  auto x = logits.to(dtype);
  at::Tensor t;  // tanh(x / softcap)
  if (o.softcap) {
    t = at::tanh(x / *o.softcap);
    x = t * *o.softcap;
  }
  auto lse = at::logsumexp(x, 1);
  auto keep = target != o.ignore_index;
  auto valid = (target >= 0).logical_and(target < V);
  auto y = target.clamp(0, V - 1);
  auto x_y = at::where(valid, x.gather(1, y.unsqueeze(1)).squeeze(1), nan);
  auto w_y = weight.defined() ? weight.index({y}) : at::ones_like(lse);
  w_y = at::where(valid, w_y, nan);
  at::Tensor inv_dw = at::ones({}, lse.options()), inv_dn = inv_dw;
  if (o.reduction == CeReduction::Mean) {
    inv_dw = den[0].reciprocal();
    inv_dn = den[1].reciprocal();
  }
  // sum_j w_j (lse - x_j) = sw * lse - sx
  auto sw = weight.defined() ? weight.sum() : at::full({}, static_cast<double>(V), lse.options());
  auto ce = w_y * (lse - x_y);
  if (ls > 0) {
    auto sx = weight.defined() ? (x * weight).sum(1) : x.sum(1);
    ce = (1 - ls) * ce + (ls / V) * (sw * lse - sx);
  }
  auto z = s * lse * lse;
  loss_rows.copy_(at::where(keep, ce * inv_dw + z * inv_dn, inv_dw * 0));
  z_rows.copy_(at::where(keep, z * inv_dn, inv_dn * 0));
  if (!grad.defined()) return;

  auto p = at::exp(x - lse.unsqueeze(1));
  auto a = ((1 - ls) * w_y + (ls / V) * sw) * inv_dw + 2 * s * lse * inv_dn;
  auto g = p * a.unsqueeze(1);
  g.scatter_add_(1, y.unsqueeze(1), (-(1 - ls) * w_y * inv_dw).unsqueeze(1));
  if (ls > 0) {
    g = g - (ls / V) * inv_dw * (weight.defined() ? weight : at::ones({V}, lse.options()));
  }
  if (o.softcap) g = g * (1 - t * t);
  g = at::where(keep.unsqueeze(1), g, at::zeros({}, g.options()));
  grad.copy_(g);
}

}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_cross_entropy_forward", fk::ops::cross_entropy_forward_impl);
  m.impl("_cross_entropy_forward_", fk::ops::cross_entropy_forward_inplace_impl);
  m.impl("_cross_entropy_backward", fk::ops::cross_entropy_backward_impl);
  m.impl("_cross_entropy_backward_", fk::ops::cross_entropy_backward_inplace_impl);
}
