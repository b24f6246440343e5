// CUDA kernels of fk::neighborhood_attention: AOT-compiled Triton
// (triton_src/neighborhood_attention.py).
//
// Forward: one kernel, one program per (batch * head, residue mod dilation, block of
// BLOCK_M queries), online softmax over the window's keys only; writes out and the fp32
// logsumexp. Backward: two kernels, no atomics: per query block dQ (and delta = rowsum(dO *
// O), written for the second), then per key block dK and dV. The kernels are built for
// 16-byte vector loads only: q, k, v and grad_out are read in place through their strides
// when head_dim is the unit-stride dim, head_dim and every stride are multiples of 16 and the
// data is 16-byte aligned (contiguous inputs and (batch, seq, heads, dim) projections viewed
// as (batch, heads, seq, dim), at the usual head dims), else from one contiguous copy,
// zero-padded along head_dim to a multiple of 16. out, lse and the gradients are
// contiguous. head_dim up to 128 (80, 96, 112 masked within the 128 bucket).
#include <cmath>

#include "ops/neighborhood_attention/neighborhood_attention.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

constexpr int64_t kMaxHeadDim = 128;  // triton_src/neighborhood_attention.py MAX_D
constexpr double kLog2e = 1.4426950408889634;

void check_cuda(const char* op, const NaParams& p) {
  FK_CHECK(p.d <= kMaxHeadDim, op, ": head_dim ", p.d, " is larger than ", kMaxHeadDim,
           ", which is not supported on CUDA (the CPU backend takes any head_dim)");
}

// head_dim rounded up to a multiple of 16: what the kernels see.
int64_t padded_d(const NaParams& p) { return checks::ceil_div(p.d, 16) * 16; }

// What the (aligned-only) kernels take: head_dim the unit-stride dim, every stride a
// multiple of 16 elements, the data 16-byte aligned.
bool kernel_ready(const Tensor& t) {
  if (t.size(3) > 1 && t.stride(3) != 1) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.stride(i) % 16 != 0) return false;
  }
  return runtime::aligned16({&t});
}

// t as the kernels take it, with head_dim d16: t itself when it already is, else a
// contiguous copy, zero-padded along head_dim when d16 > head_dim (zero columns add nothing
// to q k^T, and give zero output / gradient columns that are cut off again).
Tensor prepare(const Tensor& t, int64_t d16) {
  if (t.size(3) == d16 && kernel_ready(t)) return t;
  if (t.size(3) == d16) return aten::clone(t);
  auto out = aten::zeros({t.size(0), t.size(1), t.size(2), d16}, t.scalar_type(), t.device());
  aten::copy_(aten::narrow(out, 3, 0, t.size(3)), t);
  return out;
}

// A (B, H, L, d16) kernel result back to head_dim d, contiguous.
Tensor unpad(const Tensor& t, int64_t d) {
  return t.size(3) == d ? t : aten::contiguous(aten::narrow(t, 3, 0, d));
}

void strides(KernelArgs& args, const Tensor& t) {
  args.i64(t.stride(0)).i64(t.stride(1)).i64(t.stride(2));
}

int64_t programs(const NaParams& p, int64_t block) {
  const int64_t n_sub = checks::ceil_div(p.l, p.dilation);
  return p.b * p.h * p.dilation * checks::ceil_div(n_sub, block);
}

void scalars(KernelArgs& args, const NaParams& p, int64_t d16) {
  args.i32(p.h).i32(p.l).i32(d16).i32(p.radius).i32(p.dilation).f32(p.scale * kLog2e);
}

