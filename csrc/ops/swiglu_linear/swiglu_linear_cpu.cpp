// CPU reference of fk::swiglu_linear in plain ATen: products accumulated in fp32 (fp64 for
// fp64 inputs), SiLU and the factors in that precision, each output rounded once to x's
// dtype. The backward's elementwise step likewise (da = dz * t, db = dz * s, one rounding);
// its products run through ATen in the autograd kernel, as on CUDA.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/swiglu_linear/swiglu_linear.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// (rows, last dim) view of t; also for empty tensors, where -1 would be ambiguous.
at::Tensor rows(const at::Tensor& t) {
  return t.reshape({c10::multiply_integers(t.sizes().slice(0, t.dim() - 1)), t.size(-1)});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_linear_forward_cpu(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
    std::array<bool, 2> output_mask) {
  check_swiglu_linear(x, w_gate, w_up);
  const auto acc = checks::acc_type(x);
  const auto dtype = x.scalar_type();
  auto sizes = x.sizes().vec();
  sizes.back() = w_gate.size(0);
  auto xf = rows(x).to(acc);
  auto a = at::matmul(xf, w_gate.to(acc).t());
  auto b = at::matmul(xf, w_up.to(acc).t());
  auto sig = at::sigmoid(a);
  auto silu = a * sig;
  at::Tensor z, s, t;
  if (output_mask[0]) z = (silu * b).to(dtype).reshape(sizes).contiguous();
  if (output_mask[1]) {
    s = silu.to(dtype).reshape(sizes).contiguous();
    t = (b * (sig + silu * (1 - sig))).to(dtype).reshape(sizes).contiguous();
  }
  return {z, s, t};
}

std::tuple<at::Tensor, at::Tensor> swiglu_linear_gate_grads_cpu(const at::Tensor& grad_out,
                                                                 const at::Tensor& t,
                                                                 const at::Tensor& s) {
  check_swiglu_linear_gate_grads(grad_out, t, s);
  const auto acc = checks::acc_type(t);
  auto dz = grad_out.to(acc);
  return {(dz * t.to(acc)).to(t.scalar_type()).contiguous(),
          (dz * s.to(acc)).to(s.scalar_type()).contiguous()};
}

void swiglu_linear_gate_grads_in_place_cpu(const at::Tensor& grad_out, at::Tensor& t,
                                           at::Tensor& s) {
  check_swiglu_linear_gate_grads_in_place(grad_out, t, s);
  const auto acc = checks::acc_type(t);
  auto dz = grad_out.to(acc);
  auto da = dz * t.to(acc);  // both products before either input is overwritten
  auto db = dz * s.to(acc);
  t.copy_(da);
  s.copy_(db);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_swiglu_linear_forward", fk::ops::swiglu_linear_forward_cpu);
  m.impl("_swiglu_linear_gate_grads", fk::ops::swiglu_linear_gate_grads_cpu);
  m.impl("_swiglu_linear_gate_grads_", fk::ops::swiglu_linear_gate_grads_in_place_cpu);
}
