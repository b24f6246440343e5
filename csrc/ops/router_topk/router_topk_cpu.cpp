// CPU reference of fk::router_topk in ATen operators (torch.topk for the selection), in
// float32 (float64 for float64 logits).
#include <limits>

#include "ops/router_topk/router_topk.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

constexpr double kNormEps = 1e-20;  // triton_src/router_topk.py NORM_EPS

Tensor rows(const Tensor& t) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) m *= t.size(d);
  return aten::reshape(t, {m, t.size(-1)});
}

Tensor neg_inf_like(const Tensor& t) {
  return aten::full(sizes_vec(t), -std::numeric_limits<double>::infinity(), t.scalar_type(),
                    t.device());
}

Tensor row_sum(const Tensor& t) { return aten::sum(t, {-1}, true); }

std::tuple<Tensor, Tensor> router_topk_cpu(Tensor logits, int64_t k, std::string score,
                                           bool pre_softmax, double scaling_factor,
                                           std::optional<Tensor> expert_bias) {
  const RouterScore code =
      check_router_topk(logits, k, score, pre_softmax, scaling_factor, expert_bias);
  const auto acc = checks::acc_type(logits);
  Tensor l = aten::to(rows(logits), acc);
  Tensor s, key;
  if (code == RouterScore::Sigmoid) {
    s = aten::sigmoid(l);
    key = has(expert_bias) ? s + aten::to(*expert_bias, acc) : s;
  } else if (code == RouterScore::SoftmaxBefore) {
    s = aten::softmax(l, -1);
    key = s;
  } else {
    key = l;
  }
  Tensor probs, mask;
  if (l.numel() == 0) {
    probs = aten::zeros(sizes_vec(l), acc, l.device());
    mask = aten::zeros(sizes_vec(l), kBool, l.device());
  } else {
    auto top = aten::call_n<2>("aten::topk", "", key, k, static_cast<int64_t>(-1), true, true);
    Tensor hits = aten::zeros(sizes_vec(l), acc, l.device());
    aten::scatter_add_(hits, 1, top[1], aten::full(sizes_vec(top[1]), 1.0, acc, l.device()));
    mask = aten::ne(hits, aten::scalar(0.0));
    const Tensor maskf = aten::to(mask, acc);
    if (code == RouterScore::SoftmaxAfter) {
      probs = aten::softmax(aten::where(mask, l, neg_inf_like(l)), -1);
    } else {
      probs = s * maskf;
      if (code == RouterScore::Sigmoid && k > 1) probs = probs / (row_sum(probs) + kNormEps);
    }
    probs = probs * scaling_factor;
  }
  return {aten::reshape(probs, sizes_vec(logits)), aten::reshape(mask, sizes_vec(logits))};
}

Tensor router_topk_backward_cpu(Tensor grad_probs, Tensor logits, Tensor routing_map,
                                int64_t k, std::string score, bool pre_softmax,
                                double scaling_factor) {
  const RouterScore code = check_router_topk_backward(grad_probs, logits, routing_map, k,
                                                      score, pre_softmax, scaling_factor);
  const auto acc = checks::acc_type(logits);
  Tensor l = aten::to(rows(logits), acc);
  Tensor mask = rows(routing_map);
  Tensor maskf = aten::to(mask, acc);
  Tensor g = rows(grad_probs) * maskf * scaling_factor;
  Tensor dl;
  if (code == RouterScore::Sigmoid) {
    Tensor s = aten::sigmoid(l);
    Tensor ds = g;
    if (k > 1) {
      Tensor ssum = row_sum(s * maskf) + kNormEps;
      ds = g / ssum - row_sum(g * s * maskf) / (ssum * ssum);
    }
    dl = ds * s * (1.0 - s) * maskf;
  } else {
    Tensor q = code == RouterScore::SoftmaxBefore
                   ? aten::softmax(l, -1)
                   : aten::softmax(aten::where(mask, l, neg_inf_like(l)), -1);
    dl = q * (g - row_sum(g * q));
  }
  return aten::reshape(aten::to(dl, logits.scalar_type()), sizes_vec(logits));
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("router_topk", TORCH_BOX(&fk::ops::router_topk_cpu));
  m.impl("_router_topk_backward", TORCH_BOX(&fk::ops::router_topk_backward_cpu));
}
