// CUDA kernels of fk::router_topk: AOT-compiled Triton (triton_src/router_topk.py), one
// launch forward (probs and the routing map), one backward; ROWS rows of BLOCK_E >= E
// columns a program (up to 1024 experts).
#include "ops/router_topk/router_topk.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

Tensor as_rows(const Tensor& t) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) m *= t.size(d);
  return aten::view(aten::contiguous(t), {m, t.size(-1)});
}

std::tuple<Tensor, Tensor> router_topk_cuda(Tensor logits, int64_t k, std::string score,
                                            bool pre_softmax, double scaling_factor,
                                            std::optional<Tensor> expert_bias) {
  constexpr const char* op = "fk::router_topk";
  const RouterScore code =
      check_router_topk(logits, k, score, pre_softmax, scaling_factor, expert_bias);
  auto l = as_rows(logits);
  const int64_t t = l.size(0), e = l.size(1);
  auto probs = aten::empty(sizes_vec(logits), kFloat, logits.device());
  auto map = aten::empty(sizes_vec(logits), kBool, logits.device());
  if (t == 0) return {probs, map};
  static const auto& fam = runtime::family("router_topk_fwd");
  const auto& kern = fam.pick(op, l, e, 0);
  const bool with_bias = has(expert_bias);
  Tensor bias = with_bias ? aten::contiguous(*expert_bias) : probs;  // (unread without bias)
  KernelArgs args;
  args.ptr(l).ptr(bias).ptr(probs).ptr(map).i32(t).i32(e).i32(k).i32(static_cast<int>(code))
      .i32(with_bias ? 1 : 0).i32(k > 1 ? 1 : 0).f32(scaling_factor);
  runtime::launch(op, kern, logits.device(),
                  {checks::ceil_div(t, kern.constexpr_value("ROWS")), 1, 1}, args);
  return {probs, map};
}

Tensor router_topk_backward_cuda(Tensor grad_probs, Tensor logits, Tensor routing_map,
                                 int64_t k, std::string score, bool pre_softmax,
                                 double scaling_factor) {
  constexpr const char* op = "fk::_router_topk_backward";
  const RouterScore code = check_router_topk_backward(grad_probs, logits, routing_map, k,
                                                      score, pre_softmax, scaling_factor);
  auto l = as_rows(logits);
  auto g = as_rows(grad_probs);
  auto map = as_rows(routing_map);
  const int64_t t = l.size(0), e = l.size(1);
  auto dl = aten::empty(sizes_vec(logits), logits.scalar_type(), logits.device());
  if (t == 0) return dl;
  static const auto& fam = runtime::family("router_topk_bwd");
  const auto& kern = fam.pick(op, l, e, 0);
  KernelArgs args;
  args.ptr(g).ptr(l).ptr(map).ptr(dl).i32(t).i32(e).i32(static_cast<int>(code))
      .i32(k > 1 ? 1 : 0).f32(scaling_factor);
  runtime::launch(op, kern, logits.device(),
                  {checks::ceil_div(t, kern.constexpr_value("ROWS")), 1, 1}, args);
  return dl;
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("router_topk", TORCH_BOX(&fk::ops::router_topk_cuda));
  m.impl("_router_topk_backward", TORCH_BOX(&fk::ops::router_topk_backward_cuda));
}
