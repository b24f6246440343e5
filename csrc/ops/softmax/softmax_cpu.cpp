// CPU reference of fk::softmax in ATen operators (through the stable dispatcher): fp32 math
// (fp64 for fp64 inputs), one rounding to the input dtype.
#include "ops/softmax/softmax.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

Tensor softmax_cpu(Tensor x, int64_t dim) {
  const int64_t d = check_softmax(x, dim);
  return aten::contiguous(
      aten::to(aten::softmax(aten::to(x, checks::acc_type(x)), d), x.scalar_type()));
}

Tensor softmax_backward_cpu(Tensor grad_y, Tensor y, int64_t dim) {
  const int64_t d = check_softmax_backward(grad_y, y, dim);
  const auto acc = checks::acc_type(y);
  auto yf = aten::to(y, acc), dy = aten::to(grad_y, acc);
  auto dx = yf * (dy - aten::sum(dy * yf, {d}, /*keepdim=*/true));
  return aten::contiguous(aten::to(dx, y.scalar_type()));
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("softmax", TORCH_BOX(&fk::ops::softmax_cpu));
  m.impl("_softmax_backward", TORCH_BOX(&fk::ops::softmax_backward_cpu));
}
