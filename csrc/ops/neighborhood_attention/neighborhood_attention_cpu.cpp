// CPU reference of fk::neighborhood_attention in ATen operators (through the stable
// dispatcher), fp32 math (fp64 for fp64 inputs), one rounding of each result to the input
// dtype. Memory O(seq_len * kernel_size): the scores live as (B, H, L, kernel_size), one
// column per window offset o = (w - radius) * dilation, filled from shifted slices of q and
// k (queries [lo, lo + n) meet keys [lo + o, lo + o + n), n = L - |o|); positions the
// window cuts off stay -inf. No (L, L) tensor is ever formed.
#include <cstdlib>
#include <limits>

#include "ops/neighborhood_attention/neighborhood_attention.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

struct Offset {
  int64_t q_lo, k_lo, n;  // queries [q_lo, q_lo + n) meet keys [k_lo, k_lo + n)
};

Offset offset(const NaParams& p, int64_t w) {
  const int64_t o = (w - p.radius) * p.dilation;
  const int64_t q_lo = o < 0 ? -o : 0;
  return {q_lo, q_lo + o, p.l - std::llabs(o)};
}

int64_t window(const NaParams& p) { return 2 * p.radius + 1; }

// The window's slice along the sequence dim.
Tensor rows(const Tensor& t, int64_t lo, int64_t n) { return aten::narrow(t, 2, lo, n); }

// (B, H, L, window) scaled scores, -inf where the window leaves the sequence.
Tensor scores(const Tensor& qf, const Tensor& kf, const NaParams& p) {
  auto s = aten::full({p.b, p.h, p.l, window(p)}, -std::numeric_limits<double>::infinity(),
                      qf.scalar_type(), qf.device());
  for (int64_t w = 0; w < window(p); ++w) {
    const auto o = offset(p, w);
    if (o.n <= 0) continue;
    auto sw = aten::sum(rows(qf, o.q_lo, o.n) * rows(kf, o.k_lo, o.n), {-1}) * p.scale;
    aten::copy_(rows(aten::select(s, 3, w), o.q_lo, o.n), sw);
  }
  return s;
}

std::tuple<Tensor, Tensor> neighborhood_attention_forward_cpu(Tensor q, Tensor k, Tensor v,
                                                              int64_t kernel_size,
                                                              int64_t dilation,
                                                              std::optional<double> scale) {
  const auto p = check_neighborhood_attention(q, k, v, kernel_size, dilation, scale);
  const auto acc = checks::acc_type(q);
  if (q.numel() == 0) {
    return {aten::empty(q.sizes(), q.scalar_type(), q.device()),
            aten::zeros({p.b, p.h, p.l}, acc, q.device())};
  }
  auto qf = aten::to(q, acc), kf = aten::to(k, acc), vf = aten::to(v, acc);
  auto s = scores(qf, kf, p);
  auto lse = aten::logsumexp(s, {-1});
  auto prob = aten::exp(s - aten::unsqueeze(lse, -1));
  auto out = aten::zeros({p.b, p.h, p.l, p.d}, acc, q.device());
  for (int64_t w = 0; w < window(p); ++w) {
    const auto o = offset(p, w);
    if (o.n <= 0) continue;
    auto pw = aten::unsqueeze(rows(aten::select(prob, 3, w), o.q_lo, o.n), -1);
    aten::add_(rows(out, o.q_lo, o.n), pw * rows(vf, o.k_lo, o.n));
  }
  return {aten::contiguous(aten::to(out, q.scalar_type())), aten::contiguous(lse)};
}

// P = exp(S - lse), dP = dO v^T, delta = rowsum(P * dP), dS = P * (dP - delta);
// dQ = scale * dS k, dK = scale * dS^T q, dV = P^T dO, each over the window offsets.
std::tuple<Tensor, Tensor, Tensor> neighborhood_attention_backward_cpu(
    Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, int64_t kernel_size,
    int64_t dilation, std::optional<double> scale) {
  const auto p = check_neighborhood_attention_backward(grad_out, q, k, v, out, lse,
                                                       kernel_size, dilation, scale);
  const auto dtype = q.scalar_type();
  if (q.numel() == 0) {
    return {aten::zeros(q.sizes(), dtype, q.device()), aten::zeros(q.sizes(), dtype, q.device()),
            aten::zeros(q.sizes(), dtype, q.device())};
  }
  const auto acc = checks::acc_type(q);
  auto qf = aten::to(q, acc), kf = aten::to(k, acc), vf = aten::to(v, acc);
  auto dof = aten::to(grad_out, acc);
  auto prob = aten::exp(scores(qf, kf, p) - aten::unsqueeze(aten::to(lse, acc), -1));
  auto dprob = aten::zeros({p.b, p.h, p.l, window(p)}, acc, q.device());
  for (int64_t w = 0; w < window(p); ++w) {
    const auto o = offset(p, w);
    if (o.n <= 0) continue;
    aten::copy_(rows(aten::select(dprob, 3, w), o.q_lo, o.n),
                aten::sum(rows(dof, o.q_lo, o.n) * rows(vf, o.k_lo, o.n), {-1}));
  }
  auto delta = aten::sum(prob * dprob, {-1}, /*keepdim=*/true);
  auto ds = prob * (dprob - delta) * p.scale;
  auto dq = aten::zeros({p.b, p.h, p.l, p.d}, acc, q.device());
  auto dk = aten::zeros_like(dq), dv = aten::zeros_like(dq);
  for (int64_t w = 0; w < window(p); ++w) {
    const auto o = offset(p, w);
    if (o.n <= 0) continue;
    auto dsw = aten::unsqueeze(rows(aten::select(ds, 3, w), o.q_lo, o.n), -1);
    auto pw = aten::unsqueeze(rows(aten::select(prob, 3, w), o.q_lo, o.n), -1);
    aten::add_(rows(dq, o.q_lo, o.n), dsw * rows(kf, o.k_lo, o.n));
    aten::add_(rows(dk, o.k_lo, o.n), dsw * rows(qf, o.q_lo, o.n));
    aten::add_(rows(dv, o.k_lo, o.n), pw * rows(dof, o.q_lo, o.n));
  }
  return {aten::contiguous(aten::to(dq, dtype)), aten::contiguous(aten::to(dk, dtype)),
          aten::contiguous(aten::to(dv, dtype))};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_neighborhood_attention_forward",
         TORCH_BOX(&fk::ops::neighborhood_attention_forward_cpu));
  m.impl("_neighborhood_attention_backward",
         TORCH_BOX(&fk::ops::neighborhood_attention_backward_cpu));
}
