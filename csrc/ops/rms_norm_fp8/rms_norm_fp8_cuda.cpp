// CUDA kernels of fk::rms_norm_fp8: AOT-compiled Triton (triton_src/rms_norm_fp8.py).
//
// Rows of at most the largest single-pass block: one pass over x (rms_norm_fp8_rows) writes
// rstd and, when asked, the row-wise copy and y; the column-wise copy (128-row blocks) then
// comes from a second read of x, one tile of 128 rows per program (rms_norm_fp8_tile, given
// rstd). Longer rows: rstd first (rms_norm_fp8_rstd), then the tile kernel writes every
// output asked for.
#include <cmath>

#include "ops/rms_norm_fp8/rms_norm_fp8.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using checks::ceil_div;
using runtime::KernelArgs;

using Out6 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// The tile kernel's form for the column-wise copy alone: its variant flag
// (triton_src/rms_norm_fp8.py, FLAG_COLS).
constexpr uint32_t kColsOnly = 2;

Out6 rms_norm_fp8_cuda(Tensor x, Tensor weight, double eps, std::string layout,
                       bool pow2_scales, bool return_norm) {
  constexpr const char* op = "fk::rms_norm_fp8";
  const auto want = check_rms_norm_fp8(x, weight, layout);
  auto rows = runtime::as_rows(x);
  const int64_t m = rows.m, k = rows.n;
  const int64_t nm = ceil_div(m, kFp8Block), nk = ceil_div(k, kFp8Block);
  const auto dev = x.device();
  Tensor q, s, qt, st, y;
  if (want.rowwise) {
    q = aten::empty({m, k}, kFloat8e4m3, dev);
    s = aten::empty({nk, m}, kFloat, dev);
  }
  if (want.columnwise) {
    qt = aten::empty({k, m}, kFloat8e4m3, dev);
    st = aten::empty({nm, k}, kFloat, dev);
  }
  if (return_norm) y = aten::empty(x.sizes(), x.scalar_type(), dev);
  // rstd of a row of no elements is NaN, as on CPU (the mean of nothing).
  auto rstd = k == 0 ? aten::full({m}, NAN, kFloat, dev) : aten::empty({m}, kFloat, dev);
  if (m == 0 || k == 0) return {q, s, qt, st, rstd, y};
  check_fp8_gpu(op, x);
  auto w = aten::contiguous(weight);
  // The aligned variants: K a multiple of 16 and x, w 16-byte aligned (the outputs are fresh
  // allocations); the tile kernel's column-wise stores also need M a multiple of 16.
  const uint32_t flags = runtime::flags_for(k, {&rows.x2d, &w});
  const uint32_t tile_flags = m % 16 == 0 ? flags : 0;
  // The pointers of an output not asked for are never written; any valid one will do.
  const Tensor& any = rstd;
  auto ptr = [&](const Tensor& t) -> const Tensor& { return t.defined() ? t : any; };

  static const auto& single = runtime::family("rms_norm_fp8_rows");
  static const auto& first = runtime::family("rms_norm_fp8_rstd");
  static const auto& tiles = runtime::family("rms_norm_fp8_tile");
  const bool fits = k <= single.max_block(rows.x2d);
  if (fits) {
    const auto& kern = single.pick(op, rows.x2d, k, flags);
    KernelArgs args;
    args.ptr(rows.x2d).ptr(w).ptr(ptr(q)).ptr(ptr(s)).ptr(ptr(y)).ptr(rstd).i64(m).i64(k)
        .f32(eps).i32(want.rowwise ? 1 : 0).i32(return_norm ? 1 : 0).i32(pow2_scales ? 1 : 0);
    runtime::launch(op, kern, dev, {ceil_div(m, kern.constexpr_value("ROWS")), 1, 1}, args);
    if (!want.columnwise) return {q, s, qt, st, rstd, y};
  } else {
    const auto& kern = first.pick(op, rows.x2d, 0, flags);
    KernelArgs args;
    args.ptr(rows.x2d).ptr(rstd).i64(m).i64(k).f32(eps);
    runtime::launch(op, kern, dev, {m, 1, 1}, args);
  }
  const bool row_here = want.rowwise && !fits, y_here = return_norm && !fits;
  // The column-wise copy alone: narrower tiles (kColsOnly), else 128 x 128; the width is the
  // picked variant's.
  const bool cols_only = !row_here && !y_here;
  const auto& kern =
      tiles.pick(op, rows.x2d, kFp8Block, tile_flags | (cols_only ? kColsOnly : 0u));
  const int64_t tile_k = kern.constexpr_value("TILE_K");
  const int64_t tiles_k = ceil_div(k, tile_k);
  // Tiles of columns run along the grid's y dimension (at most 65535 on CUDA).
  FK_CHECK(tiles_k <= 65535, op, ": x has ", k, " columns; the CUDA kernel takes at most ",
           65535 * tile_k, " here (65535 tiles of ", tile_k, ")");
  KernelArgs args;
  args.ptr(rows.x2d).ptr(w).ptr(rstd).ptr(ptr(q)).ptr(ptr(s)).ptr(ptr(qt)).ptr(ptr(st))
      .ptr(ptr(y)).i64(m).i64(k).i32(row_here ? 1 : 0).i32(want.columnwise ? 1 : 0)
      .i32(y_here ? 1 : 0).i32(pow2_scales ? 1 : 0);
  runtime::launch(op, kern, dev, {nm, tiles_k, 1}, args);
  return {q, s, qt, st, rstd, y};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("rms_norm_fp8", TORCH_BOX(&fk::ops::rms_norm_fp8_cuda));
}
