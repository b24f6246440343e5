// CPU reference of fk::rms_norm in ATen operators (through the stable dispatcher): fp32
// accumulation (fp64 for fp64 inputs), rounding to the input dtype where the casting mode
// says so.
#include "ops/rms_norm/rms_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// offset + weight as the kernel uses it: in the input dtype except in gemma mode.
Tensor weight_term(const Tensor& w, double offset, RmsCasting casting, ScalarType acc) {
  if (casting == RmsCasting::Gemma) return aten::to(w, acc) + offset;
  return aten::to(aten::to(w + offset, w.scalar_type()), acc);
}

// x_hat = x * rstd, rounded as the casting mode says; returned in the accumulation dtype.
Tensor normalized(const Tensor& xf, const Tensor& rstd, RmsCasting casting, ScalarType dtype) {
  auto r = aten::unsqueeze(rstd, -1);
  if (casting == RmsCasting::None) r = aten::to(aten::to(r, dtype), xf.scalar_type());
  auto xh = xf * r;
  if (casting != RmsCasting::Gemma) xh = aten::to(aten::to(xh, dtype), xf.scalar_type());
  return xh;
}

std::tuple<Tensor, Tensor> rms_norm_forward_cpu(Tensor x, std::optional<Tensor> weight,
                                                double eps, double offset,
                                                std::string casting_mode) {
  const auto casting = check_rms_norm(x, weight, casting_mode);
  return rms_norm_forward_reference(x, weight, eps, offset, casting);
}

std::tuple<Tensor, Tensor> rms_norm_backward_cpu(Tensor grad_y, Tensor x,
                                                 std::optional<Tensor> weight, Tensor rstd,
                                                 double offset, std::string casting_mode,
                                                 std::vector<bool> output_mask) {
  const auto casting = check_rms_norm_backward(grad_y, x, weight, rstd, casting_mode);
  return rms_norm_backward_reference(grad_y, x, weight, rstd, offset, casting, output_mask[1]);
}

}  // namespace

std::tuple<Tensor, Tensor> rms_norm_forward_reference(const Tensor& x,
                                                      const std::optional<Tensor>& weight,
                                                      double eps, double offset,
                                                      RmsCasting casting) {
  const auto acc = checks::acc_type(x);
  auto xf = aten::to(x, acc);
  auto rstd = aten::rsqrt(aten::mean(xf * xf, {-1}) + eps);
  auto y = normalized(xf, rstd, casting, x.scalar_type());
  if (has(weight)) y = y * weight_term(*weight, offset, casting, acc);
  return {aten::contiguous(aten::to(y, x.scalar_type())), aten::contiguous(rstd)};
}

std::tuple<Tensor, Tensor> rms_norm_backward_reference(
    const Tensor& grad_y, const Tensor& x, const std::optional<Tensor>& weight,
    const Tensor& rstd, double offset, RmsCasting casting, bool want_dw,
    const Tensor& grad_add) {
  const auto acc = checks::acc_type(x);
  const int64_t n = x.size(-1);
  auto xf = aten::to(x, acc), dy = aten::to(grad_y, acc), rs = aten::to(rstd, acc);
  auto r = aten::unsqueeze(rs, -1);
  auto xh = xf * r;
  auto dxh = has(weight) ? dy * weight_term(*weight, offset, casting, acc) : dy;
  Tensor dx;
  if (n > 0) {
    auto c = aten::sum(dxh * xh, {-1}, /*keepdim=*/true) / static_cast<double>(n);
    auto dxf = r * (dxh - xh * c);
    if (grad_add.defined()) dxf = dxf + aten::to(grad_add, acc);
    dx = aten::contiguous(aten::to(dxf, x.scalar_type()));
  } else {
    dx = aten::empty_like(x);
  }
  Tensor dw;
  if (want_dw && has(weight)) {
    auto xh_used = normalized(xf, rs, casting, x.scalar_type());
    dw = aten::to(aten::sum(aten::reshape(dy * xh_used, {-1, n}), {0}), weight->scalar_type());
  }
  return {dx, dw};
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_rms_norm_forward", TORCH_BOX(&fk::ops::rms_norm_forward_cpu));
  m.impl("_rms_norm_backward", TORCH_BOX(&fk::ops::rms_norm_backward_cpu));
}
