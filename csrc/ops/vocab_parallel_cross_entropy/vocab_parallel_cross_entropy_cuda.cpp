// CUDA kernels of the vocabulary-parallel cross entropy ops: AOT-compiled Triton
// (triton_src/vocab_parallel_cross_entropy.py). Both are persistent grids of one row per
// program: the stats kernel reads the shard once; the loss kernel combines the ranks'
// stats of its row and, with a gradient, reads the shard once more and writes the gradient.
#include <algorithm>

#include "ops/vocab_parallel_cross_entropy/vocab_parallel_cross_entropy.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

constexpr const char* kOp = "fk::vocab_parallel_cross_entropy";
constexpr uint32_t kFlagGeneral = 2;  // triton_src/vocab_parallel_cross_entropy.py

bool general(const Tensor& weight, const VpOptions& o) {
  return weight.defined() || o.label_smoothing > 0.0 || o.softcap.has_value();
}

// Rows at once (programs): at most PER_SM per SM.
int64_t programs(const Tensor& x, const runtime::KernelSpec& k) {
  return std::min(x.size(0),
                  runtime::device_sm_count(x.device().index()) * k.constexpr_value("PER_SM"));
}

}  // namespace

void vp_ce_stats_cuda(const Tensor& x, const Tensor& target, const Tensor& weight,
                      const Tensor& stats, const VpOptions& o) {
  const int64_t m = x.size(0), v = x.size(1);
  const bool aligned = v % 16 == 0 && x.stride(0) % 16 == 0 && runtime::aligned16({&x});
  const uint32_t flags =
      (aligned ? runtime::kFlagAligned : 0) | (general(weight, o) ? kFlagGeneral : 0);
  static const auto& fam = runtime::family("vocab_parallel_ce_stats");
  const auto& k = fam.pick(kOp, x, std::min(v, fam.max_block(x)), flags);
  KernelArgs args;
  args.ptr(x).ptr(target).ptr(weight.defined() ? weight : stats).ptr(stats)
      .i64(x.stride(0)).i64(m).i32(v).i64(o.vocab_start).i64(o.ignore_index)
      .f32(o.label_smoothing).f32(o.softcap.value_or(1.0))
      .i32(weight.defined() ? 1 : 0).i32(o.softcap.has_value() ? 1 : 0);
  runtime::launch(kOp, k, x.device(), {programs(x, k), 1, 1}, args);
}

void vp_ce_loss_cuda(const Tensor& x, const Tensor& grad, const Tensor& target,
                     const Tensor& weight, const Tensor& stats, const Tensor& den,
                     const Tensor& scale, const Tensor& loss_rows, const Tensor& z_rows,
                     const VpOptions& o) {
  const int64_t m = x.size(0), v = x.size(1);
  const bool write_grad = grad.defined();
  const Tensor& g = write_grad ? grad : x;  // unwritten when write_grad is false
  FK_CHECK(g.scalar_type() == x.scalar_type() && g.stride(1) == 1, kOp,
           ": internal error: the gradient must have the logits' dtype and unit column "
           "stride");
  const bool aligned = v % 16 == 0 && x.stride(0) % 16 == 0 && g.stride(0) % 16 == 0 &&
                       runtime::aligned16({&x, &g});
  const uint32_t flags =
      (aligned ? runtime::kFlagAligned : 0) | (general(weight, o) ? kFlagGeneral : 0);
  static const auto& fam = runtime::family("vocab_parallel_ce_fwd");
  const auto& k = fam.pick(kOp, x, std::min(v, fam.max_block(x)), flags);
  KernelArgs args;
  args.ptr(x).ptr(g).ptr(target).ptr(weight.defined() ? weight : den).ptr(stats).ptr(den)
      .ptr(scale.defined() ? scale : den).ptr(loss_rows).ptr(z_rows)
      .i64(x.stride(0)).i64(g.stride(0)).i64(scale.defined() && scale.dim() == 1 ? 1 : 0)
      .i64(m).i32(v).i64(o.vocab_start).i64(o.vocab_size).i32(stats.size(0))
      .i64(o.ignore_index).f32(o.label_smoothing).f32(o.lse_square_scale)
      .f32(o.softcap.value_or(1.0)).i32(weight.defined() ? 1 : 0)
      .i32(o.softcap.has_value() ? 1 : 0).i32(scale.defined() ? 1 : 0)
      .i32(write_grad ? 1 : 0);
  runtime::launch(kOp, k, x.device(), {programs(x, k), 1, 1}, args);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_vocab_parallel_cross_entropy_stats", TORCH_BOX(&fk::ops::vp_ce_stats_impl));
  m.impl("_vocab_parallel_cross_entropy_loss", TORCH_BOX(&fk::ops::vp_ce_loss_impl));
  m.impl("_vocab_parallel_cross_entropy_loss_", TORCH_BOX(&fk::ops::vp_ce_loss_inplace_impl));
}
