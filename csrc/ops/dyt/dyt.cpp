// Schemas of fk::dyt and its backward, and the checks every backend shares.
// Fake kernels and the autograd formula: python/fk/ops/dyt.py.
#include "ops/dyt/dyt.h"

#include "runtime/checks.h"

namespace fk::ops {

namespace {

void check_param(const char* op, const char* name, const Tensor& p, const Tensor& x) {
  checks::check_same_device(op, name, p, "x", x);
  checks::check_float(op, name, p);
}

}  // namespace

void check_dyt(const Tensor& x, const Tensor& alpha, const Tensor& gamma,
               const std::optional<Tensor>& beta, const char* op) {
  FK_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_float(op, "x", x);
  check_param(op, "alpha", alpha, x);
  FK_CHECK(alpha.numel() == 1 && alpha.dim() <= 1, op,
           ": alpha must have shape (1,) (one element), got ", shape_of(alpha));
  check_param(op, "gamma", gamma, x);
  checks::check_same_dtype(op, "alpha", alpha, "gamma", gamma);
  FK_CHECK(gamma.dim() == 1 && gamma.size(0) == x.size(-1), op, ": gamma must have shape (",
           x.size(-1), ",) to match the last dim of x, got ", shape_of(gamma));
  if (has(beta)) {
    check_param(op, "beta", *beta, x);
    checks::check_same_dtype(op, "gamma", gamma, "beta", *beta);
    FK_CHECK(beta->dim() == 1 && beta->size(0) == x.size(-1), op, ": beta must have shape (",
             x.size(-1), ",) to match the last dim of x, got ", shape_of(*beta));
  }
  const auto pt = alpha.scalar_type();
  FK_CHECK(pt == kFloat || pt == x.scalar_type(), op,
           ": alpha, gamma and beta must be float32 or x's dtype (", x.scalar_type(), "), got ",
           pt);
}

void check_dyt_backward(const Tensor& grad_y, const Tensor& x, const Tensor& alpha,
                        const Tensor& gamma, const std::optional<Tensor>& beta) {
  constexpr const char* op = "fk::_dyt_backward";
  check_dyt(x, alpha, gamma, beta);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  checks::check_same_shape(op, "grad_y", grad_y, "x", x);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // y = gamma * tanh(alpha * x) + beta over the last dim of x, in fp32, rounded once to x's
  // dtype. alpha: one element; gamma, beta: (x.size(-1),); beta may be None (then 0). The
  // parameters share one dtype, float32 or x's.
  m.def("dyt(Tensor x, Tensor alpha, Tensor gamma, Tensor? beta=None) -> Tensor");
  // (grad_x, grad_alpha, grad_gamma, grad_beta), each parameter's gradient in its dtype and
  // shape, summed in fp32; an output whose output_mask entry is False (or grad_beta without
  // beta) is undefined.
  m.def("_dyt_backward(Tensor grad_y, Tensor x, Tensor alpha, Tensor gamma, Tensor? beta, "
        "bool[4] output_mask) -> (Tensor, Tensor, Tensor, Tensor)");
}
