// CUDA kernels of fk::gated_group_rms_norm: AOT-compiled Triton
// (triton_src/gated_group_rms_norm.py). Forward: one program per tile of rows x one group.
// Backward: a persistent grid writing fp32 partial weight gradients that rms_norm's
// reduction sums. x and gate are read contiguous (copied first where they are not).
#include <algorithm>

#include "ops/gated_group_rms_norm/gated_group_rms_norm.h"
#include "ops/rms_norm/rms_norm_cuda.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// Sizes both kernels take after their pointers.
struct Launch {
  const runtime::KernelSpec* kern;
  int64_t m, b, s, h, tiles;
};

Launch prepare(const char* op, const runtime::KernelFamily& fam, const GatedNorm& p, const Tensor& x,
               bool transpose_out, std::initializer_list<const Tensor*> tensors) {
  FK_CHECK(p.g <= fam.max_block(x), op, ": group_size (", p.g, ") must be at most ",
           fam.max_block(x), " on CUDA");
  Launch l{};
  l.m = x.numel() / p.n;
  // The kernels index rows and tiles in int32 (element offsets are int64).
  FK_CHECK(l.m < (int64_t{1} << 31) - (int64_t{1} << 16), op, ": x has ", l.m,
           " rows of ", p.n, " elements; at most 2^31 - 2^16 - 1 are supported on CUDA");
  const bool aligned = runtime::aligned16(tensors) && p.n % 16 == 0 && p.g % 16 == 0;
  const uint32_t flags =
      aligned ? runtime::kFlagAligned | (l.m % 16 == 0 ? runtime::kFlagRows16 : 0) : 0;
  l.kern = &fam.pick(op, x, p.g, flags);
  l.b = transpose_out ? x.size(0) : 1;
  l.s = transpose_out ? x.size(1) : 1;
  l.h = transpose_out ? x.size(2) : 1;
  l.tiles = checks::ceil_div(l.m, l.kern->constexpr_value("BM")) * (p.n / p.g);
  return l;
}

Tensor gated_group_rms_norm_cuda(Tensor x, Tensor gate, std::optional<Tensor> weight,
                                 int64_t group_size, double eps, std::string activation,
                                 bool transpose_out) {
  constexpr const char* op = "fk::gated_group_rms_norm";
  const auto p = check_gated_group_rms_norm(op, x, gate, weight, group_size, activation,
                                            transpose_out);
  const auto shape = gated_group_rms_norm_out_shape(x, transpose_out);
  auto y = aten::empty(IntArrayRef(shape.data(), shape.size()), x.scalar_type(), x.device());
  if (x.numel() == 0) return y;
  const auto xc = aten::contiguous(x), gc = aten::contiguous(gate);
  const Tensor w = has(weight) ? aten::contiguous(*weight) : xc;  // unread without a weight
  static const auto& family_fwd = runtime::family("gated_group_rms_norm_fwd");
  const auto l = prepare(op, family_fwd, p, xc, transpose_out,
                         {&xc, &gc, &w, &y});
  KernelArgs args;
  args.ptr(xc).ptr(gc).ptr(w).ptr(y).i32(l.m).i32(p.n).i32(p.g).i32(l.b).i32(l.s).i32(l.h)
      .f32(eps).i32(has(weight) ? 1 : 0).i32(p.w_per_group ? 1 : 0).i32(p.sigmoid ? 1 : 0)
      .i32(transpose_out ? 1 : 0);
  runtime::launch(op, *l.kern, x.device(), {l.tiles, 1, 1}, args);
  return y;
}

std::tuple<Tensor, Tensor, Tensor> gated_group_rms_norm_backward_cuda(
    Tensor grad_y, Tensor x, Tensor gate, std::optional<Tensor> weight, int64_t group_size,
    double eps, std::string activation, bool transpose_out, bool weight_grad) {
  constexpr const char* op = "fk::_gated_group_rms_norm_backward";
  const auto p = check_gated_group_rms_norm_backward(op, grad_y, x, gate, weight, group_size,
                                                     activation, transpose_out);
  const bool has_w = has(weight);
  auto dx = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto dg = aten::empty(x.sizes(), x.scalar_type(), x.device());
  Tensor dw;
  if (x.numel() == 0) {
    if (has_w && weight_grad) dw = aten::zeros_like(*weight);
    return {dx, dg, dw};
  }
  const auto xc = aten::contiguous(x), gc = aten::contiguous(gate),
             dy = aten::contiguous(grad_y);
  const Tensor w = has_w ? aten::contiguous(*weight) : xc;
  static const auto& family_bwd = runtime::family("gated_group_rms_norm_bwd");
  const auto l = prepare(op, family_bwd, p, xc, transpose_out,
                         {&xc, &gc, &w, &dy, &dx, &dg});
  // A persistent grid of 16 warps per multiprocessor (8 programs of the 2-warp tiles: the
  // fastest in benchmarks/tune_gated_group_rms_norm.py), each over a stride of tiles; the
  // partial weight gradients exist whenever there is a weight (even if frozen).
  const int64_t programs =
      runtime::persistent_grid(l.tiles, x.device(), runtime::programs_per_sm(l.kern->num_warps))
          .programs;
  auto part = has_w ? aten::empty({programs, weight->numel()}, kFloat, x.device()) : Tensor();
  KernelArgs args;
  args.ptr(dy).ptr(xc).ptr(gc).ptr(w).ptr(dx).ptr(dg).ptr(has_w ? part : dx).i32(l.m).i32(p.n)
      .i32(p.g).i32(l.b).i32(l.s).i32(l.h).f32(eps).i32(has_w ? 1 : 0)
      .i32(p.w_per_group ? 1 : 0).i32(p.sigmoid ? 1 : 0).i32(transpose_out ? 1 : 0);
  runtime::launch(op, *l.kern, x.device(), {programs, 1, 1}, args);
  if (has_w && weight_grad) dw = rms_cuda::reduce_dw(op, part, *weight);
  return {dx, dg, dw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("gated_group_rms_norm", TORCH_BOX(&fk::ops::gated_group_rms_norm_cuda));
  m.impl("_gated_group_rms_norm_backward",
         TORCH_BOX(&fk::ops::gated_group_rms_norm_backward_cuda));
}
