// CPU reference of fk::qkv_split_norm_rope in ATen operators (through the stable dispatcher):
// the split as views, fk::rms_norm's reference (Llama casting) per head, then fk::rope and
// fk::_rope_backward themselves; fp32 math (fp64 for fp64 inputs).
#include <array>

#include "ops/qkv_split_norm_rope/qkv_split_norm_rope.h"
#include "ops/rms_norm/rms_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// qkv as (B, S, N).
Tensor tokens_bs(const QkvSplit& p, const Tensor& qkv) {
  return p.tokens_sb ? aten::transpose(qkv, 0, 1) : qkv;
}

// q (B, S, Hq, D), k and v (B, S, Hkv, D): views of x (B, S, N), or copies for grouped q.
std::array<Tensor, 3> split_heads(const QkvSplit& p, const Tensor& x) {
  if (p.grouped) {
    const int64_t r = p.hq / p.hkv;
    auto g = aten::reshape(x, {p.b, p.s, p.hkv, r + 2, p.d});
    return {aten::reshape(aten::narrow(g, 3, 0, r), {p.b, p.s, p.hq, p.d}),
            aten::select(g, 3, r), aten::select(g, 3, r + 1)};
  }
  auto h = aten::reshape(x, {p.b, p.s, p.hq + 2 * p.hkv, p.d});
  return {aten::narrow(h, 2, 0, p.hq), aten::narrow(h, 2, p.hq, p.hkv),
          aten::narrow(h, 2, p.hq + p.hkv, p.hkv)};
}

// (B, S, H, D) -> the output layout, contiguous.
Tensor to_layout(const QkvSplit& p, const Tensor& t) {
  return aten::contiguous(p.bhsd ? aten::transpose(t, 1, 2) : t);
}

// The output layout -> (B, H, S, D) (a view).
Tensor as_bhsd(const QkvSplit& p, const Tensor& t) {
  return p.bhsd ? t : aten::transpose(t, 1, 2);
}

// Per-head RMSNorm of x (B, S, H, D) with Hugging Face Llama / Qwen3 casting; (y, rstd).
std::tuple<Tensor, Tensor> head_norm(const Tensor& x, const std::optional<Tensor>& w,
                                     double eps) {
  if (!has(w)) return {x, Tensor()};
  return rms_norm_forward_reference(x, w, eps, 0.0, RmsCasting::Llama);
}

std::tuple<Tensor, Tensor, Tensor> qkv_split_norm_rope_cpu(
    Tensor qkv, std::optional<Tensor> q_norm_weight, std::optional<Tensor> k_norm_weight,
    Tensor cos, Tensor sin, int64_t num_heads, int64_t num_kv_heads, double eps,
    std::optional<int64_t> rotary_dim, std::string layout, std::string qkv_format,
    std::string input_layout) {
  const auto p = check_qkv_split_norm_rope("fk::qkv_split_norm_rope", qkv, q_norm_weight,
                                           k_norm_weight, cos, sin, num_heads, num_kv_heads,
                                           rotary_dim, layout, qkv_format, input_layout);
  auto [q, k, v] = split_heads(p, tokens_bs(p, qkv));
  auto qn = std::get<0>(head_norm(q, q_norm_weight, eps));
  auto kn = std::get<0>(head_norm(k, k_norm_weight, eps));
  auto r = aten::call_n<2>("fk::rope", "", aten::transpose(qn, 1, 2), aten::transpose(kn, 1, 2),
                           cos, sin, rotary_dim, false);
  return {to_layout(p, aten::transpose(r[0], 1, 2)), to_layout(p, aten::transpose(r[1], 1, 2)),
          to_layout(p, v)};
}

std::tuple<Tensor, Tensor, Tensor> qkv_split_norm_rope_backward_cpu(
    Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor qkv, std::optional<Tensor> q_norm_weight,
    std::optional<Tensor> k_norm_weight, Tensor cos, Tensor sin, int64_t num_heads,
    int64_t num_kv_heads, double eps, std::optional<int64_t> rotary_dim, std::string layout,
    std::string qkv_format, std::string input_layout, std::vector<bool> output_mask) {
  const auto p = check_qkv_split_norm_rope_backward(
      "fk::_qkv_split_norm_rope_backward", grad_q, grad_k, grad_v, qkv, q_norm_weight,
      k_norm_weight, cos, sin, num_heads, num_kv_heads, rotary_dim, layout, qkv_format,
      input_layout);
  const auto acc = checks::acc_type(qkv);
  auto [q, k, v] = split_heads(p, tokens_bs(p, qkv));
  // The gradients of the normalized q and k: the transposed rotation, kept in fp32.
  auto dn = aten::call_n<2>("fk::_rope_backward", "", aten::to(as_bhsd(p, grad_q), acc),
                            aten::to(as_bhsd(p, grad_k), acc), aten::to(cos, acc),
                            aten::to(sin, acc), rotary_dim, false);
  std::array<Tensor, 2> dx, dw;
  const std::array<std::optional<Tensor>, 2> weights{q_norm_weight, k_norm_weight};
  const std::array<Tensor, 2> xs{q, k};
  for (int i = 0; i < 2; ++i) {
    auto g = aten::transpose(dn[i], 1, 2);  // (B, S, H, D)
    if (!has(weights[i])) {
      dx[i] = aten::to(g, qkv.scalar_type());
      continue;
    }
    auto rstd = std::get<1>(head_norm(xs[i], weights[i], eps));
    std::tie(dx[i], dw[i]) = rms_norm_backward_reference(g, xs[i], weights[i], rstd, 0.0,
                                                         RmsCasting::Llama, output_mask[i]);
  }
  auto gv = aten::transpose(as_bhsd(p, grad_v), 1, 2);  // (B, S, Hkv, D)
  Tensor d;
  if (p.grouped) {
    const int64_t r = p.hq / p.hkv;
    d = aten::cat({aten::reshape(dx[0], {p.b, p.s, p.hkv, r, p.d}), aten::unsqueeze(dx[1], 3),
                   aten::unsqueeze(gv, 3)},
                  3);
  } else {
    d = aten::cat({dx[0], dx[1], gv}, 2);
  }
  d = aten::reshape(d, {p.b, p.s, (p.hq + 2 * p.hkv) * p.d});
  return {aten::contiguous(p.tokens_sb ? aten::transpose(d, 0, 1) : d), dw[0], dw[1]};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("qkv_split_norm_rope", TORCH_BOX(&fk::ops::qkv_split_norm_rope_cpu));
  m.impl("_qkv_split_norm_rope_backward", TORCH_BOX(&fk::ops::qkv_split_norm_rope_backward_cpu));
}
