// CPU reference of fk::tvd in ATen operators (through the stable dispatcher), float32 math
// (float64 for float64 p): the same per-element formulas as the CUDA kernels
// (triton_src/tvd.py).
#include "ops/tvd/tvd.h"

namespace fk::ops {

Tensor tvd_forward_cpu(const Tensor& p, const Tensor& q, const Tensor& labels,
                       const Tensor& grad, TvdReduction r, int64_t ignore_index) {
  const auto dtype = p.scalar_type() == kDouble ? kDouble : kFloat;
  const int64_t m = p.size(0), v = p.size(1);
  auto x = aten::to(p, dtype), y = aten::to(q, dtype);
  auto zero = aten::full({}, 0.0, dtype, p.device());
  auto loss = aten::call("aten::abs", "", x - y) * 0.5;
  Tensor keep;
  if (labels.defined()) {
    keep = aten::unsqueeze(aten::ne(labels, aten::scalar_int(ignore_index)), 1);
    loss = aten::where(keep, loss, zero);
  }
  auto s = tvd_scale(labels, m, v, ignore_index, r, dtype, p.device());
  if (grad.defined()) {
    // 0.5 * s * sign(p - q), 0 where p == q and -0.5 * s where either is NaN.
    auto h = s * aten::full({}, 0.5, dtype, p.device());  // s is 0-dim: stays in dtype
    auto g = aten::where(aten::eq(x, y), zero, aten::where(aten::lt(y, x), h, -h));
    if (keep.defined()) g = aten::where(keep, g, zero);
    aten::copy_(grad, g);
  }
  if (r == TvdReduction::None) return loss;
  return aten::sum_all(loss) * s;
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_tvd_forward", TORCH_BOX(&fk::ops::tvd_forward_impl));
  m.impl("_tvd_backward", TORCH_BOX(&fk::ops::tvd_backward_impl));
  m.impl("_tvd_backward_", TORCH_BOX(&fk::ops::tvd_backward_inplace_impl));
}
