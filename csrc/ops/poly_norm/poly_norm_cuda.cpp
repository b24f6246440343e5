// CUDA kernels of fk::poly_norm: AOT-compiled Triton (triton_src/poly_norm.py).
//
// Forward: one pass per row (the smallest single-pass block that holds it), x read once, y
// written once, three fp32 rstd values per row kept for the backward. Backward: a persistent
// grid, each program over a range of rows (x and dy read once, dx written once), writing
// fp32 partial (dw0, dw1, dw2, db); one small launch sums them.
#include <algorithm>

#include "ops/poly_norm/poly_norm.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;
using runtime::as_rows;
using runtime::flags_for;
using runtime::persistent_grid;

constexpr uint32_t kFlagParamsX = 2;  // triton_src/poly_norm.py FLAG_PARAMS_X

uint32_t param_flag(const Tensor& weight) {
  return weight.scalar_type() == kFloat ? 0 : kFlagParamsX;
}

void check_width(const char* op, const runtime::KernelFamily& fam, const Tensor& x2d,
                 int64_t n) {
  const int64_t most = fam.max_block(x2d);
  FK_CHECK(n <= most, op, ": the last dim of x is ", n, ", more than the ", most,
           " columns the CUDA kernels hold in one pass");
}

std::tuple<Tensor, Tensor> poly_norm_forward_cuda(Tensor x, Tensor weight, Tensor bias,
                                                  double eps) {
  constexpr const char* op = "fk::poly_norm";
  check_poly_norm(x, weight, bias);
  auto rows = as_rows(x);
  auto y = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto sizes = sizes_vec(x);
  sizes.back() = 3;
  auto rstd = aten::empty(IntArrayRef(sizes.data(), sizes.size()), kFloat, x.device());
  if (rows.m == 0 || rows.n == 0) return {y, rstd};
  static const auto& fwd = runtime::family("poly_norm_fwd");
  check_width(op, fwd, rows.x2d, rows.n);
  auto w = aten::contiguous(weight), b = aten::contiguous(bias);
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &y, &rstd}) | param_flag(weight);
  const auto& k = fwd.pick(op, rows.x2d, rows.n, flags);
  const int64_t tile_rows = k.constexpr_value("ROWS");
  KernelArgs args;
  args.ptr(rows.x2d).ptr(w).ptr(b).ptr(y).ptr(rstd).i64(rows.m).i32(rows.n).f32(eps);
  runtime::launch(op, k, x.device(), {checks::ceil_div(rows.m, tile_rows), 1, 1}, args);
  return {y, rstd};
}

std::tuple<Tensor, Tensor, Tensor> poly_norm_backward_cuda(Tensor grad_y, Tensor x,
                                                           Tensor weight, Tensor bias,
                                                           Tensor rstd,
                                                           std::vector<bool> output_mask) {
  constexpr const char* op = "fk::_poly_norm_backward";
  check_poly_norm_backward(grad_y, x, weight, bias, rstd);
  FK_CHECK(rstd.scalar_type() == kFloat, op, ": rstd must be float32 on CUDA");
  auto rows = as_rows(x);
  auto dx = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto dw = aten::empty({3}, weight.scalar_type(), x.device());
  auto db = aten::empty(bias.sizes(), bias.scalar_type(), x.device());
  auto result = [&]() -> std::tuple<Tensor, Tensor, Tensor> {
    return {output_mask[0] ? dx : Tensor(), output_mask[1] ? dw : Tensor(),
            output_mask[2] ? db : Tensor()};
  };
  if (rows.m == 0 || rows.n == 0) {
    aten::zero_(dw);
    aten::zero_(db);
    return result();
  }
  static const auto& bwd = runtime::family("poly_norm_bwd");
  check_width(op, bwd, rows.x2d, rows.n);
  auto dy = aten::view(aten::contiguous(grad_y), {rows.m, rows.n});
  auto rstd_c = aten::contiguous(rstd);
  auto w = aten::contiguous(weight);
  // (The partial sums are a new allocation, always aligned: they do not enter the flags.)
  const uint32_t flags = flags_for(rows.n, {&rows.x2d, &dy, &dx, &rstd_c}) | param_flag(weight);
  const auto& k = bwd.pick(op, rows.x2d, rows.n, flags);
  // A persistent grid, each program over a contiguous range of rows (as rms_norm): two
  // programs per multiprocessor, sixteen for the 4096 bucket (4 warps; measured with
  // benchmarks/tune_poly_norm.py).
  const auto grid = persistent_grid(rows.m, x.device(), k.block == 4096 ? 16 : 2);
  auto partial = aten::empty({grid.programs, 4}, kFloat, x.device());
  KernelArgs args;
  args.ptr(dy).ptr(rows.x2d).ptr(w).ptr(rstd_c).ptr(dx).ptr(partial).i64(rows.m).i32(rows.n)
      .i64(grid.rows_per_program);
  runtime::launch(op, k, x.device(), {grid.programs, 1, 1}, args);

  static const auto& reduce = runtime::family("poly_norm_reduce");
  const auto& r = reduce.pick(op, dw, 0, 0);
  KernelArgs rargs;
  rargs.ptr(partial).ptr(dw).ptr(db).i32(grid.programs);
  runtime::launch(op, r, x.device(), {1, 1, 1}, rargs);
  return result();
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_poly_norm_forward", TORCH_BOX(&fk::ops::poly_norm_forward_cuda));
  m.impl("_poly_norm_backward", TORCH_BOX(&fk::ops::poly_norm_backward_cuda));
}
