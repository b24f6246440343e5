// CPU reference of fk::swiglu in ATen operators (through the stable dispatcher), fp32
// accumulation (fp64 for fp64 inputs).
#include "ops/swiglu/swiglu.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

Tensor swiglu_cpu(Tensor a, Tensor b, bool) {
  check_swiglu(a, b);
  const auto acc = checks::acc_type(a);
  auto af = aten::to(a, acc);
  return aten::contiguous(aten::to(af * aten::sigmoid(af) * aten::to(b, acc), a.scalar_type()));
}

std::tuple<Tensor, Tensor> swiglu_backward_reference(const Tensor& grad_c, const Tensor& a,
                                                     const Tensor& b) {
  const auto acc = checks::acc_type(a);
  auto af = aten::to(a, acc), bf = aten::to(b, acc), dc = aten::to(grad_c, acc);
  auto s = aten::sigmoid(af);
  auto silu = af * s;
  auto db = dc * silu;
  auto da = dc * bf * (s + silu * (1.0 - s));
  return {aten::contiguous(aten::to(da, a.scalar_type())),
          aten::contiguous(aten::to(db, a.scalar_type()))};
}

std::tuple<Tensor, Tensor> swiglu_backward_cpu(Tensor grad_c, Tensor a, Tensor b) {
  check_swiglu_backward(grad_c, a, b);
  return swiglu_backward_reference(grad_c, a, b);
}

void swiglu_backward_in_place_cpu(Tensor grad_c, Tensor a, Tensor b) {
  check_swiglu_backward_in_place(grad_c, a, b);
  auto [da, db] = swiglu_backward_reference(grad_c, a, b);
  aten::copy_(a, da);
  aten::copy_(b, db);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("swiglu", TORCH_BOX(&fk::ops::swiglu_cpu));
  m.impl("_swiglu_backward", TORCH_BOX(&fk::ops::swiglu_backward_cpu));
  m.impl("_swiglu_backward_", TORCH_BOX(&fk::ops::swiglu_backward_in_place_cpu));
}
