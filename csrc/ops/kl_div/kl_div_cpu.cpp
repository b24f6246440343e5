// CPU reference of fk::kl_div in ATen operators (through the stable dispatcher), float32
// math (float64 for float64 input): the same pointwise formulas as the CUDA kernels
// (triton_src/kl_div.py).
#include "ops/kl_div/kl_div.h"

#include "runtime/checks.h"

namespace fk::ops {
namespace {

// A 0-dim tensor of `dtype` on `like`'s device (so that products keep `dtype`).
Tensor constant(double v, ScalarType dtype, const Tensor& like) {
  return aten::full({}, v, dtype, like.device());
}

// The pointwise losses of x and t (both of the accumulation dtype).
Tensor terms(const Tensor& x, const Tensor& t, double eps, bool log_target) {
  if (log_target) return aten::exp(t) * (t - x);
  const auto dtype = x.scalar_type();
  const auto zero = constant(0.0, dtype, x);
  auto xlogt = t * aten::log(aten::maximum(t, constant(eps, dtype, x)));
  return aten::where(aten::eq(t, zero), zero, xlogt) - t * x;
}

// d loss / d x of the pointwise loss, for t of the accumulation dtype.
Tensor slope(const Tensor& t, bool log_target) {
  return log_target ? aten::neg(aten::exp(t)) : aten::neg(t);
}

}  // namespace

Tensor kl_div_reduce_cpu(const Tensor& x, const Tensor& t, const Tensor& grad, double scale,
                         double eps, bool log_target) {
  const auto dtype = checks::acc_type(x);
  auto xf = aten::to(x, dtype), tf = aten::to(t, dtype);
  const auto s = constant(scale, dtype, x);
  if (grad.defined()) aten::copy_(grad, slope(tf, log_target) * s);
  return aten::sum_all(terms(xf, tf, eps, log_target)) * s;
}

void kl_div_pointwise_cpu(const Tensor& a, const Tensor& t, const Tensor& out, double eps,
                          bool log_target, bool backward) {
  const auto dtype = checks::acc_type(t);
  auto af = aten::to(a, dtype), tf = aten::to(t, dtype);
  aten::copy_(out, backward ? af * slope(tf, log_target) : terms(af, tf, eps, log_target));
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_kl_div_forward", TORCH_BOX(&fk::ops::kl_div_forward_impl));
  m.impl("_kl_div_backward", TORCH_BOX(&fk::ops::kl_div_backward_impl));
}
