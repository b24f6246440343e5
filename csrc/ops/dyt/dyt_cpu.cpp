// CPU reference of fk::dyt in ATen operators (through the stable dispatcher): fp32 math
// (fp64 for fp64 inputs), one rounding to x's dtype; parameter gradients summed in the same
// precision and returned in the parameters' dtype and shape.
#include "ops/dyt/dyt.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

Tensor dyt_cpu(Tensor x, Tensor alpha, Tensor gamma, std::optional<Tensor> beta) {
  check_dyt(x, alpha, gamma, beta);
  const auto acc = checks::acc_type(x);
  auto a = aten::reshape(aten::to(alpha, acc), {1});
  auto y = aten::tanh(aten::to(x, acc) * a) * aten::to(gamma, acc);
  if (has(beta)) y = y + aten::to(*beta, acc);
  return aten::contiguous(aten::to(y, x.scalar_type()));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> dyt_backward_cpu(Tensor grad_y, Tensor x,
                                                            Tensor alpha, Tensor gamma,
                                                            std::optional<Tensor> beta,
                                                            std::vector<bool> output_mask) {
  check_dyt_backward(grad_y, x, alpha, gamma, beta);
  const auto acc = checks::acc_type(x);
  const int64_t n = x.size(-1);
  auto xf = aten::to(x, acc), dy = aten::to(grad_y, acc);
  auto a = aten::reshape(aten::to(alpha, acc), {1});
  auto t = aten::tanh(xf * a);
  auto s = (1.0 - t * t) * (dy * aten::to(gamma, acc));
  Tensor dx, da, dg, db;
  if (output_mask[0]) dx = aten::contiguous(aten::to(s * a, x.scalar_type()));
  auto rows_sum = [&](const Tensor& v) {
    if (x.numel() == 0) return aten::zeros({n}, acc, x.device());
    return aten::sum(aten::reshape(v, {-1, n}), {0});
  };
  if (output_mask[1]) {
    const auto shape = sizes_vec(alpha);
    da = aten::reshape(aten::to(aten::sum_all(xf * s), alpha.scalar_type()),
                       IntArrayRef(shape.data(), shape.size()));
  }
  if (output_mask[2]) dg = aten::to(rows_sum(dy * t), gamma.scalar_type());
  if (output_mask[3] && has(beta)) db = aten::to(rows_sum(dy), beta->scalar_type());
  return {dx, da, dg, db};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("dyt", TORCH_BOX(&fk::ops::dyt_cpu));
  m.impl("_dyt_backward", TORCH_BOX(&fk::ops::dyt_backward_cpu));
}
