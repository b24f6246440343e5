// CPU reference of fk::rms_norm in plain ATen: fp32 accumulation (fp64 for fp64 inputs),
// rounding to the input dtype where the casting mode says so.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/rms_norm/rms_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

bool has(const std::optional<at::Tensor>& w) { return w.has_value() && w->defined(); }

// offset + weight as the kernel uses it: in the input dtype except in gemma mode.
at::Tensor weight_term(const at::Tensor& w, double offset, RmsCasting casting,
                       at::ScalarType acc) {
  if (casting == RmsCasting::Gemma) return w.to(acc) + offset;
  return (w + offset).to(w.scalar_type()).to(acc);
}

// x_hat = x * rstd, rounded as the casting mode says; returned in the accumulation dtype.
at::Tensor normalized(const at::Tensor& xf, const at::Tensor& rstd, RmsCasting casting,
                      at::ScalarType dtype) {
  auto r = rstd.unsqueeze(-1);
  if (casting == RmsCasting::None) r = r.to(dtype).to(xf.scalar_type());
  auto xh = xf * r;
  if (casting != RmsCasting::Gemma) xh = xh.to(dtype).to(xf.scalar_type());
  return xh;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_cpu(const at::Tensor& x,
                                                        const std::optional<at::Tensor>& weight,
                                                        double eps, double offset,
                                                        c10::string_view casting_mode) {
  const auto casting = check_rms_norm(x, weight, casting_mode);
  return rms_norm_forward_reference(x, weight, eps, offset, casting);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double offset, c10::string_view casting_mode,
    std::array<bool, 2> output_mask) {
  const auto casting = check_rms_norm_backward(grad_y, x, weight, rstd, casting_mode);
  return rms_norm_backward_reference(grad_y, x, weight, rstd, offset, casting, output_mask[1]);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_reference(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps, double offset,
    RmsCasting casting) {
  const auto acc = checks::acc_type(x);
  auto xf = x.to(acc);
  auto rstd = at::rsqrt(xf.pow(2).mean(-1) + eps);
  auto y = normalized(xf, rstd, casting, x.scalar_type());
  if (has(weight)) y = y * weight_term(*weight, offset, casting, acc);
  return {y.to(x.scalar_type()).contiguous(), rstd.contiguous()};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_reference(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double offset, RmsCasting casting, bool want_dw,
    const at::Tensor& grad_add) {
  const auto acc = checks::acc_type(x);
  const int64_t n = x.size(-1);
  auto xf = x.to(acc), dy = grad_y.to(acc), rs = rstd.to(acc);
  auto r = rs.unsqueeze(-1);
  auto xh = xf * r;
  auto dxh = has(weight) ? dy * weight_term(*weight, offset, casting, acc) : dy;
  at::Tensor dx;
  if (n > 0) {
    auto c = (dxh * xh).sum(-1, /*keepdim=*/true) / static_cast<double>(n);
    auto dxf = r * (dxh - xh * c);
    if (grad_add.defined()) dxf = dxf + grad_add.to(acc);
    dx = dxf.to(x.scalar_type()).contiguous();
  } else {
    dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  }
  at::Tensor dw;
  if (want_dw && has(weight)) {
    auto xh_used = normalized(xf, rs, casting, x.scalar_type());
    dw = (dy * xh_used).reshape({-1, n}).sum(0).to(weight->scalar_type());
  }
  return {dx, dw};
}

}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_rms_norm_forward", fk::ops::rms_norm_forward_cpu);
  m.impl("_rms_norm_backward", fk::ops::rms_norm_backward_cpu);
}
