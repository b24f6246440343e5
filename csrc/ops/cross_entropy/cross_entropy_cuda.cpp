// CUDA kernels of fk::cross_entropy: AOT-compiled Triton (triton_src/cross_entropy.py).
//
// Forward: for a mean, a few programs sum the denominators on the device; then a persistent
// grid (rows per SM from the variant) walks the rows, each read once from DRAM and once
// more from L2, the gradient written in the logits' dtype; a variant may split each row over
// a thread-block cluster of programs. Backward: a persistent
// scaling kernel that returns at once for a grad_output of 1 in place. The deferred form:
// the forward without the gradient (each row's lse kept), then a persistent backward over
// tiles of the rows that computes the gradient times grad_output in one pass.
#include <algorithm>

#include "ops/cross_entropy/cross_entropy.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

constexpr uint32_t kFlagGeneral = 2;  // triton_src/cross_entropy.py FLAG_GENERAL
constexpr uint32_t kFlagExtra = 4;    // triton_src/cross_entropy.py FLAG_EXTRA

int64_t sm_count(const Tensor& t) { return runtime::device_sm_count(t.device().index()); }

}  // namespace

Tensor cross_entropy_den_cuda(const Tensor& target, const Tensor& weight, int64_t V,
                              int64_t ignore_index) {
  constexpr const char* op = "fk::cross_entropy";
  // The programs add their partial sums atomically into the pair, zeroed first on the same
  // stream (a CUDA graph captures both).
  auto den = aten::zeros({2}, kFloat, target.device());
  static const auto& fam = runtime::family("cross_entropy_den");
  const auto& k = fam.pick(op, den, 0, 0);
  const int64_t n = target.numel();
  const int64_t programs = std::clamp<int64_t>(checks::ceil_div(n, k.block), 1,
                                               sm_count(target) * k.constexpr_value("PER_SM"));
  KernelArgs args;
  args.ptr(target).ptr(weight.defined() ? weight : den).ptr(den).i64(n).i32(V)
      .i64(ignore_index).i32(weight.defined() ? 1 : 0);
  runtime::launch(op, k, target.device(), {programs, 1, 1}, args);
  return den;
}

void cross_entropy_rows_cuda(const Tensor& logits, const Tensor& grad, const Tensor& target,
                             const Tensor& weight, const Tensor& den, const Tensor& loss_rows,
                             const Tensor& z_rows, const Tensor& pred, const CeOptions& o,
                             const Tensor& lse_rows) {
  constexpr const char* op = "fk::cross_entropy";
  const int64_t m = logits.size(0), v = logits.size(1);
  const bool write_grad = grad.defined();
  const Tensor& g = write_grad ? grad : logits;  // unwritten when write_grad is false
  FK_CHECK(g.scalar_type() == logits.scalar_type() && logits.stride(1) == 1 && g.stride(1) == 1,
           op, ": internal error: the gradient must have the logits' dtype and both unit "
           "column strides");
  // The argmax and token scaling run in the EXTRA variants (general ones where the options
  // need it, else plain ones of one program per row).
  const bool extra = pred.defined() || o.token_scaling;
  const bool general = weight.defined() || o.label_smoothing > 0.0 || o.softcap.has_value();
  const bool aligned = v % 16 == 0 && logits.stride(0) % 16 == 0 && g.stride(0) % 16 == 0 &&
                       runtime::aligned16({&logits, &g});
  const uint32_t flags = (aligned ? runtime::kFlagAligned : 0) | (general ? kFlagGeneral : 0) |
                         (extra ? kFlagExtra : 0);
  // The EXTRA variants store every row's argmax: into a scratch buffer where only token
  // scaling was asked for (never into another argument's memory).
  const Tensor pred_out =
      pred.defined() ? pred : (extra ? aten::empty({m}, kLong, logits.device()) : target);
  static const auto& fam = runtime::family("cross_entropy_fwd");
  const auto& k = fam.pick(op, logits, std::min(v, fam.max_block(logits)), flags);
  // CHUNKS > 1: each row is split over a cluster of CHUNKS programs that exchange their
  // chunks' sums through distributed shared memory; PER_SM counts rows (clusters).
  const int64_t chunks = k.constexpr_value("CHUNKS");
  const int64_t rows_at_once = std::min(m, sm_count(logits) * k.constexpr_value("PER_SM"));
  // The kernel always reads (D_w, D_n) (ones unless the reduction is "mean").
  FK_CHECK(den.defined() && den.scalar_type() == kFloat && den.numel() == 2, op,
           ": internal error: the denominators must be a float32 pair");
  KernelArgs args;
  args.ptr(logits).ptr(g).ptr(target).ptr(weight.defined() ? weight : loss_rows)
      .ptr(den).ptr(loss_rows).ptr(z_rows)
      .i64(logits.stride(0)).i64(g.stride(0)).i64(m).i32(v).i64(o.ignore_index)
      .f32(o.label_smoothing).f32(o.lse_square_scale).f32(o.softcap.value_or(1.0))
      .i32(weight.defined() ? 1 : 0).i32(o.softcap.has_value() ? 1 : 0)
      .i32(write_grad ? 1 : 0).ptr(pred_out).i32(o.token_scaling ? 1 : 0)
      .ptr(lse_rows.defined() ? lse_rows : loss_rows).i32(lse_rows.defined() ? 1 : 0);
  runtime::launch(op, k, logits.device(), {rows_at_once * chunks, 1, 1}, args);
}

