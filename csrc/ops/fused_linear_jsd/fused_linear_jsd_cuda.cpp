// CUDA kernel of the divergence rows of fk::fused_linear_jsd: AOT-compiled Triton
// (triton_src/fused_linear_jsd.py), a persistent grid of programs walking the rows.
#include <algorithm>

#include "ops/fused_linear_jsd/fused_linear_jsd.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {

void jsd_rows_cuda(const Tensor& s, const Tensor& t, const Tensor& grad, const Tensor& labels,
                   const Tensor& den, const Tensor& loss_rows, double beta,
                   int64_t ignore_index, double temperature) {
  constexpr const char* op = "fk::fused_linear_jsd";
  const int64_t m = s.size(0), v = s.size(1);
  const bool write_grad = grad.defined();
  const Tensor& g = write_grad ? grad : s;  // picks the variant's dtype; unwritten
  FK_CHECK(s.scalar_type() == kFloat && t.scalar_type() == kFloat && s.stride(1) == 1 &&
               t.stride(1) == 1 && g.stride(1) == 1 && den.scalar_type() == kFloat &&
               loss_rows.scalar_type() == kFloat,
           op, ": internal error: float32 logits, loss and count, unit column strides");
  const bool aligned = v % 16 == 0 && s.stride(0) % 16 == 0 && t.stride(0) % 16 == 0 &&
                       g.stride(0) % 16 == 0 && runtime::aligned16({&s, &t, &g});
  static const auto& fam = runtime::family("fused_linear_jsd");
  const auto& k = fam.pick(op, g, 0, aligned ? runtime::kFlagAligned : 0);
  const int64_t programs =
      std::min(m, runtime::device_sm_count(s.device().index()) * k.constexpr_value("PER_SM"));
  runtime::KernelArgs args;
  args.ptr(s).ptr(t).ptr(g).ptr(labels.defined() ? labels : loss_rows).ptr(den).ptr(loss_rows)
      .i64(s.stride(0)).i64(t.stride(0)).i64(g.stride(0)).i64(m).i32(v).i64(ignore_index)
      .f32(beta).f32(1.0 / temperature).i32(labels.defined() ? 1 : 0).i32(write_grad ? 1 : 0);
  runtime::launch(op, k, s.device(), {programs, 1, 1}, args);
}

}  // namespace fk::ops
