// CPU reference of fk::softmax in plain ATen: fp32 math (fp64 for fp64 inputs), one
// rounding to the input dtype.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/softmax/softmax.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

at::Tensor softmax_cpu(const at::Tensor& x, int64_t dim) {
  const int64_t d = check_softmax(x, dim);
  return at::softmax(x.to(checks::acc_type(x)), d).to(x.scalar_type()).contiguous();
}

at::Tensor softmax_backward_cpu(const at::Tensor& grad_y, const at::Tensor& y, int64_t dim) {
  const int64_t d = check_softmax_backward(grad_y, y, dim);
  const auto acc = checks::acc_type(y);
  auto yf = y.to(acc), dy = grad_y.to(acc);
  auto dx = yf * (dy - (dy * yf).sum(d, /*keepdim=*/true));
  return dx.to(y.scalar_type()).contiguous();
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("softmax", fk::ops::softmax_cpu);
  m.impl("_softmax_backward", fk::ops::softmax_backward_cpu);
}
