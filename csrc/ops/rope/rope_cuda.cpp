// CUDA kernels of fk::rope: AOT-compiled Triton (triton_src/rope.py), q and k in one launch.
//
// Inputs are read in place through their strides (the transposed (B, S, H, D) views models
// produce, slices of fused projections, expanded tensors); only a last dim with a stride
// other than 1 is copied first. cos / sin of q's dtype or float32 are read directly.
#include <algorithm>
#include <array>

#include "ops/rope/rope.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

constexpr uint32_t kFlagCosFp32 = 2;  // matches triton_src/rope.py FLAG_COS_FP32

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

// Launches the rotation of (q, k) into (qo, ko); qo / ko may be q / k (in place, then
// `rotate_only` skips the pass-through dims).
void launch_rope(const char* op, const Tensor& q, const Tensor& k, const Tensor& qo,
                 const Tensor& ko, const Tensor& cos, const Tensor& sin,
                 std::optional<int64_t> rotary_dim, bool interleaved, bool inverse,
                 bool rotate_only) {
  const int64_t b = q.size(0), hq = q.size(1), hkv = k.size(1), s = q.size(2), d = q.size(3);
  if (b * s * (hq + hkv) == 0) return;
  const int64_t r = rope_rotary_dim(cos, rotary_dim), half = r / 2;
  auto [c, sn] = rope_tables_3d(cos, sin);  // the kernel takes one set of cos / sin strides
  const int64_t cos_sb = c.size(0) == 1 ? 0 : c.stride(0);
  const int64_t cos_ss = c.size(1) == 1 ? 0 : c.stride(1);
  const int64_t width = c.size(2);
  // Distance from a pair's first cos entry to its second (see triton_src/rope.py).
  const int64_t c2_off = width * 2 == r ? 0 : (interleaved ? 1 : half);

  const auto qs = bhs_strides(q), ks = bhs_strides(k), qos = bhs_strides(qo),
             kos = bhs_strides(ko);
  bool aligned = runtime::aligned16({&q, &k, &qo, &ko, &c, &sn}) && half % 16 == 0 &&
                 d % 16 == 0 && cos_sb % 16 == 0 && cos_ss % 16 == 0;
  for (const auto* st : {&qs, &ks, &qos, &kos}) {
    for (int64_t v : *st) aligned = aligned && v % 16 == 0;
  }
  uint32_t flags = aligned ? runtime::kFlagAligned : 0;
  if (c.scalar_type() != q.scalar_type()) flags |= kFlagCosFp32;

  static const auto& rotate_half = runtime::family("rope");
  static const auto& rotate_pairs = runtime::family("rope_interleaved");
  const auto& fam = interleaved ? rotate_pairs : rotate_half;
  const auto& kern = fam.pick(op, q, std::min(half, fam.max_block(q)), flags);
  const int64_t bs = kern.constexpr_value("BS"), bh = kern.constexpr_value("BH"),
                steps = kern.constexpr_value("STEPS");
  const int64_t groups =
      checks::ceil_div(checks::ceil_div(hq, bh) + checks::ceil_div(hkv, bh), steps);
  // Walk memory in order: heads fastest for the (B, S, H, D) buffers models transpose,
  // seq fastest for contiguous (B, H, S, D).
  const bool heads_fastest = hq > 1 && s > 1 ? q.stride(1) < q.stride(2) : true;

  KernelArgs args;
  args.ptr(q).ptr(k).ptr(qo).ptr(ko).ptr(c).ptr(sn);
  for (const auto* st : {&qs, &ks, &qos, &kos}) {
    for (int64_t v : *st) args.i64(v);
  }
  args.i64(cos_sb).i64(cos_ss).i32(s).i32(hq).i32(hkv).i32(half).i32(rotate_only ? r : d)
      .i32(c2_off).i32(inverse ? 1 : 0).i32(heads_fastest ? 1 : 0);
  runtime::launch(op, kern, q.device(), {b * checks::ceil_div(s, bs) * groups, 1, 1}, args);
}

std::tuple<Tensor, Tensor> rope_apply(const char* op, const Tensor& q, const Tensor& k,
                                      const Tensor& cos, const Tensor& sin,
                                      std::optional<int64_t> rotary_dim, bool interleaved,
                                      bool inverse) {
  check_rope(op, q, k, cos, sin, rotary_dim);
  auto qo = rope_out_like(q), ko = rope_out_like(k);
  launch_rope(op, last_dim_contiguous(q), last_dim_contiguous(k), qo, ko, cos, sin, rotary_dim,
              interleaved, inverse, false);
  return {qo, ko};
}

std::tuple<Tensor, Tensor> rope_cuda(Tensor q, Tensor k, Tensor cos, Tensor sin,
                                     std::optional<int64_t> rotary_dim, bool interleaved) {
  return rope_apply("fk::rope", q, k, cos, sin, rotary_dim, interleaved, false);
}

std::tuple<Tensor, Tensor> rope_backward_cuda(Tensor grad_q, Tensor grad_k, Tensor cos,
                                              Tensor sin, std::optional<int64_t> rotary_dim,
                                              bool interleaved) {
  return rope_apply("fk::_rope_backward", grad_q, grad_k, cos, sin, rotary_dim, interleaved,
                    true);
}

// Each element is read and written by the same program, so the outputs may be the inputs.
void rope_inplace_cuda(Tensor q, Tensor k, Tensor cos, Tensor sin,
                       std::optional<int64_t> rotary_dim, bool interleaved) {
  check_rope_inplace(q, k, cos, sin, rotary_dim);
  launch_rope("fk::rope_", q, k, q, k, cos, sin, rotary_dim, interleaved, false, true);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("rope", TORCH_BOX(&fk::ops::rope_cuda));
  m.impl("_rope_backward", TORCH_BOX(&fk::ops::rope_backward_cuda));
  m.impl("rope_", TORCH_BOX(&fk::ops::rope_inplace_cuda));
}
