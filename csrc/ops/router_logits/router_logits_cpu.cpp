// CPU reference of fk::router_logits in ATen operators: the products in float32 (float64
// for float64 inputs) from inputs widened to that dtype, grad_x rounded once to x's dtype.
#include "ops/router_logits/router_logits.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// (rows, last dim) view of t; also for empty tensors, where -1 would be ambiguous.
Tensor rows(const Tensor& t) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) m *= t.size(d);
  return aten::reshape(t, {m, t.size(-1)});
}

Tensor router_logits_cpu(Tensor x, Tensor weight, std::optional<ScalarType> weight_grad_dtype) {
  check_router_logits(x, weight, weight_grad_dtype);
  const auto acc = checks::acc_type(x);
  auto out = aten::mm(aten::to(rows(x), acc), aten::t(aten::to(weight, acc)));
  Shape sizes = sizes_vec(x);
  sizes.back() = weight.size(0);
  return aten::reshape(out, sizes);
}

std::tuple<Tensor, Tensor> router_logits_backward_cpu(Tensor grad_logits, Tensor x,
                                                      Tensor weight,
                                                      std::vector<bool> output_mask,
                                                      std::optional<ScalarType> weight_grad_dtype) {
  check_router_logits_backward(grad_logits, x, weight, weight_grad_dtype);
  const auto acc = checks::acc_type(x);
  auto g = rows(grad_logits);
  Tensor dx, dw;
  if (output_mask[0]) {
    dx = aten::reshape(aten::to(aten::mm(g, aten::to(weight, acc)), x.scalar_type()),
                       sizes_vec(x));
  }
  if (output_mask[1]) {
    dw = aten::to(aten::mm(aten::t(g), aten::to(rows(x), acc)),
                  router_weight_grad_dtype(weight, weight_grad_dtype));
  }
  return {dx, dw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("router_logits", TORCH_BOX(&fk::ops::router_logits_cpu));
  m.impl("_router_logits_backward", TORCH_BOX(&fk::ops::router_logits_backward_cpu));
}
