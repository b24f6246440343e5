// CPU reference of fk::swiglu in ATen operators (through the stable dispatcher), fp32
// accumulation (fp64 for fp64 inputs).
#include "ops/swiglu/swiglu.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// silu(a * gm) * b * dm; gm = dm = 1 skips the multiplications.
Tensor swiglu_cpu(Tensor a, Tensor b, bool, double gm, double dm) {
  check_swiglu(a, b);
  check_swiglu_multipliers(kSwigluNames.op, gm, dm);
  const auto acc = checks::acc_type(a);
  auto u = aten::to(a, acc);
  if (gm != 1.0) u = u * gm;
  auto c = u * aten::sigmoid(u) * aten::to(b, acc);
  if (dm != 1.0) c = c * dm;
  return aten::contiguous(aten::to(c, a.scalar_type()));
}

// With u = a * gm and g = grad_c * dm: grad_b = g * silu(u), grad_a = g * b * silu'(u) * gm.
std::tuple<Tensor, Tensor> swiglu_backward_reference(const Tensor& grad_c, const Tensor& a,
                                                     const Tensor& b, double gm, double dm) {
  const auto acc = checks::acc_type(a);
  auto u = aten::to(a, acc), bf = aten::to(b, acc), g = aten::to(grad_c, acc);
  if (gm != 1.0) u = u * gm;
  if (dm != 1.0) g = g * dm;
  auto s = aten::sigmoid(u);
  auto silu = u * s;
  auto db = g * silu;
  auto da = g * bf * (s + silu * (1.0 - s));
  if (gm != 1.0) da = da * gm;
  return {aten::contiguous(aten::to(da, a.scalar_type())),
          aten::contiguous(aten::to(db, a.scalar_type()))};
}

std::tuple<Tensor, Tensor> swiglu_backward_cpu(Tensor grad_c, Tensor a, Tensor b, double gm,
                                               double dm) {
  check_swiglu_backward(grad_c, a, b);
  check_swiglu_multipliers(kSwigluNames.backward, gm, dm);
  return swiglu_backward_reference(grad_c, a, b, gm, dm);
}

void swiglu_backward_in_place_cpu(Tensor grad_c, Tensor a, Tensor b, double gm, double dm) {
  check_swiglu_backward_in_place(grad_c, a, b);
  check_swiglu_multipliers(kSwigluNames.backward_in_place, gm, dm);
  auto [da, db] = swiglu_backward_reference(grad_c, a, b, gm, dm);
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
