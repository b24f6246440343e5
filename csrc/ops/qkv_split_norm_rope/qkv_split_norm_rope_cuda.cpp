// CUDA kernels of fk::qkv_split_norm_rope: AOT-compiled Triton
// (triton_src/qkv_split_norm_rope.py). Forward: one program per tile of tokens x heads.
// Backward: a persistent grid over blocks of tokens (each through all their heads) writing
// fp32 partial weight gradients that rms_norm's reduction sums.
//
// qkv is read through its two leading strides (a last dim with a stride other than 1 is
// copied first; the backward reads a contiguous qkv). cos / sin of qkv's dtype or float32 are
// read directly.
#include <algorithm>

#include "ops/qkv_split_norm_rope/qkv_split_norm_rope.h"
#include "ops/rms_norm/rms_norm_cuda.h"
#include "ops/rope/rope.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// Matches triton_src/qkv_split_norm_rope.py.
constexpr uint32_t kFlagCosFp32 = 2;
constexpr int kGrouped = 1, kTokensSb = 2, kOutBhsd = 4, kHasQw = 8, kHasKw = 16;
constexpr int64_t kMaxHalf = 128;  // the largest half block built (rotary_dim <= 256)

// What both kernels take after their own pointers: the qkv strides, cos / sin, the sizes.
struct Launch {
  const runtime::KernelSpec* kern;
  Tensor cos, sin;
  int64_t in_sb, in_ss, cos_sb, cos_ss, half, c2_off, blocks, tiles;
  int mode;
  uint32_t flags;
};

Launch prepare(const char* op, const runtime::KernelFamily& fam, const QkvSplit& p, const Tensor& x,
               const std::optional<Tensor>& qw, const std::optional<Tensor>& kw,
               const Tensor& cos, const Tensor& sin, std::initializer_list<const Tensor*> more) {
  Launch l{};
  l.half = p.rot / 2;
  FK_CHECK(l.half <= kMaxHalf, op, ": rotary_dim (", p.rot, ") must be at most ",
           2 * kMaxHalf, " on CUDA");
  std::tie(l.cos, l.sin) = rope_tables_3d(cos, sin);
  l.cos_sb = l.cos.size(0) == 1 ? 0 : l.cos.stride(0);
  l.cos_ss = l.cos.size(1) == 1 ? 0 : l.cos.stride(1);
  l.c2_off = l.cos.size(2) * 2 == p.rot ? 0 : l.half;
  l.in_sb = p.b == 1 ? 0 : x.stride(p.tokens_sb ? 1 : 0);
  l.in_ss = p.s == 1 ? 0 : x.stride(p.tokens_sb ? 0 : 1);
  l.mode = (p.grouped ? kGrouped : 0) | (p.tokens_sb ? kTokensSb : 0) | (p.bhsd ? kOutBhsd : 0) |
           (has(qw) ? kHasQw : 0) | (has(kw) ? kHasKw : 0);
  bool aligned = runtime::aligned16(more) && runtime::aligned16({&x, &l.cos, &l.sin}) &&
                 (!has(qw) || runtime::aligned16({&*qw})) &&
                 (!has(kw) || runtime::aligned16({&*kw}));
  for (int64_t v : {l.in_sb, l.in_ss, l.cos_sb, l.cos_ss, p.d, l.half}) {
    aligned = aligned && v % 16 == 0;
  }
  l.flags = (aligned ? runtime::kFlagAligned | (p.s % 16 == 0 ? runtime::kFlagRows16 : 0) : 0) |
            (l.cos.scalar_type() != x.scalar_type() ? kFlagCosFp32 : 0);
  l.kern = &fam.pick(op, x, l.half, l.flags);
  // The forward's tiles of BT tokens x BH heads; the backward takes every head of a block
  // of BT tokens.
  const int64_t bt = l.kern->constexpr_value("BT"), bh = l.kern->constexpr_value("BH");
  l.blocks = checks::ceil_div(p.b * p.s, bt);
  l.tiles = l.blocks * (checks::ceil_div(p.hq, bh) + 2 * checks::ceil_div(p.hkv, bh));
  return l;
}

