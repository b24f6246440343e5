// CUDA kernels of fk::fused_add_rms_norm: AOT-compiled Triton (triton_src/fused_add_rms_norm.py).
//
// Forward: one pass reads x, residual and the weight and writes residual_out, y and rstd;
// rows longer than the largest single-pass block go to the looped kernel. Backward: a
// persistent grid, each program over a range of rows, reads grad_y, grad_residual_out (when
// given), residual_out and rstd, writes grad_x and fp32 partial weight gradients, which
// rms_norm's reduction kernel sums (ops/rms_norm/rms_norm_cuda.h); views, flags and grid
// are runtime/rows.h.
#include <algorithm>

#include "ops/fused_add_rms_norm/fused_add_rms_norm.h"
#include "ops/rms_norm/rms_norm_cuda.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;
using runtime::as_rows;
using runtime::flags_for;
using runtime::persistent_grid;
using runtime::programs_per_sm;
using rms_cuda::reduce_dw;

std::tuple<Tensor, Tensor, Tensor> fused_add_rms_norm_forward_cuda(
    Tensor x, Tensor residual, std::optional<Tensor> weight, double eps, double offset,
    std::string casting_mode) {
  constexpr const char* op = "fk::fused_add_rms_norm";
  const auto casting = check_fused_add_rms_norm(x, residual, weight, casting_mode);
  const bool has_w = has(weight);
  auto xr = as_rows(x);
  auto rr = as_rows(residual);
  auto y = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto residual_out = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto sizes = sizes_vec(x);
  auto rstd = aten::empty(IntArrayRef(sizes.data(), sizes.size() - 1), kFloat, x.device());
  if (xr.m == 0 || xr.n == 0) return {y, residual_out, rstd};
  Tensor w = has_w ? aten::contiguous(*weight) : xr.x2d;  // unread when has_w == 0
  const uint32_t flags = flags_for(xr.n, {&xr.x2d, &rr.x2d, &y, &residual_out, &w});

  static const auto& single = runtime::family("fused_add_rms_norm_fwd");
  static const auto& looped = runtime::family("fused_add_rms_norm_fwd_looped");
  const bool fits = xr.n <= single.max_block(xr.x2d);
  const auto& k = fits ? single.pick(op, xr.x2d, xr.n, flags) : looped.pick(op, xr.x2d, 0, flags);
  const int64_t rows_per_program = fits ? k.constexpr_value("ROWS") : 1;
  KernelArgs args;
  args.ptr(xr.x2d).ptr(rr.x2d).ptr(w).ptr(y).ptr(residual_out).ptr(rstd).i64(xr.m).i32(xr.n)
      .f32(eps).f32(has_w ? offset : 1.0).i32(has_w ? 1 : 0).i32(static_cast<int>(casting));
  runtime::launch(op, k, x.device(), {checks::ceil_div(xr.m, rows_per_program), 1, 1}, args);
  return {y, residual_out, rstd};
}

std::tuple<Tensor, Tensor> fused_add_rms_norm_backward_cuda(
    Tensor grad_y, std::optional<Tensor> grad_residual_out, Tensor residual_out,
    std::optional<Tensor> weight, Tensor rstd, double offset, std::string casting_mode,
    std::vector<bool> output_mask) {
  constexpr const char* op = "fk::_fused_add_rms_norm_backward";
  const auto casting = check_fused_add_rms_norm_backward(grad_y, grad_residual_out, residual_out,
                                                         weight, rstd, casting_mode);
  FK_CHECK(rstd.scalar_type() == kFloat, op, ": rstd must be float32 on CUDA");
  const bool has_w = has(weight);
  const bool has_ds = has(grad_residual_out);
  const bool want_dx = output_mask[0];
  const bool want_dw = output_mask[1] && has_w;
  auto rows = as_rows(residual_out);
  Tensor dx, dw;
  if (want_dx) dx = aten::empty(residual_out.sizes(), residual_out.scalar_type(),
                                residual_out.device());
  if (rows.m == 0 || rows.n == 0) {
    if (want_dw) dw = aten::zeros_like(*weight);
    return {dx, dw};
  }
  if (!want_dx && !want_dw) return {dx, dw};
  auto dy = aten::view(aten::contiguous(grad_y), {rows.m, rows.n});
  auto ds = has_ds ? aten::view(aten::contiguous(*grad_residual_out), {rows.m, rows.n})
                   : rows.x2d;
  auto rstd_c = aten::contiguous(rstd);
  Tensor w = has_w ? aten::contiguous(*weight) : rows.x2d;  // unread when has_w == 0

  static const auto& single = runtime::family("fused_add_rms_norm_bwd");
  static const auto& looped = runtime::family("fused_add_rms_norm_bwd_looped");
  const bool fits = rows.n <= single.max_block(rows.x2d);
  // dw_partial, allocated below, is aligned like every fresh allocation.
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &dy, &ds, &dx, &w});
  const auto& k = fits ? single.pick(op, rows.x2d, rows.n, flags)
                       : looped.pick(op, rows.x2d, 0, flags);
  // 16 warps of work per multiprocessor: 2 programs of 8 warps (as rms_norm, fastest on
  // H200), 1 of 16, 4 of 4. The variants are built to keep them all resident (at most 128
  // registers per thread, triton_src/fused_add_rms_norm.py).
  const auto grid = persistent_grid(rows.m, residual_out.device(), programs_per_sm(k.num_warps));
  auto dw_partial =
      want_dw ? aten::empty({grid.programs, rows.n}, kFloat, residual_out.device()) : Tensor();
  KernelArgs args;
  args.ptr(dy).ptr(ds).ptr(rows.x2d).ptr(w).ptr(rstd_c).ptr(dx).ptr(dw_partial).i64(rows.m)
      .i32(rows.n).f32(has_w ? offset : 1.0).i64(grid.rows_per_program).i32(has_w ? 1 : 0)
      .i32(has_ds ? 1 : 0).i32(want_dx ? 1 : 0).i32(want_dw ? 1 : 0)
      .i32(static_cast<int>(casting));
  runtime::launch(op, k, residual_out.device(), {grid.programs, 1, 1}, args);
  if (want_dw) dw = reduce_dw(op, dw_partial, *weight);
  return {dx, dw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_fused_add_rms_norm_forward", TORCH_BOX(&fk::ops::fused_add_rms_norm_forward_cuda));
  m.impl("_fused_add_rms_norm_backward", TORCH_BOX(&fk::ops::fused_add_rms_norm_backward_cuda));
}
