// CPU reference of fk::jsd in ATen operators (through the stable dispatcher), float32 math
// (float64 for float64 inputs): the per-element formulas of triton_src/jsd.py.
#include "ops/jsd/jsd.h"

#include "runtime/checks.h"

namespace fk::ops {

Tensor jsd_cpu(const Tensor& x_in, const Tensor& y_in, const std::optional<Tensor>& labels,
               double beta, int64_t ignore_index, const Tensor& grad) {
  const auto acc = checks::acc_type(x_in);
  const auto dev = x_in.device();
  auto x = aten::to(x_in, acc), y = aten::to(y_in, acc);
  Tensor l, g;
  switch (jsd_mode(beta)) {
    case JsdMode::Forward: {
      auto p = aten::exp(y);
      l = p * (y - x);
      g = -p;
      break;
    }
    case JsdMode::Reverse: {
      auto q = aten::exp(x);
      l = q * (x - y);
      g = l + q;
      break;
    }
    case JsdMode::General: {
      auto s = aten::maximum(x, y);
      auto log_m = s + aten::log(beta * aten::exp(y - s) + (1.0 - beta) * aten::exp(x - s));
      auto q = aten::exp(x), p = aten::exp(y);
      g = (1.0 - beta) * q * (x - log_m);
      l = beta * p * (y - log_m) + g;
      break;
    }
  }
  const auto zero = aten::zeros({}, acc, dev);
  Tensor rows = aten::sum(l, {1});
  Tensor scale;
  Tensor keep;
  if (labels) {
    keep = aten::ne(*labels, aten::scalar_int(ignore_index));
    auto n = aten::sum_all(aten::to(keep, acc));
    scale = aten::reciprocal(aten::maximum(n, aten::full({}, 1.0, acc, dev)));
    rows = aten::where(keep, rows, zero);
  } else {
    scale = aten::full({}, 1.0 / static_cast<double>(x.size(0)), acc, dev);
  }
  if (grad.defined()) {
    if (keep.defined()) g = aten::where(aten::unsqueeze(keep, 1), g, zero);
    aten::copy_(grad, g * scale);
  }
  return aten::to(aten::sum_all(rows) * scale, x_in.scalar_type());
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_jsd_forward", TORCH_BOX(&fk::ops::jsd_forward_impl));
}
