// CPU reference of the vocabulary-parallel cross entropy ops in ATen operators (through the
// stable dispatcher), float32 math (float64 for float64 logits): the formulas of
// triton_src/vocab_parallel_cross_entropy.py.
#include <limits>

#include "ops/vocab_parallel_cross_entropy/vocab_parallel_cross_entropy.h"

namespace fk::ops {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor constant(double v, ScalarType dtype, const Tensor& like) {
  return aten::full({}, v, dtype, like.device());
}

// The logits in the loss dtype, softcapped; t = tanh(x / softcap) when softcapped.
Tensor capped(const Tensor& logits, ScalarType dtype, const VpOptions& o, Tensor* t) {
  auto x = aten::to(logits, dtype);
  if (!o.softcap) return x;
  *t = aten::tanh(x / *o.softcap);
  return *t * *o.softcap;
}

// Non-ignored rows, rows whose target is in this shard, and the local column of the
// target there (0 elsewhere).
struct Local {
  Tensor keep, here, y;
};
Local local_targets(const Tensor& target, int64_t V, const VpOptions& o) {
  auto keep = aten::ne(target, aten::scalar_int(o.ignore_index));
  // target - vocab_start (through float64, exact for class ids below 2^53: the stable shim
  // subtracts integer tensors only with a floating-point alpha, which ATen refuses)
  auto local = aten::to(aten::to(target, kDouble) - static_cast<double>(o.vocab_start), kLong);
  auto here = aten::logical_and(aten::ge(local, aten::scalar_int(0)),
                                aten::lt(local, aten::scalar_int(V)));
  return {keep, here, aten::where(here, local, aten::scalar_int(0))};
}

Tensor at_target(const Tensor& x, const Tensor& y) {
  return aten::squeeze(aten::gather(x, 1, aten::unsqueeze(y, 1)), 1);
}

}  // namespace

void vp_ce_stats_cpu(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     const Tensor& stats, const VpOptions& o) {
  const auto dtype = stats.scalar_type();
  const int64_t n = logits.size(0), V = logits.size(1);
  Tensor t;
  auto x = capped(logits, dtype, o, &t);
  const auto [keep, here, y] = local_targets(target, V, o);
  const auto zero = constant(0.0, dtype, logits), one = constant(1.0, dtype, logits);
  auto m = aten::amax(x, {1});
  auto m_safe = aten::where(aten::eq(m, constant(-kInf, dtype, logits)), zero, m);
  auto d = aten::sum(aten::exp(x - aten::unsqueeze(m_safe, 1)), {1});
  auto x_y = aten::where(here, at_target(x, y), zero);
  auto w_y = aten::where(here, weight.defined() ? aten::index_select(weight, 0, y) : one, zero);
  Tensor sx = aten::zeros({n}, dtype, logits.device()), sw = sx;
  if (o.label_smoothing > 0) {
    sx = weight.defined() ? aten::sum(x * weight, {1}) : aten::sum(x, {1});
    sw = aten::full({n}, 1.0, dtype, logits.device()) *
         (weight.defined() ? aten::sum_all(weight) : constant(static_cast<double>(V), dtype,
                                                              logits));
  }
  // Ignored rows: (0, 1, 0, 0, 0, 0), as the kernel writes them without reading the row.
  aten::copy_(stats, aten::stack({aten::where(keep, m, zero), aten::where(keep, d, one),
                                  aten::where(keep, x_y, zero), aten::where(keep, w_y, zero),
                                  aten::where(keep, sx, zero), aten::where(keep, sw, zero)},
                                 0));
}

void vp_ce_loss_cpu(const Tensor& logits, const Tensor& grad, const Tensor& target,
                    const Tensor& weight, const Tensor& stats, const Tensor& den,
                    const Tensor& scale, const Tensor& loss_rows, const Tensor& z_rows,
                    const VpOptions& o) {
  const auto dtype = loss_rows.scalar_type();
  const int64_t V = logits.size(1);
  const double ls = o.label_smoothing, s = o.lse_square_scale;
  const double eps = ls / static_cast<double>(o.vocab_size);
  auto part = [&](int64_t k) { return aten::select(stats, 1, k); };  // (W, N)
  auto sum_ranks = [&](int64_t k) { return aten::sum(part(k), {0}); };
  // lse = log(sum_r d_r exp(m_r)) over the ranks' (m, d)
  auto lse = aten::logsumexp(part(0) + aten::log(part(1)), {0});
  const auto keep_here = local_targets(target, V, o);
  const auto& keep = keep_here.keep;
  const auto& here = keep_here.here;
  const auto& y = keep_here.y;
  auto valid = aten::logical_and(aten::ge(target, aten::scalar_int(0)),
                                 aten::lt(target, aten::scalar_int(o.vocab_size)));
  const auto nan = constant(kNan, dtype, logits), zero = constant(0.0, dtype, logits);
  auto x_y = aten::where(valid, sum_ranks(2), nan);
  auto w_y = aten::where(valid, sum_ranks(3), nan);
  auto sx = sum_ranks(4), sw = sum_ranks(5);
  auto inv_dw = aten::reciprocal(aten::select(den, 0, 0));
  auto inv_dn = aten::reciprocal(aten::select(den, 0, 1));
  auto ce = w_y * (lse - x_y);
  if (ls > 0) ce = (1 - ls) * ce + eps * (sw * lse - sx);
  auto z = s * lse * lse;
  aten::copy_(loss_rows, aten::where(keep, ce * inv_dw + z * inv_dn, inv_dw * 0.0));
  aten::copy_(z_rows, aten::where(keep, z * inv_dn, inv_dn * 0.0));
  if (!grad.defined()) return;

  Tensor t;
  auto x = capped(logits, dtype, o, &t);
  auto p = aten::exp(x - aten::unsqueeze(lse, 1));
  auto a = ((1 - ls) * w_y + eps * sw) * inv_dw + 2 * s * lse * inv_dn;
  auto g = p * aten::unsqueeze(a, 1);
  auto one_hot = aten::where(here, -(1 - ls) * w_y * inv_dw, zero);
  aten::scatter_add_(g, 1, aten::unsqueeze(y, 1), aten::unsqueeze(one_hot, 1));
  if (ls > 0) {
    g = g - eps * inv_dw *
                (weight.defined() ? weight : aten::full({V}, 1.0, dtype, logits.device()));
  }
  if (o.softcap) g = g * (1.0 - t * t);
  if (scale.defined()) g = g * (scale.dim() == 0 ? scale : aten::unsqueeze(scale, 1));
  aten::copy_(grad, aten::where(aten::unsqueeze(keep, 1), g, zero));
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_vocab_parallel_cross_entropy_stats", TORCH_BOX(&fk::ops::vp_ce_stats_impl));
  m.impl("_vocab_parallel_cross_entropy_loss", TORCH_BOX(&fk::ops::vp_ce_loss_impl));
  m.impl("_vocab_parallel_cross_entropy_loss_", TORCH_BOX(&fk::ops::vp_ce_loss_inplace_impl));
}
