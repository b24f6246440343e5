// CUDA kernel of fk::llama4_rope: AOT-compiled Triton (triton_src/llama4_rope.py), q and k
// in one launch.
//
// q and k are read in place through their strides; only a last dim with a stride other
// than 1 is copied first. freqs_cis is read as (real, imag) pairs: the real view of a
// complex tensor, no copy unless its last two dims are not contiguous.
#include <algorithm>
#include <array>

#include "ops/llama4_rope/llama4_rope.h"
#include "ops/rope/rope.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

constexpr uint32_t kFlagFreqsFp32 = 2;  // matches triton_src/llama4_rope.py FLAG_FREQS_FP32

// (batch, seq, head) strides; 0 for a dim of size 1 (its stride is never used, and then
// cannot spoil the alignment of the others).
std::array<int64_t, 3> bsh_strides(const Tensor& t) {
  std::array<int64_t, 3> s{};
  for (int i = 0; i < 3; ++i) s[i] = t.size(i) == 1 ? 0 : t.stride(i);
  return s;
}

Tensor last_dim_contiguous(const Tensor& t) {
  return t.stride(-1) == 1 ? t : aten::contiguous(t);
}

std::tuple<Tensor, Tensor> apply(const char* op, const Tensor& q_in, const Tensor& k_in,
                                 const Tensor& freqs, bool conj) {
  check_llama4_rope(op, q_in, k_in, freqs);
  auto qo = rope_out_like(q_in), ko = rope_out_like(k_in);
  const int64_t b = q_in.size(0), s = q_in.size(1), hq = q_in.size(2), hkv = k_in.size(2),
                d = q_in.size(3);
  if (b * s * (hq + hkv) == 0) return {qo, ko};
  const auto q = last_dim_contiguous(q_in), k = last_dim_contiguous(k_in);
  auto f = llama4_freqs_real(freqs);
  if (f.stride(3) != 1 || (f.size(2) > 1 && f.stride(2) != 2)) f = aten::contiguous(f);
  const int64_t half = d / 2;
  const int64_t f_sb = f.size(0) == 1 ? 0 : f.stride(0);
  const int64_t f_ss = f.size(1) == 1 ? 0 : f.stride(1);

  const auto qs = bsh_strides(q), ks = bsh_strides(k), qos = bsh_strides(qo),
             kos = bsh_strides(ko);
  bool aligned = runtime::aligned16({&q, &k, &qo, &ko, &f}) && half % 16 == 0 &&
                 f_sb % 16 == 0 && f_ss % 16 == 0;
  for (const auto* st : {&qs, &ks, &qos, &kos}) {
    for (int64_t v : *st) aligned = aligned && v % 16 == 0;
  }
  uint32_t flags = aligned ? runtime::kFlagAligned : 0;
  if (f.scalar_type() != q.scalar_type()) flags |= kFlagFreqsFp32;

  static const auto& fam = runtime::family("llama4_rope");
  const auto& kern = fam.pick(op, q, std::min(half, fam.max_block(q)), flags);
  const int64_t bs = kern.constexpr_value("BS"), bh = kern.constexpr_value("BH"),
                steps = kern.constexpr_value("STEPS");
  const int64_t groups =
      checks::ceil_div(checks::ceil_div(hq, bh) + checks::ceil_div(hkv, bh), steps);
  // Walk memory in order: heads fastest for (B, S, H, D) buffers, seq fastest for the
  // (B, S, H, D) views of (B, H, S, D) buffers.
  const bool heads_fastest = hq > 1 && s > 1 ? q.stride(2) < q.stride(1) : true;

  KernelArgs args;
  args.ptr(q).ptr(k).ptr(qo).ptr(ko).ptr(f);
  for (const auto* st : {&qs, &ks, &qos, &kos}) {
    for (int64_t v : *st) args.i64(v);
  }
  args.i64(f_sb).i64(f_ss).i32(s).i32(hq).i32(hkv).i32(half).i32(conj ? 1 : 0)
      .i32(heads_fastest ? 1 : 0);
  runtime::launch(op, kern, q.device(), {b * checks::ceil_div(s, bs) * groups, 1, 1}, args);
  return {qo, ko};
}

std::tuple<Tensor, Tensor> llama4_rope_cuda(Tensor q, Tensor k, Tensor freqs) {
  return apply("fk::llama4_rope", q, k, freqs, false);
}

std::tuple<Tensor, Tensor> llama4_rope_backward_cuda(Tensor grad_q, Tensor grad_k,
                                                     Tensor freqs) {
  return apply("fk::_llama4_rope_backward", grad_q, grad_k, freqs, true);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("llama4_rope", TORCH_BOX(&fk::ops::llama4_rope_cuda));
  m.impl("_llama4_rope_backward", TORCH_BOX(&fk::ops::llama4_rope_backward_cuda));
}
