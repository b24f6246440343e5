// CUDA kernels of fk::tvd: AOT-compiled Triton (triton_src/tvd.py).
//
// Forward: where the reduction's row count depends on the labels ("mean" / "batchmean" with
// shift_labels), one program counts them on the device first; then one program per (row,
// chunk of columns) reads p and q once and writes the gradient and the elementwise loss or
// the chunk's partial sum; one program sums the partials. Backward: a persistent scaling
// kernel that returns at once for a scalar grad_output of 1 in place.
#include <algorithm>

#include "ops/tvd/tvd.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {

using runtime::KernelArgs;

Tensor tvd_forward_cuda(const Tensor& p, const Tensor& q, const Tensor& labels,
                        const Tensor& grad, TvdReduction r, int64_t ignore_index) {
  constexpr const char* op = "fk::tvd";
  const int64_t m = p.size(0), v = p.size(1);
  const bool write_grad = grad.defined();
  const Tensor& g = write_grad ? grad : p;  // unwritten when write_grad is false
  const bool aligned = v % 16 == 0 && runtime::aligned16({&p, &q, &g});
  static const auto& fam = runtime::family("tvd_fwd");
  const auto& k = fam.pick(op, p, std::min(v, fam.max_block(p)),
                           aligned ? runtime::kFlagAligned : 0);
  const int64_t chunks = checks::ceil_div(v, k.block);  // the variant's block is its chunk
  const bool per_elem = r == TvdReduction::None;
  const bool mean = r == TvdReduction::Mean || r == TvdReduction::BatchMean;

  // The reduction's factor: from the labels on the device, else known here.
  Tensor scale_t;
  double scale = 1.0;
  if (mean && labels.defined()) {
    scale_t = aten::empty({}, kFloat, p.device());
    static const auto& cfam = runtime::family("tvd_count");
    const auto& ck = cfam.pick(op, scale_t, 0, 0);
    KernelArgs cargs;
    cargs.ptr(labels).ptr(scale_t).i64(m).i64(ignore_index)
        .f32(r == TvdReduction::Mean ? static_cast<double>(v) : 1.0);
    runtime::launch(op, ck, p.device(), {1, 1, 1}, cargs);
  } else if (mean) {
    scale = 1.0 / (static_cast<double>(m) * (r == TvdReduction::Mean ? v : 1));
  }

  auto out = per_elem ? aten::empty({m, v}, kFloat, p.device())
                      : aten::empty({m * chunks}, kFloat, p.device());
  KernelArgs args;
  args.ptr(p).ptr(q).ptr(g).ptr(out).ptr(labels.defined() ? labels : out)
      .ptr(scale_t.defined() ? scale_t : out).i64(m).i32(v).i64(chunks).i64(ignore_index)
      .f32(scale).i32(labels.defined() ? 1 : 0).i32(scale_t.defined() ? 1 : 0)
      .i32(per_elem ? 1 : 0).i32(write_grad ? 1 : 0);
  runtime::launch(op, k, p.device(), {m * chunks, 1, 1}, args);
  if (per_elem) return out;

  auto loss = aten::empty({}, kFloat, p.device());
  static const auto& rfam = runtime::family("tvd_reduce");
  const auto& rk = rfam.pick(op, loss, 0, 0);
  KernelArgs rargs;
  rargs.ptr(out).ptr(scale_t.defined() ? scale_t : out).ptr(loss).i64(m * chunks).f32(scale)
      .i32(scale_t.defined() ? 1 : 0);
  runtime::launch(op, rk, p.device(), {1, 1, 1}, rargs);
  return loss;
}

void tvd_scale_grad_cuda(const Tensor& src, const Tensor& dst, const Tensor& grad_loss) {
  constexpr const char* op = "fk::tvd (backward)";
  const int64_t n = src.numel();
  const bool in_place = src.data_ptr() == dst.data_ptr();
  const bool aligned = runtime::aligned16({&src, &dst});
  static const auto& fam = runtime::family("tvd_scale");
  const auto& k = fam.pick(op, src, 0, aligned ? runtime::kFlagAligned : 0);
  const int64_t programs =
      std::min(checks::ceil_div(n, k.block),
               runtime::device_sm_count(src.device().index()) * k.constexpr_value("PER_SM"));
  KernelArgs args;
  args.ptr(src).ptr(dst).ptr(grad_loss).i32(grad_loss.dim() == 0 ? 0 : 1).i64(n)
      .i32(in_place ? 1 : 0);
  runtime::launch(op, k, src.device(), {programs, 1, 1}, args);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_tvd_forward", TORCH_BOX(&fk::ops::tvd_forward_impl));
  m.impl("_tvd_backward", TORCH_BOX(&fk::ops::tvd_backward_impl));
  m.impl("_tvd_backward_", TORCH_BOX(&fk::ops::tvd_backward_inplace_impl));
}
