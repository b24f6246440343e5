// CUDA kernels of fk::dyt: AOT-compiled Triton (triton_src/dyt.py).
//
// Forward: one launch over (ROWS, BLOCK_N) tiles, x read once and y written once. Backward:
// a grid of (row ranges, column blocks) programs writing dx and fp32 partial parameter
// gradients, then one small reduction launch writing dalpha, dgamma and dbeta.
#include <algorithm>

#include "ops/dyt/dyt.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;
using runtime::as_rows;
using runtime::flags_for;

constexpr uint32_t kFlagParamsX = 2;  // triton_src/dyt.py FLAG_PARAMS_X
constexpr int64_t kLargestBlock = 4096;  // the largest dyt_fwd / dyt_bwd block

uint32_t param_flag(const Tensor& x, const Tensor& alpha) {
  return alpha.scalar_type() == kFloat ? 0 : (x.scalar_type() == kFloat ? 0 : kFlagParamsX);
}

Tensor dyt_cuda(Tensor x, Tensor alpha, Tensor gamma, std::optional<Tensor> beta) {
  constexpr const char* op = "fk::dyt";
  check_dyt(x, alpha, gamma, beta);
  auto rows = as_rows(x);
  auto y = aten::empty(x.sizes(), x.scalar_type(), x.device());
  if (rows.m == 0 || rows.n == 0) return y;
  auto a = aten::contiguous(alpha), g = aten::contiguous(gamma);
  Tensor b = has(beta) ? aten::contiguous(*beta) : g;  // unread when has_beta == 0
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &y, &a, &g, &b}) | param_flag(x, alpha);
  static const auto& fwd = runtime::family("dyt_fwd");
  const auto& k = fwd.pick(op, rows.x2d, std::min(rows.n, kLargestBlock), flags);
  const int64_t tile_rows = k.constexpr_value("ROWS");
  KernelArgs args;
  args.ptr(rows.x2d).ptr(a).ptr(g).ptr(b).ptr(y).i64(rows.m).i32(rows.n)
      .i32(has(beta) ? 1 : 0);
  runtime::launch(op, k, x.device(),
                  {checks::ceil_div(rows.m, tile_rows), checks::ceil_div(rows.n, k.block), 1},
                  args);
  return y;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> dyt_backward_cuda(Tensor grad_y, Tensor x,
                                                             Tensor alpha, Tensor gamma,
                                                             std::optional<Tensor> beta,
                                                             std::vector<bool> output_mask) {
  constexpr const char* op = "fk::_dyt_backward";
  check_dyt_backward(grad_y, x, alpha, gamma, beta);
  const bool has_beta = has(beta);
  auto rows = as_rows(x);
  auto dy = aten::view(aten::contiguous(grad_y), {rows.m, rows.n});
  auto dx = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto da = aten::empty(alpha.sizes(), alpha.scalar_type(), x.device());
  auto dg = aten::empty({rows.n}, gamma.scalar_type(), x.device());
  auto db = has_beta ? aten::empty({rows.n}, gamma.scalar_type(), x.device()) : Tensor();
  auto result = [&]() -> std::tuple<Tensor, Tensor, Tensor, Tensor> {
    return {output_mask[0] ? dx : Tensor(), output_mask[1] ? da : Tensor(),
            output_mask[2] ? dg : Tensor(), output_mask[3] ? db : Tensor()};
  };
  if (rows.m == 0 || rows.n == 0) {
    aten::zero_(da);
    aten::zero_(dg);
    if (has_beta) aten::zero_(db);
    return result();
  }
  auto a = aten::contiguous(alpha), g = aten::contiguous(gamma);

  static const auto& bwd = runtime::family("dyt_bwd");
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &dy, &dx, &a, &g}) | param_flag(x, alpha);
  const auto& k = bwd.pick(op, rows.x2d, std::min(rows.n, kLargestBlock), flags);
  const int64_t tile_rows = k.constexpr_value("ROWS");
  const int64_t col_blocks = checks::ceil_div(rows.n, k.block);
  // A few programs per multiprocessor in all, each over a contiguous range of rows (a
  // multiple of the tile's rows) of one column block: two for the blocks of 2048 columns and
  // more (fewer partial rows to reduce; benchmarks/tune_dyt.py), else four.
  const int64_t sms = runtime::device_sm_count(x.device().index());
  const int64_t per_sm = k.block >= 2048 ? 2 : 4;
  const int64_t tiles = checks::ceil_div(rows.m, tile_rows);
  const int64_t want = std::max<int64_t>(1, checks::ceil_div(per_sm * sms, col_blocks));
  const int64_t rows_per_program = checks::ceil_div(tiles, std::min(tiles, want)) * tile_rows;
  const int64_t programs = checks::ceil_div(rows.m, rows_per_program);
  auto partial = aten::empty({programs, 2 * rows.n + col_blocks}, kFloat, x.device());
  KernelArgs args;
  args.ptr(dy).ptr(rows.x2d).ptr(a).ptr(g).ptr(dx).ptr(partial).i64(rows.m).i32(rows.n)
      .i64(rows_per_program).i32(col_blocks);
  runtime::launch(op, k, x.device(), {programs, col_blocks, 1}, args);

  static const auto& reduce = runtime::family("dyt_reduce");
  const auto& r = reduce.pick(op, dg, 0, 0);
  KernelArgs rargs;
  rargs.ptr(partial).ptr(da).ptr(dg).ptr(has_beta ? db : dg).i32(programs).i32(rows.n)
      .i32(col_blocks).i32(has_beta ? 1 : 0);
  runtime::launch(op, r, x.device(), {checks::ceil_div(rows.n, r.block) + 1, 1, 1}, rargs);
  return result();
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("dyt", TORCH_BOX(&fk::ops::dyt_cuda));
  m.impl("_dyt_backward", TORCH_BOX(&fk::ops::dyt_backward_cuda));
}
