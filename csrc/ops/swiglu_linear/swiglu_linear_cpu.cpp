// CPU reference of fk::swiglu_linear in ATen operators (through the stable dispatcher):
// products accumulated in fp32 (fp64 for fp64 inputs), SiLU and the factors in that
// precision, each output rounded once to x's dtype. The backward's elementwise step likewise
// (da = dz * t, db = dz * s, one rounding); its products run through torch in the autograd
// formula, as on CUDA.
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu_linear/swiglu_linear.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// (rows, last dim) view of t; also for empty tensors, where -1 would be ambiguous.
Tensor rows(const Tensor& t) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) m *= t.size(d);
  return aten::reshape(t, {m, t.size(-1)});
}

// With multipliers gm, dm: u = gm a, z = silu(u) b dm, s = dm silu(u), t = gm dm b silu'(u).
std::tuple<Tensor, Tensor, Tensor> swiglu_linear_forward_cpu(Tensor x, Tensor w_gate,
                                                             Tensor w_up,
                                                             std::vector<bool> output_mask,
                                                             double gm, double dm) {
  check_swiglu_linear(x, w_gate, w_up);
  check_swiglu_multipliers("fk::swiglu_linear", gm, dm);
  const auto acc = checks::acc_type(x);
  const auto dtype = x.scalar_type();
  auto sizes = sizes_vec(x);
  sizes.back() = w_gate.size(0);
  auto xf = aten::to(rows(x), acc);
  auto a = aten::matmul(xf, aten::t(aten::to(w_gate, acc)));
  auto b = aten::matmul(xf, aten::t(aten::to(w_up, acc)));
  if (gm != 1.0) a = a * gm;
  auto sig = aten::sigmoid(a);
  auto silu = a * sig;
  auto dsilu = sig + silu * (1.0 - sig);
  if (dm != 1.0) silu = silu * dm;      // z and s carry dm
  if (gm * dm != 1.0) dsilu = dsilu * (gm * dm);  // t carries gm dm
  auto out = [&](const Tensor& v) {
    return aten::contiguous(aten::reshape(aten::to(v, dtype), sizes));
  };
  Tensor z, s, t;
  if (output_mask[0]) z = out(silu * b);
  if (output_mask[1]) {
    s = out(silu);
    t = out(b * dsilu);
  }
  return {z, s, t};
}

std::tuple<Tensor, Tensor> swiglu_linear_gate_grads_cpu(Tensor grad_out, Tensor t, Tensor s) {
  check_swiglu_linear_gate_grads(grad_out, t, s);
  const auto acc = checks::acc_type(t);
  auto dz = aten::to(grad_out, acc);
  return {aten::contiguous(aten::to(dz * aten::to(t, acc), t.scalar_type())),
          aten::contiguous(aten::to(dz * aten::to(s, acc), s.scalar_type()))};
}

void swiglu_linear_gate_grads_in_place_cpu(Tensor grad_out, Tensor t, Tensor s) {
  check_swiglu_linear_gate_grads_in_place(grad_out, t, s);
  const auto acc = checks::acc_type(t);
  auto dz = aten::to(grad_out, acc);
  auto da = dz * aten::to(t, acc);  // both products before either input is overwritten
  auto db = dz * aten::to(s, acc);
  aten::copy_(t, da);
  aten::copy_(s, db);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_swiglu_linear_forward", TORCH_BOX(&fk::ops::swiglu_linear_forward_cpu));
  m.impl("_swiglu_linear_gate_grads", TORCH_BOX(&fk::ops::swiglu_linear_gate_grads_cpu));
  m.impl("_swiglu_linear_gate_grads_",
         TORCH_BOX(&fk::ops::swiglu_linear_gate_grads_in_place_cpu));
}
