// CPU reference of fk::qwen2vl_mrope in ATen operators (through the stable dispatcher): the
// composed cos / sin tables, then the rotate-half formula; fp32 math (fp64 for fp64
// inputs), one rounding.
#include <utility>

#include "ops/qwen2vl_mrope/qwen2vl_mrope.h"
#include "ops/rope/rope.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// (B or 1, 1, S, D): entry j of t (3, B or 1, S, D) from the stream of pair j mod D/2.
Tensor compose(const Tensor& t, const std::vector<int64_t>& section, bool interleaved) {
  const int64_t d = t.size(3), half = d / 2;
  std::vector<Tensor> parts;
  for (int64_t base : {int64_t{0}, half}) {
    int64_t i = 0;
    while (i < half) {  // runs of consecutive pairs on one stream
      const int64_t st = mrope_stream(i, section, interleaved);
      int64_t j = i + 1;
      while (j < half && mrope_stream(j, section, interleaved) == st) ++j;
      parts.push_back(aten::narrow(aten::select(t, 0, st), -1, base + i, j - i));
      i = j;
    }
  }
  return aten::unsqueeze(aten::cat(parts, -1), 1);
}

void rotate_into(const Tensor& out, const Tensor& x, const Tensor& c, const Tensor& s,
                 bool inverse) {
  const int64_t half = x.size(-1) / 2;
  auto xf = aten::to(x, checks::acc_type(x));
  auto x1 = aten::narrow(xf, -1, 0, half), x2 = aten::narrow(xf, -1, half, half);
  auto c1 = aten::narrow(c, -1, 0, half), c2 = aten::narrow(c, -1, half, half);
  auto s1 = aten::narrow(s, -1, 0, half), s2 = aten::narrow(s, -1, half, half);
  if (inverse) std::tie(s1, s2) = std::make_pair(-s2, -s1);
  aten::copy_(out, aten::cat({x1 * c1 - x2 * s1, x2 * c2 + x1 * s2}, -1));
}

std::tuple<Tensor, Tensor> apply(const char* op, const Tensor& q, const Tensor& k,
                                 const Tensor& cos, const Tensor& sin,
                                 const std::vector<int64_t>& section, bool interleaved,
                                 bool inverse) {
  check_qwen2vl_mrope(op, q, k, cos, sin, section);
  const auto acc = checks::acc_type(q);
  auto c = compose(aten::to(cos, acc), section, interleaved);
  auto s = compose(aten::to(sin, acc), section, interleaved);
  auto qo = rope_out_like(q), ko = rope_out_like(k);
  rotate_into(qo, q, c, s, inverse);
  rotate_into(ko, k, c, s, inverse);
  return {qo, ko};
}

std::tuple<Tensor, Tensor> qwen2vl_mrope_cpu(Tensor q, Tensor k, Tensor cos, Tensor sin,
                                             std::vector<int64_t> section, bool interleaved) {
  return apply("fk::qwen2vl_mrope", q, k, cos, sin, section, interleaved, false);
}

std::tuple<Tensor, Tensor> qwen2vl_mrope_backward_cpu(Tensor grad_q, Tensor grad_k, Tensor cos,
                                                      Tensor sin, std::vector<int64_t> section,
                                                      bool interleaved) {
  return apply("fk::_qwen2vl_mrope_backward", grad_q, grad_k, cos, sin, section, interleaved,
               true);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("qwen2vl_mrope", TORCH_BOX(&fk::ops::qwen2vl_mrope_cpu));
  m.impl("_qwen2vl_mrope_backward", TORCH_BOX(&fk::ops::qwen2vl_mrope_backward_cpu));
}
