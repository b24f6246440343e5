// CUDA kernels of fk::kl_div: AOT-compiled Triton (triton_src/kl_div.py).
//
// A reduction: a persistent grid (programs per SM from the variant) streams the flat input
// and target once, writing the scaled gradient when wanted and one partial sum per program;
// one more program adds the partial sums in a fixed order into the loss. Nothing waits for
// the host. "none": the same walk writes the pointwise losses (forward) or grad_output times
// the slope (backward).
#include <algorithm>

#include "ops/kl_div/kl_div.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// Programs for n elements in tiles of k.block: at most PER_SM per multiprocessor.
int64_t programs_for(const runtime::KernelSpec& k, const Tensor& t, int64_t n) {
  const int64_t sms = runtime::device_sm_count(t.device().index());
  return std::clamp<int64_t>(checks::ceil_div(n, k.block), 1, sms * k.constexpr_value("PER_SM"));
}

}  // namespace

Tensor kl_div_reduce_cuda(const Tensor& x, const Tensor& t, const Tensor& grad, double scale,
                          double eps, bool log_target) {
  constexpr const char* op = "fk::kl_div";
  const int64_t n = x.numel();
  const bool write_grad = grad.defined();
  const Tensor& g = write_grad ? grad : x;  // unwritten when write_grad is false
  const bool aligned = runtime::aligned16({&x, &t, &g});
  static const auto& fam = runtime::family("kl_div_fwd");
  const auto& k = fam.pick(op, x, 0, aligned ? runtime::kFlagAligned : 0);
  const int64_t programs = programs_for(k, x, n);
  auto part = aten::empty({programs}, kFloat, x.device());
  KernelArgs args;
  args.ptr(x).ptr(t).ptr(g).ptr(part).i64(n).f32(eps).f32(scale).i32(log_target ? 1 : 0)
      .i32(write_grad ? 1 : 0);
  runtime::launch(op, k, x.device(), {programs, 1, 1}, args);

  auto loss = aten::empty({}, kFloat, x.device());
  static const auto& sum_fam = runtime::family("kl_div_sum");
  const auto& ks = sum_fam.pick(op, part, 0, 0);
  KernelArgs sum_args;
  sum_args.ptr(part).ptr(loss).i32(programs).f32(scale);
  runtime::launch(op, ks, x.device(), {1, 1, 1}, sum_args);
  return loss;
}

void kl_div_pointwise_cuda(const Tensor& a, const Tensor& t, const Tensor& out, double eps,
                           bool log_target, bool backward) {
  const char* op = backward ? "fk::kl_div (backward)" : "fk::kl_div";
  const int64_t n = t.numel();
  const bool aligned = runtime::aligned16({&a, &t, &out});
  static const auto& fam = runtime::family("kl_div_pointwise");
  const auto& k = fam.pick(op, t, 0, aligned ? runtime::kFlagAligned : 0);
  KernelArgs args;
  args.ptr(a).ptr(t).ptr(out).i64(n).f32(eps).i32(log_target ? 1 : 0).i32(backward ? 1 : 0);
  runtime::launch(op, k, t.device(), {programs_for(k, t, n), 1, 1}, args);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_kl_div_forward", TORCH_BOX(&fk::ops::kl_div_forward_impl));
  m.impl("_kl_div_backward", TORCH_BOX(&fk::ops::kl_div_backward_impl));
}
