// Schemas of fk::router_logits and its backward, and the shared checks. Fake kernels and the
// autograd formula: python/fk/ops/router_logits.py.
#include "ops/router_logits/router_logits.h"

#include "runtime/checks.h"

namespace fk::ops {

namespace {
constexpr const char* kOp = "fk::router_logits";
}  // namespace

ScalarType router_weight_grad_dtype(const Tensor& weight,
                                    const std::optional<ScalarType>& weight_grad_dtype) {
  return weight_grad_dtype.has_value() ? *weight_grad_dtype : weight.scalar_type();
}

void check_router_logits(const Tensor& x, const Tensor& weight,
                         const std::optional<ScalarType>& weight_grad_dtype) {
  FK_CHECK(x.dim() >= 1, kOp, ": x must have at least one dimension, got a scalar");
  checks::check_pair(kOp, "x", x, "weight", weight);
  FK_CHECK(weight.dim() == 2 && weight.size(1) == x.size(-1), kOp,
           ": weight must have shape (E, ", x.size(-1), ") to match the last dim of x, got ",
           shape_of(weight));
  if (weight_grad_dtype.has_value()) {
    const ScalarType d = *weight_grad_dtype;
    FK_CHECK(d == kFloat || d == weight.scalar_type(), kOp,
             ": weight_grad_dtype must be float32 or the weight's dtype (", weight.scalar_type(),
             "), got ", d);
  }
}

void check_router_logits_backward(const Tensor& grad_logits, const Tensor& x,
                                  const Tensor& weight,
                                  const std::optional<ScalarType>& weight_grad_dtype) {
  constexpr const char* op = "fk::_router_logits_backward";
  check_router_logits(x, weight, weight_grad_dtype);
  checks::check_same_device(op, "grad_logits", grad_logits, "x", x);
  const ScalarType acc = checks::acc_type(x);
  FK_CHECK(grad_logits.scalar_type() == acc, op, ": grad_logits must have dtype ", acc,
           ", got ", grad_logits.scalar_type());
  Shape want = sizes_vec(x);
  want.back() = weight.size(0);
  FK_CHECK(sizes_vec(grad_logits) == want, op, ": grad_logits must have shape ",
           ShapeText{want}, ", got ", shape_of(grad_logits));
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // x (..., H) @ weight^T with weight (E, H) (nn.Linear's layout, no bias): logits
  // (..., E) in float32 (float64 for float64 inputs on CPU), fp32 accumulation; x and
  // weight of one dtype (float32, bfloat16, float16). weight_grad_dtype: the dtype of the
  // weight's gradient, the weight's (None) or float32.
  m.def("router_logits(Tensor x, Tensor weight, ScalarType? weight_grad_dtype=None) -> Tensor");
  // (grad_x, grad_weight) = (grad_logits @ weight in x's dtype, grad_logits^T @ x in
  // weight_grad_dtype), each when output_mask says so (else undefined); grad_logits float32.
  m.def("_router_logits_backward(Tensor grad_logits, Tensor x, Tensor weight, "
        "bool[2] output_mask, ScalarType? weight_grad_dtype=None) -> (Tensor, Tensor)");
}
