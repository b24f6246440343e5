// CPU reference of fk::geglu in plain ATen (at::gelu), fp32 accumulation (fp64 for fp64).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/geglu/geglu.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

const char* gelu_mode(GeluApprox approx) { return approx == GeluApprox::Tanh ? "tanh" : "none"; }

at::Tensor geglu_cpu(const at::Tensor& a, const at::Tensor& b, c10::string_view approximate,
                     bool) {
  const auto mode = gelu_mode(check_geglu(a, b, approximate));
  const auto acc = checks::acc_type(a);
  return (at::gelu(a.to(acc), mode) * b.to(acc)).to(a.scalar_type()).contiguous();
}

std::tuple<at::Tensor, at::Tensor> geglu_backward_cpu(const at::Tensor& grad_c,
                                                      const at::Tensor& a, const at::Tensor& b,
                                                      c10::string_view approximate) {
  const auto mode = gelu_mode(check_geglu_backward(grad_c, a, b, approximate));
  const auto acc = checks::acc_type(a);
  auto af = a.to(acc), bf = b.to(acc), dc = grad_c.to(acc);
  auto db = dc * at::gelu(af, mode);
  auto da = at::gelu_backward(dc * bf, af, mode);
  return {da.to(a.scalar_type()).contiguous(), db.to(a.scalar_type()).contiguous()};
}

void geglu_backward_in_place_cpu(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b,
                                 c10::string_view approximate) {
  check_geglu_backward_in_place(grad_c, a, b, approximate);
  auto [da, db] = geglu_backward_cpu(grad_c, a, b, approximate);
  a.copy_(da);
  b.copy_(db);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("geglu", fk::ops::geglu_cpu);
  m.impl("_geglu_backward", fk::ops::geglu_backward_cpu);
  m.impl("_geglu_backward_", fk::ops::geglu_backward_in_place_cpu);
}
