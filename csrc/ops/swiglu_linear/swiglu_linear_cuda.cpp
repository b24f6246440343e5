// CUDA kernels of fk::swiglu_linear: AOT-compiled Triton (triton_src/swiglu_linear.py).
//
// Forward: inputs are made contiguous (x as (M, K) rows, the weights as (N, K)); a copy is
// made only for inputs that are not. One launch writes z and / or the factors s, t. The
// backward's elementwise step is one launch over grad_out, t, s (the gated activations'
// launch helpers); its GEMMs run through torch (python/fk/ops/swiglu_linear.py).
#include <algorithm>

#include "ops/glu/glu_cuda.h"
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu_linear/swiglu_linear.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// Contiguous (rows, last dim) view of t (a copy only when t is not contiguous); the row
// count is the product of the leading dims, also when the last dim is 0.
Tensor as_rows(const Tensor& t) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) m *= t.size(d);
  return aten::view(aten::contiguous(t), {m, t.size(-1)});
}

// The aligned variants assume 16-byte aligned pointers and N, K multiples of 16 (every row
// of every operand then starts 16-byte aligned).
uint32_t flags_for(int64_t n, int64_t k, std::initializer_list<const Tensor*> tensors) {
  return (n % 16 == 0 && k % 16 == 0 && runtime::aligned16(tensors)) ? runtime::kFlagAligned
                                                                     : 0;
}

int64_t tiles(const runtime::KernelSpec& k, const char* rows_block, int64_t rows,
              const char* cols_block, int64_t cols) {
  return checks::ceil_div(rows, k.constexpr_value(rows_block)) *
         checks::ceil_div(cols, k.constexpr_value(cols_block));
}

constexpr uint32_t kFlagScaled = 2;  // triton_src/swiglu_linear.py FLAG_SCALED

std::tuple<Tensor, Tensor, Tensor> swiglu_linear_forward_cuda(Tensor x, Tensor w_gate,
                                                              Tensor w_up,
                                                              std::vector<bool> output_mask,
                                                              double gate_multiplier,
                                                              double down_multiplier) {
  constexpr const char* op = "fk::swiglu_linear";
  check_swiglu_linear(x, w_gate, w_up);
  check_swiglu_multipliers(op, gate_multiplier, down_multiplier);
  auto x2 = as_rows(x);
  auto wg = aten::contiguous(w_gate), wu = aten::contiguous(w_up);
  const int64_t m = x2.size(0), k = x2.size(1), n = wg.size(0);
  auto sizes = sizes_vec(x);
  sizes.back() = n;
  auto make = [&](bool want) {
    return want ? aten::empty(sizes, x.scalar_type(), x.device()) : Tensor();
  };
  Tensor z = make(output_mask[0]), s = make(output_mask[1]), t = make(output_mask[1]);
  if (m == 0 || n == 0 || !(output_mask[0] || output_mask[1])) return {z, s, t};
  if (k == 0) {  // a = b = 0, so z, s and t are zero; no launch (nor a TMA descriptor of width 0)
    for (const Tensor* out : {&z, &s, &t}) {
      if (out->defined()) aten::zero_(*out);
    }
    return {z, s, t};
  }

  static const auto& fam = runtime::family("swiglu_linear_fwd");
  // The SCALED variants only where a multiplier is not 1.
  const bool scaled = gate_multiplier != 1.0 || down_multiplier != 1.0;
  const auto& kern = fam.pick(op, x2, 0,
                              flags_for(n, k, {&x2, &wg, &wu, &z, &s, &t}) |
                                  (scaled ? kFlagScaled : 0));
  KernelArgs args;
  args.ptr(x2).ptr(wg).ptr(wu).ptr(z).ptr(s).ptr(t).i32(m).i32(n).i32(k)
      .i32(output_mask[0] ? 1 : 0).i32(output_mask[1] ? 1 : 0).f32(gate_multiplier)
      .f32(down_multiplier);
  // One program per tile, or a persistent grid of PER_SM programs per SM (at most one per
  // tile) walking the tiles.
  int64_t programs = tiles(kern, "BLOCK_M", m, "BLOCK_N", n);
  if (const int64_t per_sm = kern.constexpr_value("PER_SM"); per_sm > 0) {
    programs = std::min(programs, per_sm * runtime::device_sm_count(x.device().index()));
  }
  runtime::launch(op, kern, x.device(), {programs, 1, 1}, args);
  return {z, s, t};
}

const runtime::KernelFamily& gate_grads_kernels() {
  static const auto& fam = runtime::family("swiglu_linear_gate_grads");
  return fam;
}

std::tuple<Tensor, Tensor> swiglu_linear_gate_grads_cuda(Tensor grad_out, Tensor t, Tensor s) {
  check_swiglu_linear_gate_grads(grad_out, t, s);
  return glu::backward("fk::_swiglu_linear_gate_grads", gate_grads_kernels(), grad_out, t, s);
}

void swiglu_linear_gate_grads_in_place_cuda(Tensor grad_out, Tensor t, Tensor s) {
  check_swiglu_linear_gate_grads_in_place(grad_out, t, s);
  glu::backward_in_place("fk::_swiglu_linear_gate_grads_", gate_grads_kernels(), grad_out, t, s);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_swiglu_linear_forward", TORCH_BOX(&fk::ops::swiglu_linear_forward_cuda));
  m.impl("_swiglu_linear_gate_grads", TORCH_BOX(&fk::ops::swiglu_linear_gate_grads_cuda));
  m.impl("_swiglu_linear_gate_grads_",
         TORCH_BOX(&fk::ops::swiglu_linear_gate_grads_in_place_cuda));
}
