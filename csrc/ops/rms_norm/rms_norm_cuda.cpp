// CUDA kernels of fk::rms_norm: AOT-compiled Triton (triton_src/rms_norm.py).
//
// Forward: rows up to the largest single-pass block go to rms_norm_fwd (the smallest block
// that holds a row), longer rows to rms_norm_fwd_looped. Backward: a persistent grid of
// programs, each over a range of rows, writing fp32 partial weight gradients that one
// reduction sums.
#include <algorithm>

#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm/rms_norm_cuda.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {

namespace rms_cuda {

// Matches triton_src/rms_norm.py: the dw reduction's variant of taller steps, taken from
// this many partial rows on (benchmarks/NOTES.md v27).
constexpr uint32_t kFlagDwTall = 2;
constexpr int64_t kDwTallRows = 1024;

namespace {

// Column sums of the fp32 (P, N) partials: columns below n1 into dw, the others into dw2
// (dw itself when n1 == N). From kDwTallRows rows in fewer, taller steps.
void launch_dw(const char* op, const Tensor& partial, const Tensor& dw, const Tensor& dw2,
               int64_t n1) {
  static const auto& reduce = runtime::family("rms_norm_dw");
  const int64_t n = partial.size(1);
  const auto& k = reduce.pick(op, dw, 0, partial.size(0) >= kDwTallRows ? kFlagDwTall : 0);
  runtime::KernelArgs args;
  args.ptr(partial).ptr(dw).ptr(dw2).i32(partial.size(0)).i32(n).i32(n1);
  runtime::launch(op, k, dw.device(), {checks::ceil_div(n, k.block), 1, 1}, args);
}

}  // namespace

Tensor reduce_dw(const char* op, const Tensor& partial, const Tensor& weight) {
  auto dw = aten::empty({partial.size(1)}, weight.scalar_type(), weight.device());
  launch_dw(op, partial, dw, dw, partial.size(1));
  return dw;
}

std::pair<Tensor, Tensor> reduce_dw2(const char* op, const Tensor& partial, int64_t n1,
                                     const Tensor& weight) {
  auto dw1 = aten::empty({n1}, weight.scalar_type(), weight.device());
  auto dw2 = aten::empty({partial.size(1) - n1}, weight.scalar_type(), weight.device());
  launch_dw(op, partial, dw1, dw2, n1);
  return {dw1, dw2};
}

}  // namespace rms_cuda

namespace {

using runtime::KernelArgs;
using runtime::as_rows;
using runtime::flags_for;
using runtime::persistent_grid;
using rms_cuda::reduce_dw;

std::tuple<Tensor, Tensor> rms_norm_forward_cuda(Tensor x, std::optional<Tensor> weight,
                                                 double eps, double offset,
                                                 std::string casting_mode) {
  constexpr const char* op = "fk::rms_norm";
  const auto casting = check_rms_norm(x, weight, casting_mode);
  const bool has_w = has(weight);
  auto rows = as_rows(x);
  auto y = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto sizes = sizes_vec(x);
  auto rstd = aten::empty(IntArrayRef(sizes.data(), sizes.size() - 1), kFloat, x.device());
  if (rows.m == 0 || rows.n == 0) return {y, rstd};
  Tensor w = has_w ? aten::contiguous(*weight) : rows.x2d;  // unread when has_w == 0
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &y, &w});

  static const auto& single = runtime::family("rms_norm_fwd");
  static const auto& looped = runtime::family("rms_norm_fwd_looped");
  const bool fits = rows.n <= single.max_block(rows.x2d);
  const auto& k = fits ? single.pick(op, rows.x2d, rows.n, flags)
                       : looped.pick(op, rows.x2d, 0, flags);
  const int64_t rows_per_program = fits ? k.constexpr_value("ROWS") : 1;
  KernelArgs args;
  args.ptr(rows.x2d).ptr(w).ptr(y).ptr(rstd).i64(rows.n).i64(rows.n).i64(rows.m).i32(rows.n)
      .f32(eps).f32(has_w ? offset : 1.0).i32(has_w ? 1 : 0).i32(static_cast<int>(casting));
  runtime::launch(op, k, x.device(), {checks::ceil_div(rows.m, rows_per_program), 1, 1}, args);
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_backward_cuda(Tensor grad_y, Tensor x,
                                                  std::optional<Tensor> weight, Tensor rstd,
                                                  double offset, std::string casting_mode,
                                                  std::vector<bool> output_mask) {
  constexpr const char* op = "fk::_rms_norm_backward";
  const auto casting = check_rms_norm_backward(grad_y, x, weight, rstd, casting_mode);
  FK_CHECK(rstd.scalar_type() == kFloat, op, ": rstd must be float32 on CUDA");
  const bool has_w = has(weight);
  auto rows = as_rows(x);
  auto dy = aten::view(aten::contiguous(grad_y), {rows.m, rows.n});
  auto rstd_c = aten::contiguous(rstd);
  auto dx = aten::empty(x.sizes(), x.scalar_type(), x.device());
  Tensor dw;
  const bool want_dw = output_mask[1] && has_w;
  if (rows.m == 0 || rows.n == 0) {
    if (want_dw) dw = aten::zeros_like(*weight);
    return {dx, dw};
  }
  Tensor w = has_w ? aten::contiguous(*weight) : rows.x2d;

  static const auto& single = runtime::family("rms_norm_bwd");
  static const auto& looped = runtime::family("rms_norm_bwd_looped");
  const bool fits = rows.n <= single.max_block(rows.x2d);
  // Persistent grid: two programs per multiprocessor (fastest on H200 at Llama shapes,
  // benchmarks/NOTES.md), each over a contiguous range of rows.
  const auto grid = persistent_grid(rows.m, x.device(), 2);
  // The kernels write partial weight gradients whenever there is a weight (has_w), so the
  // buffer exists then even if dw is not wanted (a frozen weight).
  auto dw_partial =
      has_w ? aten::empty({grid.programs, rows.n}, kFloat, x.device()) : Tensor();
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &dy, &dx, &w, &dw_partial});
  const auto& k = fits ? single.pick(op, rows.x2d, rows.n, flags)
                       : looped.pick(op, rows.x2d, 0, flags);
  KernelArgs args;
  args.ptr(dy).ptr(rows.x2d).ptr(w).ptr(rstd_c).ptr(dx).ptr(dw_partial)
      .i64(rows.n).i64(rows.n).i64(rows.n).i64(rows.m).i32(rows.n)
      .f32(has_w ? offset : 1.0).i64(grid.rows_per_program).i32(has_w ? 1 : 0)
      .i32(static_cast<int>(casting));
  runtime::launch(op, k, x.device(), {grid.programs, 1, 1}, args);
  if (want_dw) dw = reduce_dw(op, dw_partial, *weight);
  return {dx, dw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_rms_norm_forward", TORCH_BOX(&fk::ops::rms_norm_forward_cuda));
  m.impl("_rms_norm_backward", TORCH_BOX(&fk::ops::rms_norm_backward_cuda));
}