std::tuple<Tensor, Tensor, Tensor> qkv_split_norm_rope_cuda(
    Tensor qkv, std::optional<Tensor> q_norm_weight, std::optional<Tensor> k_norm_weight,
    Tensor cos, Tensor sin, int64_t num_heads, int64_t num_kv_heads, double eps,
    std::optional<int64_t> rotary_dim, std::string layout, std::string qkv_format,
    std::string input_layout) {
  constexpr const char* op = "fk::qkv_split_norm_rope";
  const auto p = check_qkv_split_norm_rope(op, qkv, q_norm_weight, k_norm_weight, cos, sin,
                                           num_heads, num_kv_heads, rotary_dim, layout,
                                           qkv_format, input_layout);
  auto q = qkv_split_output(p, p.hq, qkv), k = qkv_split_output(p, p.hkv, qkv),
       v = qkv_split_output(p, p.hkv, qkv);
  if (p.b * p.s == 0) return {q, k, v};
  const auto x = qkv.stride(2) == 1 ? qkv : aten::contiguous(qkv);
  static const auto& family_fwd = runtime::family("qkv_split_norm_rope_fwd");
  const auto l = prepare(op, family_fwd, p, x, q_norm_weight, k_norm_weight,
                         cos, sin, {&q, &k, &v});
  // Without a weight the kernel never reads the pointer.
  const Tensor& qw = has(q_norm_weight) ? *q_norm_weight : x;
  const Tensor& kw = has(k_norm_weight) ? *k_norm_weight : x;
  KernelArgs args;
  args.ptr(x).ptr(qw).ptr(kw).ptr(l.cos).ptr(l.sin).ptr(q).ptr(k).ptr(v)
      .i64(l.in_sb).i64(l.in_ss).i64(l.cos_sb).i64(l.cos_ss).i32(p.b).i32(p.s).i32(p.hq)
      .i32(p.hkv).i32(p.d).i32(l.half).i32(l.c2_off).i32(l.mode).f32(eps);
  runtime::launch(op, *l.kern, qkv.device(), {l.tiles, 1, 1}, args);
  return {q, k, v};
}

std::tuple<Tensor, Tensor, Tensor> qkv_split_norm_rope_backward_cuda(
    Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor qkv, std::optional<Tensor> q_norm_weight,
    std::optional<Tensor> k_norm_weight, Tensor cos, Tensor sin, int64_t num_heads,
    int64_t num_kv_heads, double eps, std::optional<int64_t> rotary_dim, std::string layout,
    std::string qkv_format, std::string input_layout, std::vector<bool> output_mask) {
  constexpr const char* op = "fk::_qkv_split_norm_rope_backward";
  const auto p = check_qkv_split_norm_rope_backward(
      op, grad_q, grad_k, grad_v, qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads,
      num_kv_heads, rotary_dim, layout, qkv_format, input_layout);
  const bool has_qw = has(q_norm_weight), has_kw = has(k_norm_weight);
  const auto x = aten::contiguous(qkv);
  auto dqkv = aten::empty(x.sizes(), x.scalar_type(), x.device());
  Tensor dqw, dkw;
  if (p.b * p.s == 0) {
    if (has_qw && output_mask[0]) dqw = aten::zeros_like(*q_norm_weight);
    if (has_kw && output_mask[1]) dkw = aten::zeros_like(*k_norm_weight);
    return {dqkv, dqw, dkw};
  }
  // The kernel reads the gradients in the outputs' (contiguous) layout.
  const auto gq = aten::contiguous(grad_q), gk = aten::contiguous(grad_k),
             gv = aten::contiguous(grad_v);
  static const auto& family_bwd = runtime::family("qkv_split_norm_rope_bwd");
  const auto l = prepare(op, family_bwd, p, x, q_norm_weight, k_norm_weight,
                         cos, sin, {&gq, &gk, &gv, &dqkv});
  // Persistent grid over blocks of BT tokens (each program takes every head of its blocks):
  // 8 warps of programs per multiprocessor, as many as its registers let run at once
  // (benchmarks/NOTES.md v33; 16 were as fast, with twice the partial rows to sum).
  const int64_t programs =
      runtime::persistent_grid(l.blocks, qkv.device(),
                               runtime::programs_per_sm(l.kern->num_warps, 8))
          .programs;
  // Partial weight gradients, q's then k's in one row a program, written whenever the
  // weight exists (even if frozen), summed by one launch.
  auto part = has_qw || has_kw ? aten::empty({programs, 2 * p.d}, kFloat, x.device())
                                : Tensor();
  const Tensor& qw = has_qw ? *q_norm_weight : x;
  const Tensor& kw = has_kw ? *k_norm_weight : x;
  KernelArgs args;
  args.ptr(gq).ptr(gk).ptr(gv).ptr(x).ptr(qw).ptr(kw).ptr(l.cos).ptr(l.sin).ptr(dqkv)
      .ptr(has_qw || has_kw ? part : dqkv)
      .i64(l.in_sb).i64(l.in_ss).i64(l.cos_sb).i64(l.cos_ss).i32(p.b).i32(p.s).i32(p.hq)
      .i32(p.hkv).i32(p.d).i32(l.half).i32(l.c2_off).i32(l.mode).f32(eps);
  runtime::launch(op, *l.kern, qkv.device(), {programs, 1, 1}, args);
  const bool want_q = has_qw && output_mask[0], want_k = has_kw && output_mask[1];
  if (want_q || want_k) {
    // Both weights' columns in one launch (those of an absent weight are summed and dropped);
    // the weights have qkv's dtype.
    auto dws = rms_cuda::reduce_dw2(op, part, p.d, x);
    if (want_q) dqw = dws.first;
    if (want_k) dkw = dws.second;
  }
  return {dqkv, dqw, dkw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("qkv_split_norm_rope", TORCH_BOX(&fk::ops::qkv_split_norm_rope_cuda));
  m.impl("_qkv_split_norm_rope_backward",
         TORCH_BOX(&fk::ops::qkv_split_norm_rope_backward_cuda));
}
