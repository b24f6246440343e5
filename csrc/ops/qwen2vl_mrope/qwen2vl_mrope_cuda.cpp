// CUDA kernel of fk::qwen2vl_mrope: AOT-compiled Triton (triton_src/qwen2vl_mrope.py), q and
// k in one launch.
//
// q and k are read in place through their strides; only a last dim with a stride other
// than 1 is copied first. cos / sin of q's dtype or float32 are read directly, each pair
// from its own position stream.
#include <algorithm>
#include <array>

#include "ops/qwen2vl_mrope/qwen2vl_mrope.h"
#include "ops/rope/rope.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// Match triton_src/qwen2vl_mrope.py.
constexpr uint32_t kFlagCosFp32 = 2, kFlagSec8 = 4;
constexpr int64_t kModeInterleaved = 1, kModeInverse = 2, kModeHeadsFastest = 4;

// (batch, head, seq) strides; 0 for a dim of size 1 (its stride is never used, and then
// cannot spoil the alignment of the others).
std::array<int64_t, 3> bhs_strides(const Tensor& t) {
  std::array<int64_t, 3> s{};
  for (int i = 0; i < 3; ++i) s[i] = t.size(i) == 1 ? 0 : t.stride(i);
  return s;
}

Tensor last_dim_contiguous(const Tensor& t) {
  return t.stride(-1) == 1 ? t : aten::contiguous(t);
}

Shape strides_vec(const Tensor& t) {
  auto s = t.strides();
  return Shape(s.begin(), s.end());
}

std::tuple<Tensor, Tensor> apply(const char* op, const Tensor& q_in, const Tensor& k_in,
                                 const Tensor& cos, const Tensor& sin,
                                 const std::vector<int64_t>& section, bool interleaved,
                                 bool inverse) {
  check_qwen2vl_mrope(op, q_in, k_in, cos, sin, section);
  auto qo = rope_out_like(q_in), ko = rope_out_like(k_in);
  const int64_t b = q_in.size(0), hq = q_in.size(1), hkv = k_in.size(1), s = q_in.size(2),
                d = q_in.size(3);
  if (b * s * (hq + hkv) == 0) return {qo, ko};
  const auto q = last_dim_contiguous(q_in), k = last_dim_contiguous(k_in);
  auto c = last_dim_contiguous(cos), sn = last_dim_contiguous(sin);
  if (strides_vec(c) != strides_vec(sn)) {  // the kernel takes one set of cos / sin strides
    c = aten::contiguous(c);
    sn = aten::contiguous(sn);
  }
  const int64_t half = d / 2;
  const int64_t cos_st = c.stride(0);
  const int64_t cos_sb = c.size(1) == 1 ? 0 : c.stride(1);
  const int64_t cos_ss = c.size(2) == 1 ? 0 : c.stride(2);

  const auto qs = bhs_strides(q), ks = bhs_strides(k), qos = bhs_strides(qo),
             kos = bhs_strides(ko);
  bool aligned = runtime::aligned16({&q, &k, &qo, &ko, &c, &sn}) && half % 16 == 0 &&
                 cos_st % 16 == 0 && cos_sb % 16 == 0 && cos_ss % 16 == 0;
  for (const auto* st : {&qs, &ks, &qos, &kos}) {
    for (int64_t v : *st) aligned = aligned && v % 16 == 0;
  }
  uint32_t flags = aligned ? runtime::kFlagAligned : 0;
  if (c.scalar_type() != q.scalar_type()) flags |= kFlagCosFp32;
  // Sectioned streams whose bounds fall on multiples of 8 pairs: each aligned group of 8
  // pairs reads one stream, so cos / sin load as 16-byte vectors (the aligned variant
  // already has half and the cos strides multiples of 16).
  if (aligned && !interleaved && section[0] % 8 == 0 && section[1] % 8 == 0) {
    flags |= kFlagSec8;
  }

  static const auto& fam = runtime::family("qwen2vl_mrope");
  const auto& kern = fam.pick(op, q, std::min(half, fam.max_block(q)), flags);
  const int64_t bs = kern.constexpr_value("BS"), bh = kern.constexpr_value("BH"),
                steps = kern.constexpr_value("STEPS");
  const int64_t groups =
      checks::ceil_div(checks::ceil_div(hq, bh) + checks::ceil_div(hkv, bh), steps);
  // Head groups fastest in either layout: the programs of one seq block run together and
  // share its cos / sin rows in L2 (benchmarks/tune_qwen2vl_mrope.py: as fast or up to 1 %
  // faster than walking contiguous (B, H, S, D) memory in order).
  const int64_t mode = (interleaved ? kModeInterleaved : 0) | (inverse ? kModeInverse : 0) |
                       kModeHeadsFastest;

  KernelArgs args;
  args.ptr(q).ptr(k).ptr(qo).ptr(ko).ptr(c).ptr(sn);
  for (const auto* st : {&qs, &ks, &qos, &kos}) {
    for (int64_t v : *st) args.i64(v);
  }
  args.i64(cos_st).i64(cos_sb).i64(cos_ss).i32(s).i32(hq).i32(hkv).i32(half)
      .i32(section[0]).i32(section[1]).i32(section[2]).i32(mode);
  runtime::launch(op, kern, q.device(), {b * checks::ceil_div(s, bs) * groups, 1, 1}, args);
  return {qo, ko};
}

std::tuple<Tensor, Tensor> qwen2vl_mrope_cuda(Tensor q, Tensor k, Tensor cos, Tensor sin,
                                              std::vector<int64_t> section, bool interleaved) {
  return apply("fk::qwen2vl_mrope", q, k, cos, sin, section, interleaved, false);
}

std::tuple<Tensor, Tensor> qwen2vl_mrope_backward_cuda(Tensor grad_q, Tensor grad_k,
                                                       Tensor cos, Tensor sin,
                                                       std::vector<int64_t> section,
                                                       bool interleaved) {
  return apply("fk::_qwen2vl_mrope_backward", grad_q, grad_k, cos, sin, section, interleaved,
               true);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("qwen2vl_mrope", TORCH_BOX(&fk::ops::qwen2vl_mrope_cuda));
  m.impl("_qwen2vl_mrope_backward", TORCH_BOX(&fk::ops::qwen2vl_mrope_backward_cuda));
}
