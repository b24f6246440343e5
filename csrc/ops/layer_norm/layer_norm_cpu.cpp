// CPU reference of fk::layer_norm in ATen operators (through the stable dispatcher):
// statistics and affine in fp32 (fp64 for fp64 inputs), one rounding of y to the input dtype.
#include "ops/layer_norm/layer_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward_cpu(Tensor x,
                                                          std::optional<Tensor> weight,
                                                          std::optional<Tensor> bias,
                                                          double eps) {
  check_layer_norm(x, weight, bias);
  const auto acc = checks::acc_type(x);
  auto xf = aten::to(x, acc);
  auto mean = aten::mean(xf, {-1}, /*keepdim=*/true);
  auto xc = xf - mean;
  auto rstd = aten::rsqrt(aten::mean(xc * xc, {-1}, /*keepdim=*/true) + eps);
  auto y = xc * rstd;
  if (has(weight)) y = y * aten::to(*weight, acc);
  if (has(bias)) y = y + aten::to(*bias, acc);
  return {aten::contiguous(aten::to(y, x.scalar_type())),
          aten::contiguous(aten::squeeze(mean, -1)), aten::contiguous(aten::squeeze(rstd, -1))};
}

// Sum over every row of t, as a (N,) tensor of `dtype` (zeros when N or the row count is 0).
Tensor column_sum(const Tensor& t, int64_t n, ScalarType dtype) {
  if (n == 0) return aten::zeros({0}, dtype, t.device());
  return aten::to(aten::sum(aten::reshape(t, {-1, n}), {0}), dtype);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_cpu(Tensor grad_y, Tensor x,
                                                           std::optional<Tensor> weight,
                                                           Tensor mean, Tensor rstd,
                                                           std::vector<bool> output_mask) {
  check_layer_norm_backward(grad_y, x, weight, mean, rstd);
  const auto acc = checks::acc_type(x);
  const int64_t n = x.size(-1);
  auto dy = aten::to(grad_y, acc);
  auto r = aten::unsqueeze(aten::to(rstd, acc), -1);
  auto xh = (aten::to(x, acc) - aten::unsqueeze(aten::to(mean, acc), -1)) * r;
  Tensor dx, dw, db;
  if (output_mask[0]) {
    if (n > 0) {
      auto g = has(weight) ? dy * aten::to(*weight, acc) : dy;
      auto c1 = aten::mean(g, {-1}, /*keepdim=*/true);
      auto c2 = aten::mean(g * xh, {-1}, /*keepdim=*/true);
      dx = aten::contiguous(aten::to(r * (g - c1 - xh * c2), x.scalar_type()));
    } else {
      dx = aten::empty_like(x);
    }
  }
  if (output_mask[1]) dw = column_sum(dy * xh, n, x.scalar_type());
  if (output_mask[2]) db = column_sum(dy, n, x.scalar_type());
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_layer_norm_forward", TORCH_BOX(&fk::ops::layer_norm_forward_cpu));
  m.impl("_layer_norm_backward", TORCH_BOX(&fk::ops::layer_norm_backward_cpu));
}
