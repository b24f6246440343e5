// CPU reference of fk::geglu in ATen operators (aten::gelu, through the stable dispatcher),
// fp32 accumulation (fp64 for fp64 inputs).
#include "ops/geglu/geglu.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

std::string gelu_mode(GeluApprox approx) { return approx == GeluApprox::Tanh ? "tanh" : "none"; }

Tensor geglu_cpu(Tensor a, Tensor b, std::string approximate, bool) {
  const auto mode = gelu_mode(check_geglu(a, b, approximate));
  const auto acc = checks::acc_type(a);
  return aten::contiguous(
      aten::to(aten::gelu(aten::to(a, acc), mode) * aten::to(b, acc), a.scalar_type()));
}

std::tuple<Tensor, Tensor> geglu_backward_reference(const Tensor& grad_c, const Tensor& a,
                                                    const Tensor& b, const std::string& mode) {
  const auto acc = checks::acc_type(a);
  auto af = aten::to(a, acc), bf = aten::to(b, acc), dc = aten::to(grad_c, acc);
  auto db = dc * aten::gelu(af, mode);
  auto da = aten::gelu_backward(dc * bf, af, mode);
  return {aten::contiguous(aten::to(da, a.scalar_type())),
          aten::contiguous(aten::to(db, a.scalar_type()))};
}

std::tuple<Tensor, Tensor> geglu_backward_cpu(Tensor grad_c, Tensor a, Tensor b,
                                              std::string approximate) {
  const auto mode = gelu_mode(check_geglu_backward(grad_c, a, b, approximate));
  return geglu_backward_reference(grad_c, a, b, mode);
}

void geglu_backward_in_place_cpu(Tensor grad_c, Tensor a, Tensor b, std::string approximate) {
  const auto mode = gelu_mode(check_geglu_backward_in_place(grad_c, a, b, approximate));
  auto [da, db] = geglu_backward_reference(grad_c, a, b, mode);
  aten::copy_(a, da);
  aten::copy_(b, db);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("geglu", TORCH_BOX(&fk::ops::geglu_cpu));
  m.impl("_geglu_backward", TORCH_BOX(&fk::ops::geglu_backward_cpu));
  m.impl("_geglu_backward_", TORCH_BOX(&fk::ops::geglu_backward_in_place_cpu));
}
