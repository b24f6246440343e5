// CUDA kernels of fk::jsd: AOT-compiled Triton (triton_src/jsd.py).
//
// With shift labels, a few programs count the counted rows into a zeroed int32 on the
// device; then one program per (row, chunk of columns) reads x and y once, writes the
// scaled gradient and one fp32 partial loss; one program sums the partials in a fixed
// order into the 0-dim loss. Nothing waits for the host (CUDA-graph capturable).
#include <algorithm>
#include <limits>

#include "ops/jsd/jsd.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {

using runtime::KernelArgs;

Tensor jsd_cuda(const Tensor& x, const Tensor& y, const std::optional<Tensor>& labels,
                double beta, int64_t ignore_index, const Tensor& grad) {
  constexpr const char* op = "fk::jsd";
  const int64_t m = x.size(0), v = x.size(1);
  const bool write_grad = grad.defined();
  const Tensor& g = write_grad ? grad : x;  // unwritten when write_grad is false
  const bool has_labels = labels.has_value();
  const bool aligned = v % 16 == 0 && runtime::aligned16({&x, &y, &g});

  static const auto& fam = runtime::family("jsd_fwd");
  const auto& k = fam.pick(op, x, 0, aligned ? runtime::kFlagAligned : 0);
  const int64_t block = k.constexpr_value("BLOCK");
  const int64_t n_chunks = checks::ceil_div(v, k.block);
  const int64_t chunk = checks::ceil_div(checks::ceil_div(v, n_chunks), block) * block;
  const int64_t programs = m * n_chunks;
  FK_CHECK(programs <= std::numeric_limits<int32_t>::max(), op, ": input has too many rows (",
           m, ")");
  auto partial = aten::empty({programs}, kFloat, x.device());
  // The counter is also passed (unread) without labels, and labels_ptr then points at it.
  auto count = has_labels ? aten::zeros({1}, kInt, x.device())
                          : aten::empty({1}, kInt, x.device());
  const Tensor& lab = has_labels ? *labels : count;
  if (has_labels) {
    static const auto& cfam = runtime::family("jsd_count");
    const auto& ck = cfam.pick(op, partial, 0, 0);
    KernelArgs args;
    args.ptr(lab).ptr(count).i64(m).i64(ignore_index);
    runtime::launch(op, ck, x.device(), {checks::ceil_div(m, ck.block), 1, 1}, args);
  }

  const double inv_n = 1.0 / static_cast<double>(m);
  KernelArgs args;
  args.ptr(x).ptr(y).ptr(g).ptr(lab).ptr(count).ptr(partial)
      .i64(x.stride(0)).i64(y.stride(0)).i64(g.stride(0)).i32(v).i32(chunk).i32(n_chunks)
      .i64(ignore_index).f32(beta).f32(inv_n).i32(static_cast<int>(jsd_mode(beta)))
      .i32(has_labels ? 1 : 0).i32(write_grad ? 1 : 0);
  runtime::launch(op, k, x.device(), {programs, 1, 1}, args);

  auto loss = aten::empty({}, x.scalar_type(), x.device());
  static const auto& rfam = runtime::family("jsd_reduce");
  const auto& rk = rfam.pick(op, x, 0, 0);
  KernelArgs rargs;
  rargs.ptr(partial).ptr(count).ptr(loss).i32(programs).f32(inv_n).i32(has_labels ? 1 : 0);
  runtime::launch(op, rk, x.device(), {1, 1, 1}, rargs);
  return loss;
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_jsd_forward", TORCH_BOX(&fk::ops::jsd_forward_impl));
}
