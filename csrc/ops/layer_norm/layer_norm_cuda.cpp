// CUDA kernels of fk::layer_norm: AOT-compiled Triton (triton_src/layer_norm.py).
//
// Forward: rows up to the largest single-pass block go to layer_norm_fwd (the smallest block
// that holds a row), longer rows to layer_norm_fwd_looped. Backward: a persistent grid of
// PER_SM programs per multiprocessor, each over a contiguous range of rows, writing dx and
// fp32 partial dw / db rows; one reduction kernel sums the partials into dw and db.
// Non-contiguous inputs are copied once to contiguous memory.
#include <ATen/ATen.h>
#include <torch/library.h>

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

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_cuda(
    const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps) {
  constexpr const char* op = "fk::layer_norm";
  check_layer_norm(x, weight, bias);
  auto rows = as_rows(x);
  auto y = at::empty(x.sizes(), x.options());
  auto sizes = x.sizes().slice(0, x.dim() - 1);
  auto mean = at::empty(sizes, x.options().dtype(at::kFloat));
  auto rstd = at::empty(sizes, x.options().dtype(at::kFloat));
  if (rows.n == 0) {  // statistics of empty rows are NaN, as on CPU
    mean.fill_(std::numeric_limits<float>::quiet_NaN());
    rstd.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  if (rows.m == 0 || rows.n == 0) return {y, mean, rstd};
  // Unread stand-ins when there is no weight / bias (has_w / has_b are 0).
  at::Tensor w = has(weight) ? weight->contiguous() : rows.x2d;
  at::Tensor b = has(bias) ? bias->contiguous() : rows.x2d;
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd, std::array<bool, 3> output_mask) {
  constexpr const char* op = "fk::_layer_norm_backward";
  check_layer_norm_backward(grad_y, x, weight, mean, rstd);
  const auto [need_dx, need_dw, need_db] = output_mask;
  auto rows = as_rows(x);
  at::Tensor dx, dw, db;
  if (need_dx) dx = at::empty(x.sizes(), x.options());
  if (need_dw) dw = at::empty({rows.n}, x.options());
  if (need_db) db = at::empty({rows.n}, x.options());
  if (rows.m == 0 || rows.n == 0) {  // no rows: the sums over rows are zero
    if (need_dw) dw.zero_();
    if (need_db) db.zero_();
    return {dx, dw, db};
  }
  if (!need_dx && !need_dw && !need_db) return {dx, dw, db};
  auto dy = grad_y.contiguous().view({rows.m, rows.n});
  auto mean_c = mean.contiguous(), rstd_c = rstd.contiguous();
  at::Tensor w = has(weight) ? weight->contiguous() : rows.x2d;  // unread when has_w == 0

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
  at::Tensor partial, dw_partial, db_partial;
  if (n_partials > 0) {
    partial = at::empty({n_partials, grid.programs, rows.n}, x.options().dtype(at::kFloat));
    if (need_dw) dw_partial = partial[0];
    if (need_db) db_partial = partial[n_partials - 1];
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
    const at::Tensor& first = need_dw ? dw : db;
    KernelArgs rargs;
    rargs.ptr(partial).ptr(first).ptr(db).i32(grid.programs).i32(rows.n);
    runtime::launch(op, kr, x.device(), {checks::ceil_div(rows.n, kr.block), n_partials, 1},
                    rargs);
  }
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_layer_norm_forward", fk::ops::layer_norm_forward_cuda);
  m.impl("_layer_norm_backward", fk::ops::layer_norm_backward_cuda);
}
