// CPU reference of fk::layer_norm in plain ATen: statistics and affine in fp32 (fp64 for fp64
// inputs), one rounding of y to the input dtype.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "ops/layer_norm/layer_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_cpu(
    const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps) {
  check_layer_norm(x, weight, bias);
  const auto acc = checks::acc_type(x);
  auto xf = x.to(acc);
  auto mean = xf.mean(-1, /*keepdim=*/true);
  auto xc = xf - mean;
  auto rstd = at::rsqrt((xc * xc).mean(-1, /*keepdim=*/true) + eps);
  auto y = xc * rstd;
  if (has(weight)) y = y * weight->to(acc);
  if (has(bias)) y = y + bias->to(acc);
  return {y.to(x.scalar_type()).contiguous(), mean.squeeze(-1).contiguous(),
          rstd.squeeze(-1).contiguous()};
}

// Sum over every row of x, as a (N,) tensor of `dtype` (zeros when N or the row count is 0).
at::Tensor column_sum(const at::Tensor& t, int64_t n, at::ScalarType dtype) {
  if (n == 0) return at::zeros({0}, t.options().dtype(dtype));
  return t.reshape({-1, n}).sum(0).to(dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd, std::array<bool, 3> output_mask) {
  check_layer_norm_backward(grad_y, x, weight, mean, rstd);
  const auto acc = checks::acc_type(x);
  const int64_t n = x.size(-1);
  auto dy = grad_y.to(acc);
  auto r = rstd.to(acc).unsqueeze(-1);
  auto xh = (x.to(acc) - mean.to(acc).unsqueeze(-1)) * r;
  at::Tensor dx, dw, db;
  if (output_mask[0]) {
    if (n > 0) {
      auto g = has(weight) ? dy * weight->to(acc) : dy;
      auto c1 = g.mean(-1, /*keepdim=*/true);
      auto c2 = (g * xh).mean(-1, /*keepdim=*/true);
      dx = (r * (g - c1 - xh * c2)).to(x.scalar_type()).contiguous();
    } else {
      dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    }
  }
  if (output_mask[1]) dw = column_sum(dy * xh, n, x.scalar_type());
  if (output_mask[2]) db = column_sum(dy, n, x.scalar_type());
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_layer_norm_forward", fk::ops::layer_norm_forward_cpu);
  m.impl("_layer_norm_backward", fk::ops::layer_norm_backward_cpu);
}
