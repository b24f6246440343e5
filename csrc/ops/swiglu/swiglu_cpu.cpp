// CPU reference of fk::swiglu in plain ATen, fp32 accumulation (fp64 for fp64 inputs).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/swiglu/swiglu.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

at::Tensor swiglu_cpu(const at::Tensor& a, const at::Tensor& b, bool) {
  check_swiglu(a, b);
  const auto acc = checks::acc_type(a);
  auto af = a.to(acc);
  return (af * at::sigmoid(af) * b.to(acc)).to(a.scalar_type()).contiguous();
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_cpu(const at::Tensor& grad_c,
                                                       const at::Tensor& a,
                                                       const at::Tensor& b) {
  check_swiglu_backward(grad_c, a, b);
  const auto acc = checks::acc_type(a);
  auto af = a.to(acc), bf = b.to(acc), dc = grad_c.to(acc);
  auto s = at::sigmoid(af);
  auto silu = af * s;
  auto db = dc * silu;
  auto da = dc * bf * (s + silu * (1 - s));
  return {da.to(a.scalar_type()).contiguous(), db.to(a.scalar_type()).contiguous()};
}

void swiglu_backward_in_place_cpu(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b) {
  check_swiglu_backward_in_place(grad_c, a, b);
  auto [da, db] = swiglu_backward_cpu(grad_c, a, b);
  a.copy_(da);
  b.copy_(db);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("swiglu", fk::ops::swiglu_cpu);
  m.impl("_swiglu_backward", fk::ops::swiglu_backward_cpu);
  m.impl("_swiglu_backward_", fk::ops::swiglu_backward_in_place_cpu);
}
