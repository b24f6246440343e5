// CPU reference of fk::swiglu_fp8, fk::moe_swiglu_fp8 and their backwards in ATen operators
// (through the stable dispatcher): h in fp32 rounded to x's dtype, then fk::fp8_quantize's
// reference of 1 x 128 blocks.
#include <vector>

#include "ops/swiglu_fp8/swiglu_fp8.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

using checks::ceil_div;
using Out5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

// silu(gate) * up (* probs[:, None]) in fp32, rounded to x's dtype. x is made contiguous
// first: ATen's CPU kernels may round differently on strided operands (vectorized or not),
// and the result must not depend on x's layout.
Tensor swiglu_h(const Tensor& x, const Tensor* probs) {
  const int64_t n = x.size(1) / 2;
  auto xf = aten::contiguous(aten::to(x, kFloat));
  auto g = aten::narrow(xf, 1, 0, n), u = aten::narrow(xf, 1, n, n);
  auto h = g * aten::sigmoid(g) * u;
  if (probs) h = h * aten::unsqueeze(*probs, 1);
  return aten::contiguous(aten::to(h, x.scalar_type()));
}

// The token counts, after checking them (the CUDA kernels cannot without a host sync).
std::vector<int64_t> counts_of(const Tensor& tpe, int64_t m) {
  auto out = segment_counts(tpe);
  int64_t sum = 0;
  for (int64_t v : out) {
    FK_CHECK(v >= 0, kMoeSwigluFp8, ": tokens_per_expert must be >= 0, got ", v);
    sum += v;
  }
  FK_CHECK(sum == m, kMoeSwigluFp8, ": tokens_per_expert must sum to M = ", m, ", got ", sum);
  return out;
}

Out5 quantized(const Tensor& h, Fp8Layout want, bool pow2, bool return_h,
               const std::vector<int64_t>* counts) {
  auto hf = aten::to(h, kFloat);
  Tensor q, s, qt, st;
  if (want.rowwise) std::tie(q, s) = fp8_quantize_rows(hf, pow2);
  if (want.columnwise) {
    std::tie(qt, st) = counts ? fp8_quantize_segments(hf, *counts, pow2)
                              : fp8_quantize_rows(aten::contiguous(aten::t(hf)), pow2);
  }
  return {q, s, qt, st, return_h ? h : Tensor()};
}

Out5 swiglu_fp8_cpu(Tensor x, std::string layout, bool pow2_scales, bool return_h) {
  const auto want = check_swiglu_fp8(x, layout);
  return quantized(swiglu_h(x, nullptr), want, pow2_scales, return_h, nullptr);
}

Out5 moe_swiglu_fp8_cpu(Tensor x, Tensor probs, Tensor tokens_per_expert, std::string layout,
                        bool pow2_scales, bool return_h) {
  const auto want = check_moe_swiglu_fp8(x, probs, tokens_per_expert, layout);
  const auto counts = counts_of(tokens_per_expert, x.size(0));
  return quantized(swiglu_h(x, &probs), want, pow2_scales, return_h, &counts);
}

// (dx in x's dtype, dprobs fp32 when probs) of h = silu(g) * u (* p).
std::pair<Tensor, Tensor> swiglu_grads(const Tensor& grad_h, const Tensor& x,
                                       const Tensor* probs) {
  const int64_t n = x.size(1) / 2;
  auto xf = aten::contiguous(aten::to(x, kFloat));
  auto dh = aten::contiguous(aten::to(grad_h, kFloat));
  auto g = aten::narrow(xf, 1, 0, n), u = aten::narrow(xf, 1, n, n);
  auto sg = aten::sigmoid(g);
  auto silu = g * sg;
  auto d = probs ? dh * aten::unsqueeze(*probs, 1) : dh;
  auto dg = d * u * (sg + silu * (1.0 - sg));
  auto du = d * silu;
  auto dx = aten::contiguous(aten::to(aten::cat({dg, du}, 1), x.scalar_type()));
  Tensor dp;
  if (probs) dp = aten::contiguous(aten::sum(dh * silu * u, {1}));
  return {dx, dp};
}

Out5 swiglu_fp8_backward_cpu(Tensor grad_h, Tensor x, std::string grad_layout,
                             bool pow2_scales) {
  const auto want = check_swiglu_fp8_backward(grad_h, x, grad_layout);
  auto dx = swiglu_grads(grad_h, x, nullptr).first;
  if (!want.rowwise && !want.columnwise) return {dx, Tensor(), Tensor(), Tensor(), Tensor()};
  auto [q, s, qt, st, unused] = quantized(dx, want, pow2_scales, false, nullptr);
  return {Tensor(), q, s, qt, st};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> moe_swiglu_fp8_backward_cpu(
    Tensor grad_h, Tensor x, Tensor probs, std::string grad_layout, bool pow2_scales) {
  const bool quant = check_moe_swiglu_fp8_backward(grad_h, x, probs, grad_layout);
  auto [dx, dp] = swiglu_grads(grad_h, x, &probs);
  if (!quant) return {dx, dp, Tensor(), Tensor()};
  auto [q, s] = fp8_quantize_rows(aten::to(dx, kFloat), pow2_scales);
  return {Tensor(), dp, q, s};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("swiglu_fp8", TORCH_BOX(&fk::ops::swiglu_fp8_cpu));
  m.impl("swiglu_fp8_backward", TORCH_BOX(&fk::ops::swiglu_fp8_backward_cpu));
  m.impl("moe_swiglu_fp8", TORCH_BOX(&fk::ops::moe_swiglu_fp8_cpu));
  m.impl("moe_swiglu_fp8_backward", TORCH_BOX(&fk::ops::moe_swiglu_fp8_backward_cpu));
}
