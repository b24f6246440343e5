// CPU reference of fk::rope in ATen operators (through the stable dispatcher): fp32 math
// (fp64 for fp64 inputs), one rounding.
#include <utility>

#include "ops/rope/rope.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// The two members of each rotating pair along the last dim of t (of width r).
std::pair<Tensor, Tensor> pair_members(const Tensor& t, int64_t r, bool interleaved) {
  if (interleaved) return {aten::slice(t, -1, 0, r, 2), aten::slice(t, -1, 1, r, 2)};
  return {aten::narrow(t, -1, 0, r / 2), aten::narrow(t, -1, r / 2, r / 2)};
}

// out[..., :R] = the rotated x, out[..., R:] = x[..., R:]; inverse applies the transpose.
void rotate_into(const Tensor& out, const Tensor& x, const Tensor& cos4, const Tensor& sin4,
                 int64_t r, bool interleaved, bool inverse) {
  const auto acc = checks::acc_type(x);
  const int64_t d = x.size(-1);
  auto [x1, x2] = pair_members(aten::to(aten::narrow(x, -1, 0, r), acc), r, interleaved);
  auto cf = aten::to(cos4, acc), sf = aten::to(sin4, acc);
  Tensor c1 = cf, c2 = cf, s1 = sf, s2 = sf;
  if (cf.size(-1) == r) {
    std::tie(c1, c2) = pair_members(cf, r, interleaved);
    std::tie(s1, s2) = pair_members(sf, r, interleaved);
  }
  if (inverse) std::tie(s1, s2) = std::make_pair(-s2, -s1);
  auto o1 = x1 * c1 - x2 * s1;
  auto o2 = x2 * c2 + x1 * s2;
  auto rot = interleaved ? aten::flatten(aten::stack({o1, o2}, -1), -2)
                         : aten::cat({o1, o2}, -1);
  aten::copy_(aten::narrow(out, -1, 0, r), rot);
  if (r < d) aten::copy_(aten::narrow(out, -1, r, d - r), aten::narrow(x, -1, r, d - r));
}

std::tuple<Tensor, Tensor> rope_apply(const char* op, const Tensor& q, const Tensor& k,
                                      const Tensor& cos, const Tensor& sin,
                                      std::optional<int64_t> rotary_dim, bool interleaved,
                                      bool inverse) {
  check_rope(op, q, k, cos, sin, rotary_dim);
  const int64_t r = rope_rotary_dim(cos, rotary_dim);
  auto c = aten::unsqueeze(rope_cos_3d(cos), 1), s = aten::unsqueeze(rope_cos_3d(sin), 1);
  auto qo = rope_out_like(q), ko = rope_out_like(k);
  rotate_into(qo, q, c, s, r, interleaved, inverse);
  rotate_into(ko, k, c, s, r, interleaved, inverse);
  return {qo, ko};
}

std::tuple<Tensor, Tensor> rope_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin,
                                    std::optional<int64_t> rotary_dim, bool interleaved) {
  return rope_apply("fk::rope", q, k, cos, sin, rotary_dim, interleaved, false);
}

std::tuple<Tensor, Tensor> rope_backward_cpu(Tensor grad_q, Tensor grad_k, Tensor cos,
                                             Tensor sin, std::optional<int64_t> rotary_dim,
                                             bool interleaved) {
  return rope_apply("fk::_rope_backward", grad_q, grad_k, cos, sin, rotary_dim, interleaved,
                    true);
}

void rope_inplace_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin,
                      std::optional<int64_t> rotary_dim, bool interleaved) {
  check_rope_inplace(q, k, cos, sin, rotary_dim);
  auto [qo, ko] = rope_apply("fk::rope_", q, k, cos, sin, rotary_dim, interleaved, false);
  aten::copy_(q, qo);
  aten::copy_(k, ko);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("rope", TORCH_BOX(&fk::ops::rope_cpu));
  m.impl("_rope_backward", TORCH_BOX(&fk::ops::rope_backward_cpu));
  m.impl("rope_", TORCH_BOX(&fk::ops::rope_inplace_cpu));
}
