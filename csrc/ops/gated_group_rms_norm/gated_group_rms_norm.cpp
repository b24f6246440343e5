// Schemas of fk::gated_group_rms_norm and its backward, and the shared checks.
// Fake kernels and the autograd formula: python/fk/ops/gated_group_rms_norm.py.
#include "ops/gated_group_rms_norm/gated_group_rms_norm.h"

#include "runtime/checks.h"

namespace fk::ops {

GatedNorm check_gated_group_rms_norm(const char* op, const Tensor& x, const Tensor& gate,
                                     const std::optional<Tensor>& weight, int64_t group_size,
                                     const std::string& activation, bool transpose_out) {
  FK_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_float(op, "x", x);
  checks::check_pair(op, "x", x, "gate", gate);
  checks::check_same_shape(op, "x", x, "gate", gate);
  FK_CHECK(activation == "silu" || activation == "sigmoid", op,
           ": activation must be 'silu' or 'sigmoid', got '", activation, "'");
  GatedNorm p{};
  p.n = x.size(-1);
  p.g = group_size;
  p.sigmoid = activation == "sigmoid";
  FK_CHECK(group_size >= 1 && p.n % group_size == 0, op, ": group_size (", group_size,
           ") must be positive and divide the last dim of x (", p.n, ")");
  FK_CHECK(!transpose_out || x.dim() == 4, op,
           ": transpose_out needs x of 4 dims (batch, seq, heads, head_dim), got shape ",
           shape_of(x));
  if (has(weight)) {
    checks::check_pair(op, "x", x, "weight", *weight);
    FK_CHECK(weight->dim() == 1 && (weight->size(0) == p.n || weight->size(0) == group_size),
             op, ": weight must have shape (", p.n, ",) or (group_size,) (", group_size,
             ",), got ", shape_of(*weight));
    p.w_per_group = weight->size(0) == group_size;
  }
  return p;
}

GatedNorm check_gated_group_rms_norm_backward(const char* op, const Tensor& grad_y,
                                              const Tensor& x, const Tensor& gate,
                                              const std::optional<Tensor>& weight,
                                              int64_t group_size, const std::string& activation,
                                              bool transpose_out) {
  auto p = check_gated_group_rms_norm(op, x, gate, weight, group_size, activation,
                                      transpose_out);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  const auto want = gated_group_rms_norm_out_shape(x, transpose_out);
  FK_CHECK(sizes_vec(grad_y) == want, op, ": grad_y must have the output's shape ",
           ShapeText{want}, ", got ", shape_of(grad_y));
  return p;
}

Shape gated_group_rms_norm_out_shape(const Tensor& x, bool transpose_out) {
  if (!transpose_out) return sizes_vec(x);
  return {x.size(1), x.size(0), x.size(2) * x.size(3)};
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // y = round(weight * round(x_hat)) * act(gate) with x_hat = x * rsqrt(mean(x^2) + eps) over
  // each group of group_size consecutive elements of the last dim (Hugging Face
  // Qwen3NextRMSNormGated with its weight broadcast per group, "norm before gate"), act = silu
  // or sigmoid of the float32 gate, rounded once to x's dtype. weight (N,) or (group_size,),
  // or None. transpose_out: x (B, S, H, D) -> y (S, B, H * D).
  m.def("gated_group_rms_norm(Tensor x, Tensor gate, Tensor? weight, int group_size, "
        "float eps=1e-06, str activation='silu', bool transpose_out=False) -> Tensor");
  // (grad_x, grad_gate, grad_weight); grad_weight undefined without a weight or when
  // weight_grad is False.
  m.def("_gated_group_rms_norm_backward(Tensor grad_y, Tensor x, Tensor gate, Tensor? weight, "
        "int group_size, float eps, str activation, bool transpose_out, bool weight_grad) "
        "-> (Tensor, Tensor, Tensor)");
}
