// CPU reference of fk::rope in plain ATen: fp32 math (fp64 for fp64 inputs), one rounding.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/rope/rope.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// The two members of each rotating pair along the last dim of t (of width r).
std::pair<at::Tensor, at::Tensor> pair_members(const at::Tensor& t, int64_t r, bool interleaved) {
  if (interleaved) return {t.slice(-1, 0, r, 2), t.slice(-1, 1, r, 2)};
  return {t.narrow(-1, 0, r / 2), t.narrow(-1, r / 2, r / 2)};
}

// out[..., :R] = the rotated x, out[..., R:] = x[..., R:]; inverse applies the transpose.
void rotate_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos4,
                 const at::Tensor& sin4, int64_t r, bool interleaved, bool inverse) {
  const auto acc = checks::acc_type(x);
  const int64_t d = x.size(-1);
  auto [x1, x2] = pair_members(x.narrow(-1, 0, r).to(acc), r, interleaved);
  auto cf = cos4.to(acc), sf = sin4.to(acc);
  at::Tensor c1 = cf, c2 = cf, s1 = sf, s2 = sf;
  if (cf.size(-1) == r) {
    std::tie(c1, c2) = pair_members(cf, r, interleaved);
    std::tie(s1, s2) = pair_members(sf, r, interleaved);
  }
  if (inverse) std::tie(s1, s2) = std::make_pair(-s2, -s1);
  auto o1 = x1 * c1 - x2 * s1;
  auto o2 = x2 * c2 + x1 * s2;
  auto rot = interleaved ? at::stack({o1, o2}, -1).flatten(-2) : at::cat({o1, o2}, -1);
  out.narrow(-1, 0, r).copy_(rot);
  if (r < d) out.narrow(-1, r, d - r).copy_(x.narrow(-1, r, d - r));
}

std::tuple<at::Tensor, at::Tensor> rope_apply(const char* op, const at::Tensor& q,
                                              const at::Tensor& k, const at::Tensor& cos,
                                              const at::Tensor& sin,
                                              std::optional<int64_t> rotary_dim,
                                              bool interleaved, bool inverse) {
  check_rope(op, q, k, cos, sin, rotary_dim);
  const int64_t r = rope_rotary_dim(cos, rotary_dim);
  auto c = rope_cos_3d(cos).unsqueeze(1), s = rope_cos_3d(sin).unsqueeze(1);
  auto qo = rope_out_like(q), ko = rope_out_like(k);
  rotate_into(qo, q, c, s, r, interleaved, inverse);
  rotate_into(ko, k, c, s, r, interleaved, inverse);
  return {qo, ko};
}

std::tuple<at::Tensor, at::Tensor> rope_cpu(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            std::optional<int64_t> rotary_dim, bool interleaved) {
  return rope_apply("fk::rope", q, k, cos, sin, rotary_dim, interleaved, false);
}

std::tuple<at::Tensor, at::Tensor> rope_backward_cpu(const at::Tensor& grad_q,
                                                     const at::Tensor& grad_k,
                                                     const at::Tensor& cos, const at::Tensor& sin,
                                                     std::optional<int64_t> rotary_dim,
                                                     bool interleaved) {
  return rope_apply("fk::_rope_backward", grad_q, grad_k, cos, sin, rotary_dim, interleaved, true);
}

void rope_inplace_cpu(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                      std::optional<int64_t> rotary_dim, bool interleaved) {
  check_rope_inplace(q, k, cos, sin, rotary_dim);
  auto [qo, ko] = rope_apply("fk::rope_", q, k, cos, sin, rotary_dim, interleaved, false);
  q.copy_(qo);
  k.copy_(ko);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("rope", fk::ops::rope_cpu);
  m.impl("_rope_backward", fk::ops::rope_backward_cpu);
  m.impl("rope_", fk::ops::rope_inplace_cpu);
}
