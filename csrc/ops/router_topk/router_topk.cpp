// Schemas of fk::router_topk and its backward, and the shared checks. Fake kernels and the
// autograd formula: python/fk/ops/router_topk.py.
#include "ops/router_topk/router_topk.h"

#include <cmath>

#include "runtime/checks.h"

namespace fk::ops {

namespace {
constexpr const char* kOp = "fk::router_topk";
}  // namespace

RouterScore check_router_topk(const Tensor& logits, int64_t k, const std::string& score,
                              bool pre_softmax, double scaling_factor,
                              const std::optional<Tensor>& expert_bias) {
  FK_CHECK(logits.dim() >= 1, kOp, ": logits must have at least one dimension, got a scalar");
  checks::check_float(kOp, "logits", logits);
  const int64_t e = logits.size(-1);
  FK_CHECK(k >= 1 && k <= e, kOp, ": k must be between 1 and the number of experts (", e,
           "), got ", k);
  FK_CHECK(score == "softmax" || score == "sigmoid", kOp,
           ": score must be 'softmax' or 'sigmoid', got '", score, "'");
  FK_CHECK(!pre_softmax || score == "softmax", kOp,
           ": pre_softmax applies to score='softmax' only");
  FK_CHECK(std::isfinite(scaling_factor), kOp, ": scaling_factor must be finite, got ",
           scaling_factor);
  if (has(expert_bias)) {
    const Tensor& b = *expert_bias;
    FK_CHECK(score == "sigmoid", kOp, ": expert_bias applies to score='sigmoid' only");
    checks::check_same_device(kOp, "logits", logits, "expert_bias", b);
    FK_CHECK(b.scalar_type() == kFloat, kOp, ": expert_bias must have dtype Float, got ",
             b.scalar_type());
    FK_CHECK(b.dim() == 1 && b.size(0) == e, kOp, ": expert_bias must have shape (", e,
             "), got ", shape_of(b));
  }
  if (score == "sigmoid") return RouterScore::Sigmoid;
  return pre_softmax ? RouterScore::SoftmaxBefore : RouterScore::SoftmaxAfter;
}

RouterScore check_router_topk_backward(const Tensor& grad_probs, const Tensor& logits,
                                       const Tensor& routing_map, int64_t k,
                                       const std::string& score, bool pre_softmax,
                                       double scaling_factor) {
  constexpr const char* op = "fk::_router_topk_backward";
  const RouterScore code =
      check_router_topk(logits, k, score, pre_softmax, scaling_factor, std::nullopt);
  checks::check_same_device(op, "grad_probs", grad_probs, "logits", logits);
  checks::check_same_device(op, "routing_map", routing_map, "logits", logits);
  const ScalarType acc = checks::acc_type(logits);
  FK_CHECK(grad_probs.scalar_type() == acc, op, ": grad_probs must have dtype ", acc, ", got ",
           grad_probs.scalar_type());
  FK_CHECK(routing_map.scalar_type() == kBool, op, ": routing_map must have dtype Bool, got ",
           routing_map.scalar_type());
  checks::check_same_shape(op, "grad_probs", grad_probs, "logits", logits);
  checks::check_same_shape(op, "routing_map", routing_map, "logits", logits);
  return code;
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (probs, routing_map), both of logits' shape (..., E): the k experts of each row chosen
  // by score ("softmax": the k largest logits, probs = softmax over those k; with
  // pre_softmax, softmax over all E first, the k largest probabilities kept; "sigmoid":
  // sigmoid scores, the k largest of scores + expert_bias chosen, probs = the chosen scores
  // over their sum + 1e-20 when k > 1), zero elsewhere, times scaling_factor; probs float32
  // (float64 for float64 logits), routing_map bool.
  m.def("router_topk(Tensor logits, int k, str score='softmax', bool pre_softmax=False, "
        "float scaling_factor=1.0, Tensor? expert_bias=None) -> (Tensor, Tensor)");
  // grad_logits (logits' dtype) from grad_probs, the selection held fixed.
  m.def("_router_topk_backward(Tensor grad_probs, Tensor logits, Tensor routing_map, int k, "
        "str score, bool pre_softmax, float scaling_factor) -> Tensor");
}
