// CPU reference of the divergence rows of fk::fused_linear_jsd in ATen operators (through
// the stable dispatcher), in the logits' dtype (float32, float64 for float64 inputs): the
// same per-row formulas as the CUDA kernel (triton_src/fused_linear_jsd.py).
#include "ops/fused_linear_jsd/fused_linear_jsd.h"

#include <cmath>

namespace fk::ops {

void jsd_rows_cpu(const Tensor& s, const Tensor& t, const Tensor& grad, const Tensor& labels,
                  const Tensor& den, const Tensor& loss_rows, double beta,
                  int64_t ignore_index, double temperature) {
  const auto dtype = loss_rows.scalar_type();
  const double inv_t = 1.0 / temperature;
  auto a = aten::to(s, dtype) * inv_t;
  auto b = aten::to(t, dtype) * inv_t;
  auto lq = a - aten::logsumexp(a, {1}, true);  // log q (student)
  auto lp = b - aten::logsumexp(b, {1}, true);  // log p (teacher)
  auto q = aten::exp(lq), p = aten::exp(lp);
  Tensor loss, g;  // per row; d loss / d s (before 1 / (T den))
  if (beta == 0.0) {
    loss = aten::sum(p * (lp - lq), {1});
    g = q - p;
  } else {
    Tensor lm, d;  // log m; d = log q - log(the other distribution)
    if (beta == 1.0) {
      d = lq - lp;
    } else {
      // log m from the larger of log(beta p) and log((1 - beta) q).
      auto x = lp + std::log(beta), y = lq + std::log1p(-beta);
      auto hi = aten::maximum(x, y);
      lm = hi + aten::log(aten::exp(x - hi) + aten::exp(y - hi));
      d = lq - lm;
    }
    auto kl_q = aten::sum(q * d, {1}, true);
    g = q * (d - kl_q);
    if (beta == 1.0) {
      loss = aten::squeeze(kl_q, 1);
    } else {
      g = g * (1.0 - beta);
      loss = aten::squeeze(kl_q, 1) * (1.0 - beta) + aten::sum(p * (lp - lm), {1}) * beta;
    }
  }
  auto zero = aten::full({}, 0.0, dtype, s.device());
  auto keep = labels.defined() ? aten::ne(labels, aten::scalar_int(ignore_index))
                               : aten::full({s.size(0)}, 1.0, kBool, s.device());
  aten::copy_(loss_rows, aten::where(keep, loss / den, zero));
  if (grad.defined()) {
    auto scaled = g * inv_t / den;
    aten::copy_(grad, aten::where(aten::unsqueeze(keep, 1), scaled, zero));
  }
}

}  // namespace fk::ops
