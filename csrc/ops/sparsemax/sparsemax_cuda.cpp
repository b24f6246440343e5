// CUDA kernels of fk::sparsemax: AOT-compiled Triton (triton_src/sparsemax.py).
//
// The sparsemax dim is made the last one: a view when x is contiguous and dim is already
// last (the fast path), else one copy in (movedim + contiguous) and one copy out. A row is
// held in registers by one program (sparsemax_fwd / sparsemax_bwd, the smallest block that
// holds it; rows whose width or pointers are not 16-aligned use the *_unaligned families),
// up to 32768 elements; longer rows are an error on CUDA.
#include <cstdint>

#include "ops/sparsemax/sparsemax.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::flags_for;
using runtime::KernelArgs;
using runtime::KernelFamily;

using runtime::as_rows;
using runtime::from_rows;
using runtime::Rows;

// The largest row a program holds in registers (triton_src/sparsemax.py, MAX_BLOCK).
constexpr int64_t kMaxRow = 32768;

void check_row(const char* op, int64_t n) {
  FK_CHECK(n <= kMaxRow, op, ": a sparsemax over more than ", kMaxRow,
           " elements is not supported on CUDA, got ", n, " (the CPU backend takes any length)");
}

const runtime::KernelSpec& choose(const char* op, const KernelFamily& aligned,
                                  const KernelFamily& unaligned, const Rows& rows,
                                  uint32_t flags) {
  const auto& fam = flags & runtime::kFlagAligned ? aligned : unaligned;
  return fam.pick(op, rows.x2d, rows.n, flags);
}

Tensor sparsemax_cuda(Tensor x, int64_t dim) {
  constexpr const char* op = "fk::sparsemax";
  const int64_t d = check_sparsemax(x, dim);
  if (x.numel() == 0) return aten::empty(x.sizes(), x.scalar_type(), x.device());
  check_row(op, x.dim() == 0 ? 1 : x.size(d));
  auto rows = as_rows(x, d);
  static const KernelFamily& aligned = runtime::family("sparsemax_fwd");
  static const KernelFamily& unaligned = runtime::family("sparsemax_fwd_unaligned");
  auto y = aten::empty({rows.m, rows.n}, x.scalar_type(), x.device());
  const auto& kf = choose(op, aligned, unaligned, rows, flags_for(rows.n, {&rows.x2d, &y}));
  KernelArgs args;
  args.ptr(rows.x2d).ptr(y).i64(rows.n).i64(rows.n).i64(rows.m).i32(rows.n);
  runtime::launch(op, kf, x.device(), {rows.m, 1, 1}, args);
  return from_rows(y, x, d);
}

Tensor sparsemax_backward_cuda(Tensor grad_y, Tensor y, int64_t dim) {
  constexpr const char* op = "fk::_sparsemax_backward";
  const int64_t d = check_sparsemax_backward(grad_y, y, dim);
  if (y.numel() == 0) return aten::empty(y.sizes(), y.scalar_type(), y.device());
  check_row(op, y.dim() == 0 ? 1 : y.size(d));
  auto ys = as_rows(y, d);
  auto dys = as_rows(grad_y, d);
  auto dx = aten::empty({ys.m, ys.n}, y.scalar_type(), y.device());
  static const KernelFamily& aligned = runtime::family("sparsemax_bwd");
  static const KernelFamily& unaligned = runtime::family("sparsemax_bwd_unaligned");
  const auto& k = choose(op, aligned, unaligned, ys, flags_for(ys.n, {&dys.x2d, &ys.x2d, &dx}));
  KernelArgs args;
  args.ptr(dys.x2d).ptr(ys.x2d).ptr(dx).i64(ys.n).i64(ys.n).i64(ys.n).i64(ys.m).i32(ys.n);
  runtime::launch(op, k, y.device(), {ys.m, 1, 1}, args);
  return from_rows(dx, y, d);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("sparsemax", TORCH_BOX(&fk::ops::sparsemax_cuda));
  m.impl("_sparsemax_backward", TORCH_BOX(&fk::ops::sparsemax_backward_cuda));
}
