// CPU reference of fk::llama4_rope in ATen operators (through the stable dispatcher): fp32
// math (fp64 for fp64 inputs), one rounding.
#include "ops/llama4_rope/llama4_rope.h"
#include "ops/rope/rope.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// out = the pairs of x times (c + i s), c and s of shape (B or 1, S, 1, D/2).
void rotate_into(const Tensor& out, const Tensor& x, const Tensor& c, const Tensor& s) {
  const auto acc = checks::acc_type(x);
  const int64_t d = x.size(-1);
  auto xf = aten::to(x, acc);
  auto a = aten::slice(xf, -1, 0, d, 2), b = aten::slice(xf, -1, 1, d, 2);
  auto re = a * c - b * s;
  auto im = b * c + a * s;
  aten::copy_(out, aten::flatten(aten::stack({re, im}, -1), -2));
}

std::tuple<Tensor, Tensor> apply(const char* op, const Tensor& q, const Tensor& k,
                                 const Tensor& freqs, bool conj) {
  check_llama4_rope(op, q, k, freqs);
  const auto acc = checks::acc_type(q);
  auto f = aten::to(llama4_freqs_real(freqs), acc);
  auto c = aten::unsqueeze(aten::select(f, -1, 0), 2);
  auto s = aten::unsqueeze(aten::select(f, -1, 1), 2);
  if (conj) s = -s;
  auto qo = rope_out_like(q), ko = rope_out_like(k);
  rotate_into(qo, q, c, s);
  rotate_into(ko, k, c, s);
  return {qo, ko};
}

std::tuple<Tensor, Tensor> llama4_rope_cpu(Tensor q, Tensor k, Tensor freqs) {
  return apply("fk::llama4_rope", q, k, freqs, false);
}

std::tuple<Tensor, Tensor> llama4_rope_backward_cpu(Tensor grad_q, Tensor grad_k,
                                                    Tensor freqs) {
  return apply("fk::_llama4_rope_backward", grad_q, grad_k, freqs, true);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("llama4_rope", TORCH_BOX(&fk::ops::llama4_rope_cpu));
  m.impl("_llama4_rope_backward", TORCH_BOX(&fk::ops::llama4_rope_backward_cpu));
}