std::tuple<Tensor, Tensor> neighborhood_attention_forward_cuda(Tensor q, Tensor k, Tensor v,
                                                               int64_t kernel_size,
                                                               int64_t dilation,
                                                               std::optional<double> scale) {
  constexpr const char* op = "fk::neighborhood_attention";
  const auto p = check_neighborhood_attention(q, k, v, kernel_size, dilation, scale);
  check_cuda(op, p);
  auto out = aten::empty(q.sizes(), q.scalar_type(), q.device());
  auto lse = aten::empty({p.b, p.h, p.l}, kFloat, q.device());
  if (q.numel() == 0) {
    aten::zero_(lse);
    return {out, lse};
  }
  const int64_t d16 = padded_d(p);
  auto qs = prepare(q, d16), ks = prepare(k, d16), vs = prepare(v, d16);
  auto o16 = d16 == p.d ? out : aten::empty({p.b, p.h, p.l, d16}, q.scalar_type(), q.device());
  static const auto& fam = runtime::family("neighborhood_attention_fwd");
  const auto& kf = fam.pick(op, q, d16, runtime::kFlagAligned);
  KernelArgs args;
  args.ptr(qs).ptr(ks).ptr(vs).ptr(o16).ptr(lse);
  strides(args, qs);
  strides(args, ks);
  strides(args, vs);
  scalars(args, p, d16);
  runtime::launch(op, kf, q.device(), {programs(p, kf.constexpr_value("BLOCK_M")), 1, 1},
                  args);
  if (d16 != p.d) out = unpad(o16, p.d);
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> neighborhood_attention_backward_cuda(
    Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, int64_t kernel_size,
    int64_t dilation, std::optional<double> scale) {
  constexpr const char* op = "fk::_neighborhood_attention_backward";
  const auto p = check_neighborhood_attention_backward(grad_out, q, k, v, out, lse,
                                                       kernel_size, dilation, scale);
  check_cuda(op, p);
  auto dq = aten::empty(q.sizes(), q.scalar_type(), q.device());
  auto dk = aten::empty(q.sizes(), q.scalar_type(), q.device());
  auto dv = aten::empty(q.sizes(), q.scalar_type(), q.device());
  if (q.numel() == 0) {
    aten::zero_(dq);
    aten::zero_(dk);
    aten::zero_(dv);
    return {dq, dk, dv};
  }
  const int64_t d16 = padded_d(p);
  auto qs = prepare(q, d16), ks = prepare(k, d16), vs = prepare(v, d16);
  auto dos = prepare(grad_out, d16), oc = prepare(aten::contiguous(out), d16);
  auto lc = aten::contiguous(lse);
  if (!runtime::aligned16({&lc})) lc = aten::clone(lse);
  auto delta = aten::empty({p.b, p.h, p.l}, kFloat, q.device());
  auto alloc = [&](const Tensor& like) {
    return d16 == p.d ? like : aten::empty({p.b, p.h, p.l, d16}, q.scalar_type(), q.device());
  };
  auto dq16 = alloc(dq), dk16 = alloc(dk), dv16 = alloc(dv);
  static const auto& dq_fam = runtime::family("neighborhood_attention_bwd_dq");
  static const auto& dkv_fam = runtime::family("neighborhood_attention_bwd_dkv");

  const auto& kq = dq_fam.pick(op, q, d16, runtime::kFlagAligned);
  KernelArgs a1;
  a1.ptr(qs).ptr(ks).ptr(vs).ptr(oc).ptr(dos).ptr(lc).ptr(delta).ptr(dq16);
  strides(a1, qs);
  strides(a1, ks);
  strides(a1, vs);
  strides(a1, dos);
  scalars(a1, p, d16);
  a1.f32(p.scale);
  runtime::launch(op, kq, q.device(), {programs(p, kq.constexpr_value("BLOCK_M")), 1, 1}, a1);

  const auto& kkv = dkv_fam.pick(op, q, d16, runtime::kFlagAligned);
  KernelArgs a2;
  a2.ptr(qs).ptr(ks).ptr(vs).ptr(dos).ptr(lc).ptr(delta).ptr(dk16).ptr(dv16);
  strides(a2, qs);
  strides(a2, ks);
  strides(a2, vs);
  strides(a2, dos);
  scalars(a2, p, d16);
  a2.f32(p.scale);
  runtime::launch(op, kkv, q.device(), {programs(p, kkv.constexpr_value("BLOCK_N")), 1, 1},
                  a2);
  if (d16 != p.d) {
    dq = unpad(dq16, p.d);
    dk = unpad(dk16, p.d);
    dv = unpad(dv16, p.d);
  }
  return {dq, dk, dv};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_neighborhood_attention_forward",
         TORCH_BOX(&fk::ops::neighborhood_attention_forward_cuda));
  m.impl("_neighborhood_attention_backward",
         TORCH_BOX(&fk::ops::neighborhood_attention_backward_cuda));
}
