// CPU reference of fk::group_norm in ATen operators (through the stable dispatcher): fp32
// math (fp64 for fp64 inputs), two-pass mean / biased variance per (sample, group), one
// rounding of y to x's dtype; the parameter gradients in the parameters' dtype.
#include "ops/group_norm/group_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// A (C,) parameter in the accumulation dtype as (1, C, 1) for the (N, C, HW) view.
Tensor per_channel(const Tensor& p, ScalarType acc) {
  return aten::reshape(aten::to(p, acc), {1, p.size(0), 1});
}

std::tuple<Tensor, Tensor, Tensor> group_norm_forward_cpu(Tensor x,
                                                          std::optional<Tensor> weight,
                                                          std::optional<Tensor> bias,
                                                          int64_t num_groups, double eps) {
  check_group_norm(x, weight, bias, num_groups);
  const auto acc = checks::acc_type(x);
  const auto s = group_norm_shape(x);
  if (x.numel() == 0) {  // no element: an empty y; zero statistics (never read)
    return {aten::empty_like(x), aten::zeros({s.n, num_groups}, acc, x.device()),
            aten::zeros({s.n, num_groups}, acc, x.device())};
  }
  auto xg = aten::reshape(aten::to(x, acc), {s.n, num_groups, -1});
  auto m = aten::mean(xg, {-1}, /*keepdim=*/true);
  auto d = xg - m;
  auto r = aten::rsqrt(aten::mean(d * d, {-1}, /*keepdim=*/true) + eps);
  auto y = aten::reshape(d * r, {s.n, s.c, s.hw});
  if (has(weight)) y = y * per_channel(*weight, acc);
  if (has(bias)) y = y + per_channel(*bias, acc);
  const auto shape = sizes_vec(x);
  y = aten::reshape(aten::to(y, x.scalar_type()), IntArrayRef(shape.data(), shape.size()));
  return {aten::contiguous(y), aten::contiguous(aten::reshape(m, {s.n, num_groups})),
          aten::contiguous(aten::reshape(r, {s.n, num_groups}))};
}

std::tuple<Tensor, Tensor, Tensor> group_norm_backward_cpu(
    Tensor grad_y, Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias,
    Tensor mean, Tensor rstd, int64_t num_groups, std::vector<bool> output_mask) {
  check_group_norm_backward(grad_y, x, weight, bias, mean, rstd, num_groups);
  const auto acc = checks::acc_type(x);
  const auto s = group_norm_shape(x);
  Tensor dx, dw, db;
  if (x.numel() == 0) {
    if (output_mask[0]) dx = aten::empty_like(x);
    if (output_mask[1] && has(weight)) dw = aten::zeros_like(*weight);
    if (output_mask[2] && has(bias)) db = aten::zeros_like(*bias);
    return {dx, dw, db};
  }
  auto m = aten::reshape(aten::to(mean, acc), {s.n, num_groups, 1});
  auto r = aten::reshape(aten::to(rstd, acc), {s.n, num_groups, 1});
  auto xhat = (aten::reshape(aten::to(x, acc), {s.n, num_groups, -1}) - m) * r;
  auto dy = aten::reshape(aten::to(grad_y, acc), {s.n, s.c, s.hw});
  auto xhat_c = aten::reshape(xhat, {s.n, s.c, s.hw});
  if (output_mask[0]) {
    auto g = has(weight) ? dy * per_channel(*weight, acc) : dy;
    auto gg = aten::reshape(g, {s.n, num_groups, -1});
    auto a = aten::mean(gg * xhat, {-1}, /*keepdim=*/true);
    auto b = aten::mean(gg, {-1}, /*keepdim=*/true);
    auto dxg = r * (gg - xhat * a - b);
    const auto shape = sizes_vec(x);
    dx = aten::contiguous(aten::reshape(aten::to(dxg, x.scalar_type()),
                                        IntArrayRef(shape.data(), shape.size())));
  }
  if (output_mask[1] && has(weight)) {
    dw = aten::to(aten::sum(dy * xhat_c, {0, 2}), weight->scalar_type());
  }
  if (output_mask[2] && has(bias)) {
    db = aten::to(aten::sum(dy, {0, 2}), bias->scalar_type());
  }
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_group_norm_forward", TORCH_BOX(&fk::ops::group_norm_forward_cpu));
  m.impl("_group_norm_backward", TORCH_BOX(&fk::ops::group_norm_backward_cpu));
}
