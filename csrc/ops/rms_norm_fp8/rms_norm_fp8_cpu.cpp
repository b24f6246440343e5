// CPU reference of fk::rms_norm_fp8: fk::rms_norm's reference (llama casting), then
// fk::fp8_quantize's CPU kernel on its output, through the dispatcher.
#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm_fp8/rms_norm_fp8.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

using Out6 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

Out6 rms_norm_fp8_cpu(Tensor x, Tensor weight, double eps, std::string layout, bool pow2_scales,
                      bool return_norm) {
  check_rms_norm_fp8(x, weight, layout);
  // Contiguous first, as the CUDA kernels read it: the sums of squares are then taken in
  // the same order whatever x's strides.
  auto [y, rstd] = rms_norm_forward_reference(aten::contiguous(x), weight, eps, 0.0,
                                              RmsCasting::Llama);
  const int64_t k = x.size(-1), m = rstd.numel();
  auto q = aten::call_n<4>("fk::fp8_quantize", "", aten::reshape(y, {m, k}), int64_t{1},
                           layout, pow2_scales);
  return {q[0], q[1], q[2], q[3], aten::reshape(rstd, {m}), return_norm ? y : Tensor()};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("rms_norm_fp8", TORCH_BOX(&fk::ops::rms_norm_fp8_cpu));
}
