// CUDA kernels of fk::swiglu: AOT-compiled Triton (triton_src/swiglu.py).
#include "ops/glu/glu_cuda.h"
#include "ops/swiglu/swiglu.h"

namespace fk::ops {
namespace {

const runtime::KernelFamily& forward_kernels() {
  static const auto& fam = runtime::family("swiglu_fwd");
  return fam;
}

const runtime::KernelFamily& backward_kernels() {
  static const auto& fam = runtime::family("swiglu_bwd");
  return fam;
}

Tensor swiglu_cuda(Tensor a, Tensor b, bool) {
  check_swiglu(a, b);
  return glu::forward(kSwigluNames.op, forward_kernels(), a, b);
}

std::tuple<Tensor, Tensor> swiglu_backward_cuda(Tensor grad_c, Tensor a, Tensor b) {
  check_swiglu_backward(grad_c, a, b);
  return glu::backward(kSwigluNames.backward, backward_kernels(), grad_c, a, b);
}

void swiglu_backward_in_place_cuda(Tensor grad_c, Tensor a, Tensor b) {
  check_swiglu_backward_in_place(grad_c, a, b);
  glu::backward_in_place(kSwigluNames.backward_in_place, backward_kernels(), grad_c, a, b);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("swiglu", TORCH_BOX(&fk::ops::swiglu_cuda));
  m.impl("_swiglu_backward", TORCH_BOX(&fk::ops::swiglu_backward_cuda));
  m.impl("_swiglu_backward_", TORCH_BOX(&fk::ops::swiglu_backward_in_place_cuda));
}
