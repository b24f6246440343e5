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

constexpr uint32_t kFlagScaled = 2;  // triton_src/swiglu.py FLAG_SCALED

// The multipliers as kernel arguments; the SCALED variants only where one is not 1.
glu::Scalars multipliers(double gate_multiplier, double down_multiplier) {
  const bool scaled = gate_multiplier != 1.0 || down_multiplier != 1.0;
  return {2, {gate_multiplier, down_multiplier}, scaled ? kFlagScaled : 0};
}

Tensor swiglu_cuda(Tensor a, Tensor b, bool, double gate_multiplier, double down_multiplier) {
  check_swiglu(a, b);
  check_swiglu_multipliers(kSwigluNames.op, gate_multiplier, down_multiplier);
  return glu::forward(kSwigluNames.op, forward_kernels(), a, b,
                      multipliers(gate_multiplier, down_multiplier));
}

std::tuple<Tensor, Tensor> swiglu_backward_cuda(Tensor grad_c, Tensor a, Tensor b,
                                                double gate_multiplier,
                                                double down_multiplier) {
  check_swiglu_backward(grad_c, a, b);
  check_swiglu_multipliers(kSwigluNames.backward, gate_multiplier, down_multiplier);
  return glu::backward(kSwigluNames.backward, backward_kernels(), grad_c, a, b,
                       multipliers(gate_multiplier, down_multiplier));
}

void swiglu_backward_in_place_cuda(Tensor grad_c, Tensor a, Tensor b, double gate_multiplier,
                                   double down_multiplier) {
  check_swiglu_backward_in_place(grad_c, a, b);
  check_swiglu_multipliers(kSwigluNames.backward_in_place, gate_multiplier, down_multiplier);
  glu::backward_in_place(kSwigluNames.backward_in_place, backward_kernels(), grad_c, a, b,
                         multipliers(gate_multiplier, down_multiplier));
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("swiglu", TORCH_BOX(&fk::ops::swiglu_cuda));
  m.impl("_swiglu_backward", TORCH_BOX(&fk::ops::swiglu_backward_cuda));
  m.impl("_swiglu_backward_", TORCH_BOX(&fk::ops::swiglu_backward_in_place_cuda));
}
