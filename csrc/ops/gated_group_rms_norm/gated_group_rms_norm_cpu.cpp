// CPU reference of fk::gated_group_rms_norm in ATen operators (through the stable
// dispatcher): fk::rms_norm's reference (Llama casting) per group, fp32 math (fp64 for fp64
// inputs).
#include "ops/gated_group_rms_norm/gated_group_rms_norm.h"
#include "ops/rms_norm/rms_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// (rows, N / G, G) views.
Tensor groups(const GatedNorm& p, const Tensor& t) {
  return aten::reshape(t, {-1, p.n / p.g, p.g});
}

// The weight broadcast over (rows, N / G, G), in the accumulation dtype.
Tensor weight_3d(const GatedNorm& p, const Tensor& w, ScalarType acc) {
  return aten::to(aten::reshape(w, {1, p.w_per_group ? 1 : p.n / p.g, p.g}), acc);
}

// act(g) and act'(g) in the accumulation dtype.
std::pair<Tensor, Tensor> activation(const GatedNorm& p, const Tensor& g) {
  auto s = aten::sigmoid(g);
  if (p.sigmoid) return {s, s * (1.0 - s)};
  return {g * s, s * (1.0 + g * (1.0 - s))};
}

// (B, S, H, D) results as (S, B, H * D) when transposed, else x's shape; contiguous.
Tensor to_output(const Tensor& y, const Tensor& x, bool transpose_out) {
  auto t = aten::reshape(y, x.sizes());
  if (!transpose_out) return aten::contiguous(t);
  return aten::reshape(aten::contiguous(aten::transpose(t, 0, 1)),
                       {x.size(1), x.size(0), x.size(2) * x.size(3)});
}

// The output layout back to x's.
Tensor from_output(const Tensor& dy, const Tensor& x, bool transpose_out) {
  if (!transpose_out) return dy;
  auto t = aten::reshape(dy, {x.size(1), x.size(0), x.size(2), x.size(3)});
  return aten::transpose(t, 0, 1);
}

Tensor gated_group_rms_norm_cpu(Tensor x, Tensor gate, std::optional<Tensor> weight,
                                int64_t group_size, double eps, std::string activation_name,
                                bool transpose_out) {
  const auto p = check_gated_group_rms_norm("fk::gated_group_rms_norm", x, gate, weight,
                                            group_size, activation_name, transpose_out);
  const auto acc = checks::acc_type(x);
  if (x.numel() == 0) {
    auto s = gated_group_rms_norm_out_shape(x, transpose_out);
    return aten::empty(IntArrayRef(s.data(), s.size()), x.scalar_type(), x.device());
  }
  auto xg = groups(p, x);
  // round(x_hat), then round(w * round(x_hat)) as Hugging Face forms it in x's dtype.
  auto n = aten::to(std::get<0>(rms_norm_forward_reference(xg, std::nullopt, eps, 0.0,
                                                           RmsCasting::Llama)),
                    acc);
  if (has(weight)) n = aten::to(aten::to(n * weight_3d(p, *weight, acc), x.scalar_type()), acc);
  auto y = aten::to(n * activation(p, aten::to(groups(p, gate), acc)).first, x.scalar_type());
  return to_output(y, x, transpose_out);
}

std::tuple<Tensor, Tensor, Tensor> gated_group_rms_norm_backward_cpu(
    Tensor grad_y, Tensor x, Tensor gate, std::optional<Tensor> weight, int64_t group_size,
    double eps, std::string activation_name, bool transpose_out, bool weight_grad) {
  const auto p = check_gated_group_rms_norm_backward("fk::_gated_group_rms_norm_backward",
                                                     grad_y, x, gate, weight, group_size,
                                                     activation_name, transpose_out);
  const auto acc = checks::acc_type(x);
  const bool want_dw = weight_grad && has(weight);
  if (x.numel() == 0) {
    return {aten::empty_like(x), aten::empty_like(gate),
            want_dw ? aten::zeros_like(*weight) : Tensor()};
  }
  auto xg = groups(p, x);
  auto [xh_r, rstd] = rms_norm_forward_reference(xg, std::nullopt, eps, 0.0, RmsCasting::Llama);
  auto xf = aten::to(xg, acc);
  auto xh = xf * aten::unsqueeze(aten::to(rstd, acc), -1);
  auto w = has(weight) ? weight_3d(p, *weight, acc) : aten::scalar(1.0);
  auto [a, da] = activation(p, aten::to(groups(p, gate), acc));
  auto dy = aten::to(groups(p, aten::contiguous(from_output(grad_y, x, transpose_out))), acc);
  auto dgate = aten::to(dy * w * xh * da, x.scalar_type());
  auto dn = dy * a;
  // The norm's backward with the weight folded into the incoming gradient.
  auto dx = std::get<0>(rms_norm_backward_reference(dn * w, xg, std::nullopt, rstd, 0.0,
                                                    RmsCasting::Llama, false));
  Tensor dw;
  if (want_dw) {
    auto terms = dn * aten::to(xh_r, acc);
    dw = p.w_per_group ? aten::sum(terms, {0, 1}) : aten::reshape(aten::sum(terms, {0}), {p.n});
    dw = aten::to(dw, weight->scalar_type());
  }
  return {aten::reshape(dx, x.sizes()), aten::reshape(dgate, x.sizes()), dw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("gated_group_rms_norm", TORCH_BOX(&fk::ops::gated_group_rms_norm_cpu));
  m.impl("_gated_group_rms_norm_backward",
         TORCH_BOX(&fk::ops::gated_group_rms_norm_backward_cpu));
}
