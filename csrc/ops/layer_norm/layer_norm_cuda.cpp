// CUDA kernels of fk::layer_norm: AOT-compiled Triton (triton_src/layer_norm.py).
//
// Forward: rows up to the largest single-pass block go to layer_norm_fwd (the smallest block
// that holds a row), longer rows to layer_norm_fwd_looped. Backward: a persistent grid of
// PER_SM programs per multiprocessor, each over a contiguous range of rows, writing dx and
// fp32 partial dw / db rows; one reduction kernel sums the partials into dw and db.
// Non-contiguous inputs are copied once to contiguous memory.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/layer_norm/layer_norm.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;
using runtime::as_rows;
using runtime::flags_for;

std::tuple<Tensor, Tensor, Tensor> layer_norm_forward_cuda(Tensor x,
                                                           std::optional<Tensor> weight,
                                                           std::optional<Tensor> bias,
                                                           double eps) {
  constexpr const char* op = "fk::layer_norm";
  check_layer_norm(x, weight, bias);
  auto rows = as_rows(x);
  auto y = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto sizes = sizes_vec(x);
  const IntArrayRef stat_sizes(sizes.data(), sizes.size() - 1);
  auto mean = aten::empty(stat_sizes, kFloat, x.device());
  auto rstd = aten::empty(stat_sizes, kFloat, x.device());
  if (rows.n == 0) {  // statistics of empty rows are NaN, as on CPU
    aten::fill_(mean, std::numeric_limits<float>::quiet_NaN());
    aten::fill_(rstd, std::numeric_limits<float>::quiet_NaN());
  }
  if (rows.m == 0 || rows.n == 0) return {y, mean, rstd};
  // Unread stand-ins when there is no weight / bias (has_w / has_b are 0).
  Tensor w = has(weight) ? aten::contiguous(*weight) : rows.x2d;
  Tensor b = has(bias) ? aten::contiguous(*bias) : rows.x2d;
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &y, &w, &b, &mean, &rstd});

  static const auto& single = runtime::family("layer_norm_fwd");
  static const auto& looped = runtime::family("layer_norm_fwd_looped");
  const bool fits = rows.n <= single.max_block(rows.x2d);
  const auto& k = fits ? single.pick(op, rows.x2d, rows.n, flags)
                       : looped.pick(op, rows.x2d, 0, flags);
  const int64_t rows_per_program = fits ? k.constexpr_value("ROWS") : 1;
  KernelArgs args;
  args.ptr(rows.x2d).ptr(w).ptr(b).ptr(y).ptr(mean).ptr(rstd).i64(rows.n).i64(rows.n)
      .i64(rows.m).i32(rows.n).f32(eps).i32(has(weight) ? 1 : 0).i32(has(bias) ? 1 : 0);
  runtime::launch(op, k, x.device(), {checks::ceil_div(rows.m, rows_per_program), 1, 1}, args);
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_cuda(Tensor grad_y, Tensor x,
                                                            std::optional<Tensor> weight,
                                                            Tensor mean, Tensor rstd,
                                                            std::vector<bool> output_mask) {
  constexpr const char* op = "fk::_layer_norm_backward";
  check_layer_norm_backward(grad_y, x, weight, mean, rstd);
  const bool need_dx = output_mask[0], need_dw = output_mask[1], need_db = output_mask[2];
  auto rows = as_rows(x);
  Tensor dx, dw, db;
  if (need_dx) dx = aten::empty(x.sizes(), x.scalar_type(), x.device());
  if (need_dw) dw = aten::empty({rows.n}, x.scalar_type(), x.device());
  if (need_db) db = aten::empty({rows.n}, x.scalar_type(), x.device());
  if (rows.m == 0 || rows.n == 0) {  // no rows: the sums over rows are zero
    if (need_dw) aten::zero_(dw);
    if (need_db) aten::zero_(db);
    return {dx, dw, db};
  }
  if (!need_dx && !need_dw && !need_db) return {dx, dw, db};
  auto dy = aten::view(aten::contiguous(grad_y), {rows.m, rows.n});
  auto mean_c = aten::contiguous(mean), rstd_c = aten::contiguous(rstd);
  Tensor w = has(weight) ? aten::contiguous(*weight) : rows.x2d;  // unread when has_w == 0

  static const auto& single = runtime::family("layer_norm_bwd");
  static const auto& looped = runtime::family("layer_norm_bwd_looped");
  const bool fits = rows.n <= single.max_block(rows.x2d);
  // The fp32 partial rows allocated below start at multiples of N floats of a fresh
  // allocation, so they are 16-byte aligned whenever the aligned variant applies.
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &dy, &dx, &w, &mean_c, &rstd_c});
  const auto& k = fits ? single.pick(op, rows.x2d, rows.n, flags)
                       : looped.pick(op, rows.x2d, 0, flags);
  // Persistent grid: as many programs as fit on the device at once (PER_SM per
  // multiprocessor, see triton_src/layer_norm.py), each over a contiguous range of rows.
  const auto grid = runtime::persistent_grid(rows.m, x.device(), k.constexpr_value("PER_SM"));
  const int64_t n_partials = (need_dw ? 1 : 0) + (need_db ? 1 : 0);
  Tensor partial, dw_partial, db_partial;
  if (n_partials > 0) {
    partial = aten::empty({n_partials, grid.programs, rows.n}, kFloat, x.device());
    if (need_dw) dw_partial = aten::select(partial, 0, 0);
    if (need_db) db_partial = aten::select(partial, 0, n_partials - 1);
  }
  KernelArgs args;
  args.ptr(dy).ptr(rows.x2d).ptr(w).ptr(mean_c).ptr(rstd_c).ptr(dx).ptr(dw_partial)
      .ptr(db_partial).i64(rows.n).i64(rows.n).i64(rows.n).i64(rows.m).i32(rows.n)
      .i64(grid.rows_per_program).i32(has(weight) ? 1 : 0).i32(need_dx ? 1 : 0)
      .i32(need_dw ? 1 : 0).i32(need_db ? 1 : 0);
  runtime::launch(op, k, x.device(), {grid.programs, 1, 1}, args);
  if (n_partials > 0) {
    // One pass over the fp32 partial rows: grid axis 1 picks the partial slab; slab 0 goes
    // to the kernel's dw pointer, slab 1 to its db pointer.
    static const auto& reduce = runtime::family("layer_norm_dwdb");
    const auto& kr = reduce.pick(op, rows.x2d, 0, 0);
    const Tensor& first = need_dw ? dw : db;
    KernelArgs rargs;
    rargs.ptr(partial).ptr(first).ptr(db).i32(grid.programs).i32(rows.n);
    runtime::launch(op, kr, x.device(), {checks::ceil_div(rows.n, kr.block), n_partials, 1},
                    rargs);
  }
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_layer_norm_forward", TORCH_BOX(&fk::ops::layer_norm_forward_cuda));
  m.impl("_layer_norm_backward", TORCH_BOX(&fk::ops::layer_norm_backward_cuda));
}
