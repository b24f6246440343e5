// CUDA kernels of fk::geglu: AOT-compiled Triton (triton_src/geglu.py), one kernel family
// per gelu form and pass.
#include "ops/geglu/geglu.h"
#include "ops/glu/glu_cuda.h"

namespace fk::ops {
namespace {

const runtime::KernelFamily& kernels(GeluApprox approx, bool backward) {
  static const runtime::KernelFamily* fams[2][2] = {
      {&runtime::family("geglu_erf_fwd"), &runtime::family("geglu_erf_bwd")},
      {&runtime::family("geglu_tanh_fwd"), &runtime::family("geglu_tanh_bwd")}};
  return *fams[approx == GeluApprox::Tanh][backward];
}

Tensor geglu_cuda(Tensor a, Tensor b, std::string approximate, bool) {
  const auto approx = check_geglu(a, b, approximate);
  return glu::forward(kGegluNames.op, kernels(approx, false), a, b);
}

std::tuple<Tensor, Tensor> geglu_backward_cuda(Tensor grad_c, Tensor a, Tensor b,
                                               std::string approximate) {
  const auto approx = check_geglu_backward(grad_c, a, b, approximate);
  return glu::backward(kGegluNames.backward, kernels(approx, true), grad_c, a, b);
}

void geglu_backward_in_place_cuda(Tensor grad_c, Tensor a, Tensor b, std::string approximate) {
  const auto approx = check_geglu_backward_in_place(grad_c, a, b, approximate);
  glu::backward_in_place(kGegluNames.backward_in_place, kernels(approx, true), grad_c, a, b);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("geglu", TORCH_BOX(&fk::ops::geglu_cuda));
  m.impl("_geglu_backward", TORCH_BOX(&fk::ops::geglu_backward_cuda));
  m.impl("_geglu_backward_", TORCH_BOX(&fk::ops::geglu_backward_in_place_cuda));
}
