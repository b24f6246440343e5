// CPU reference of fk::poly_norm in ATen operators (through the stable dispatcher): fp32
// math (fp64 for fp64 inputs), one rounding of y to x's dtype; the parameter gradients in
// the parameters' dtype and shape.
#include "ops/poly_norm/poly_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

Tensor shaped_like(const Tensor& v, const Tensor& like) {
  const auto shape = sizes_vec(like);
  return aten::reshape(aten::to(v, like.scalar_type()), IntArrayRef(shape.data(), shape.size()));
}

std::tuple<Tensor, Tensor> poly_norm_forward_cpu(Tensor x, Tensor weight, Tensor bias,
                                                 double eps) {
  check_poly_norm(x, weight, bias);
  const auto acc = checks::acc_type(x);
  auto xf = aten::to(x, acc), w = aten::to(weight, acc);
  auto b = aten::reshape(aten::to(bias, acc), {1});
  std::vector<Tensor> powers = {xf * xf * xf, xf * xf, xf}, rstds;
  Tensor y = aten::zeros_like(xf) + b;
  for (int p = 0; p < 3; ++p) {
    auto r = aten::rsqrt(aten::mean(powers[p] * powers[p], {-1}, /*keepdim=*/true) + eps);
    rstds.push_back(r);
    y = y + aten::select(w, 0, p) * (powers[p] * r);
  }
  return {aten::contiguous(aten::to(y, x.scalar_type())), aten::contiguous(aten::cat(rstds, -1))};
}

std::tuple<Tensor, Tensor, Tensor> poly_norm_backward_cpu(Tensor grad_y, Tensor x,
                                                          Tensor weight, Tensor bias,
                                                          Tensor rstd,
                                                          std::vector<bool> output_mask) {
  check_poly_norm_backward(grad_y, x, weight, bias, rstd);
  const auto acc = checks::acc_type(x);
  const int64_t n = x.size(-1);
  auto xf = aten::to(x, acc), dy = aten::to(grad_y, acc), w = aten::to(weight, acc);
  auto sizes = sizes_vec(x);
  sizes.back() = 3;
  auto rs = aten::reshape(aten::to(rstd, acc), IntArrayRef(sizes.data(), sizes.size()));
  std::vector<Tensor> powers = {xf * xf * xf, xf * xf, xf};
  std::vector<Tensor> dpowers = {3.0 * (xf * xf), 2.0 * xf, Tensor()};
  Tensor dx, dw, db;
  std::vector<Tensor> dws;
  Tensor dxf;
  for (int p = 0; p < 3; ++p) {
    auto r = aten::narrow(rs, -1, p, 1);
    auto s = aten::sum(dy * powers[p], {-1}, /*keepdim=*/true);
    dws.push_back(aten::sum_all(r * s));
    if (n == 0) continue;
    auto du = r * dy - powers[p] * (r * r * r * s / static_cast<double>(n));
    auto term = aten::select(w, 0, p) * (dpowers[p].defined() ? du * dpowers[p] : du);
    dxf = dxf.defined() ? dxf + term : term;
  }
  if (output_mask[0]) {
    dx = n == 0 ? aten::empty_like(x) : aten::contiguous(aten::to(dxf, x.scalar_type()));
  }
  if (output_mask[1]) dw = aten::to(aten::stack(dws, 0), weight.scalar_type());
  if (output_mask[2]) db = shaped_like(aten::sum_all(dy), bias);
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_poly_norm_forward", TORCH_BOX(&fk::ops::poly_norm_forward_cpu));
  m.impl("_poly_norm_backward", TORCH_BOX(&fk::ops::poly_norm_backward_cpu));
}
