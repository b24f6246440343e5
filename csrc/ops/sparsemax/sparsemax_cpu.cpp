// CPU reference of fk::sparsemax in ATen operators (through the stable dispatcher), from the
// sorted slice: fp32 math (fp64 for fp64 inputs), one rounding to the input dtype.
#include <array>
#include <limits>
#include <optional>

#include "ops/sparsemax/sparsemax.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

Tensor sparsemax_cpu(Tensor x, int64_t dim) {
  const int64_t d = check_sparsemax(x, dim);
  if (x.numel() == 0) return aten::empty(x.sizes(), x.scalar_type(), x.device());
  const auto acc = checks::acc_type(x);
  auto xf = aten::to(x.dim() == 0 ? aten::reshape(x, {1}) : x, acc);
  auto m = aten::amax(xf, {d}, /*keepdim=*/true);
  auto z = xf - m;
  // Sorted descending: the support is the longest prefix with 1 + k * z_(k) > cumsum_k.
  auto zs = aten::call_n<2>("aten::sort", "", z, d, /*descending=*/true)[0];
  const std::optional<ScalarType> none;
  auto csum = aten::call("aten::cumsum", "", zs, d, none);
  auto k = aten::call("aten::cumsum", "", aten::full(xf.sizes(), 1.0, acc, xf.device()), d,
                      none);
  auto support = aten::lt(csum, 1.0 + k * zs);
  auto zero = aten::scalar(0.0);
  auto count = aten::sum(aten::to(support, acc), {d}, /*keepdim=*/true);
  auto tau = (aten::sum(aten::where(support, zs, zero), {d}, true) - 1.0) / count;
  auto y = aten::maximum(z - tau, aten::zeros_like(z));
  // No finite maximum (a +inf, a NaN, or only -inf): the slice is NaN.
  auto bad = aten::ne(m - m, zero);
  y = aten::where(bad, aten::scalar(std::numeric_limits<double>::quiet_NaN()), y);
  y = aten::to(y, x.scalar_type());
  return aten::contiguous(x.dim() == 0 ? aten::reshape(y, {}) : y);
}

Tensor sparsemax_backward_cpu(Tensor grad_y, Tensor y, int64_t dim) {
  const int64_t d = check_sparsemax_backward(grad_y, y, dim);
  if (y.numel() == 0) return aten::empty(y.sizes(), y.scalar_type(), y.device());
  const auto acc = checks::acc_type(y);
  const bool scalar = y.dim() == 0;
  auto yf = aten::to(scalar ? aten::reshape(y, {1}) : y, acc);
  auto dy = aten::to(scalar ? aten::reshape(grad_y, {1}) : grad_y, acc);
  auto zero = aten::scalar(0.0);
  auto on = aten::lt(zero, yf);
  auto count = aten::sum(aten::to(on, acc), {d}, /*keepdim=*/true);
  auto mean = aten::sum(aten::where(on, dy, zero), {d}, true) /
              aten::maximum(count, aten::scalar(1.0));
  auto dx = aten::to(aten::where(on, dy - mean, zero), y.scalar_type());
  return aten::contiguous(scalar ? aten::reshape(dx, {}) : dx);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("sparsemax", TORCH_BOX(&fk::ops::sparsemax_cpu));
  m.impl("_sparsemax_backward", TORCH_BOX(&fk::ops::sparsemax_backward_cpu));
}