void cross_entropy_rows_backward_cuda(const Tensor& logits, const Tensor& grad,
                                      const Tensor& target, const Tensor& weight,
                                      const Tensor& den, const Tensor& lse,
                                      const Tensor& grad_loss, const CeOptions& o) {
  constexpr const char* op = "fk::cross_entropy (backward)";
  const int64_t m = logits.size(0), v = logits.size(1);
  FK_CHECK(grad.scalar_type() == logits.scalar_type() && logits.stride(1) == 1 &&
               grad.stride(1) == 1 && lse.scalar_type() == kFloat && den.scalar_type() == kFloat,
           op, ": internal error: the gradient must have the logits' dtype, both unit column "
           "strides, lse and den float32");
  FK_CHECK(!o.token_scaling, op, ": internal error: no token scaling in the deferred backward");
  const bool general = weight.defined() || o.label_smoothing > 0.0 || o.softcap.has_value();
  // The weights are read a block at a time like the logits (general variants).
  const bool aligned = v % 16 == 0 && logits.stride(0) % 16 == 0 && grad.stride(0) % 16 == 0 &&
                       runtime::aligned16({&logits, &grad, &weight});
  const uint32_t flags = (aligned ? runtime::kFlagAligned : 0) | (general ? kFlagGeneral : 0);
  static const auto& fam = runtime::family("cross_entropy_bwd");
  const auto& k = fam.pick(op, logits, 0, flags);
  const int64_t tiles = m * checks::ceil_div(v, k.block);
  const int64_t programs = std::min(tiles, sm_count(logits) * k.constexpr_value("PER_SM"));
  auto g = aten::contiguous(aten::to(grad_loss, kFloat));
  // The sum of the class weights (label smoothing with weights): on the device.
  Tensor wsum = den;
  if (weight.defined() && o.label_smoothing > 0.0) wsum = aten::sum_all(weight, kFloat);
  KernelArgs args;
  args.ptr(logits).ptr(grad).ptr(target).ptr(weight.defined() ? weight : den).ptr(den).ptr(lse)
      .ptr(g).ptr(wsum).i64(g.dim() == 0 ? 0 : 1).i64(logits.stride(0)).i64(grad.stride(0))
      .i64(m).i32(v).i64(o.ignore_index).f32(o.label_smoothing).f32(o.lse_square_scale)
      .f32(o.softcap.value_or(1.0)).i32(weight.defined() ? 1 : 0)
      .i32(o.softcap.has_value() ? 1 : 0);
  runtime::launch(op, k, logits.device(), {programs, 1, 1}, args);
}

void cross_entropy_scale_cuda(const Tensor& src, const Tensor& dst, const Tensor& grad_loss) {
  constexpr const char* op = "fk::cross_entropy (backward)";
  const int64_t m = src.size(0), v = src.size(1);
  const bool in_place = src.data_ptr() == dst.data_ptr();
  const bool aligned = v % 16 == 0 && runtime::aligned16({&src, &dst});
  static const auto& fam = runtime::family("cross_entropy_scale");
  const auto& k = fam.pick(op, src, 0, aligned ? runtime::kFlagAligned : 0);
  const int64_t tiles = m * checks::ceil_div(v, k.block);
  const int64_t programs = std::min(tiles, sm_count(src) * k.constexpr_value("PER_SM"));
  auto g = aten::contiguous(aten::to(grad_loss, kFloat));
  KernelArgs args;
  args.ptr(src).ptr(dst).ptr(g).i64(g.dim() == 0 ? 0 : 1).i64(src.stride(0)).i64(dst.stride(0))
      .i64(m).i32(v).i32(in_place ? 1 : 0);
  runtime::launch(op, k, src.device(), {programs, 1, 1}, args);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_cross_entropy_forward", TORCH_BOX(&fk::ops::cross_entropy_forward_impl));
  m.impl("_cross_entropy_forward_", TORCH_BOX(&fk::ops::cross_entropy_forward_inplace_impl));
  m.impl("_cross_entropy_backward", TORCH_BOX(&fk::ops::cross_entropy_backward_impl));
  m.impl("_cross_entropy_backward_", TORCH_BOX(&fk::ops::cross_entropy_backward_inplace_impl));
  m.impl("_cross_entropy_deferred_forward",
         TORCH_BOX(&fk::ops::cross_entropy_deferred_forward_impl));
  m.impl("_cross_entropy_deferred_backward",
         TORCH_BOX(&fk::ops::cross_entropy_deferred_backward_impl));
  m.impl("_cross_entropy_deferred_backward_",
         TORCH_BOX(&fk::ops::cross_entropy_deferred_backward_inplace_impl));
}
