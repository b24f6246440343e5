// CUDA kernels of fk::softmax: AOT-compiled Triton (triton_src/softmax.py).
//
// The softmax dim is made the last one: a view when x is contiguous and dim is already last
// (the fast path), else one copy in (movedim + contiguous) and one copy out. Rows up to the
// largest single-pass block stay in registers (softmax_fwd / softmax_bwd, the smallest block
// that holds a row; rows whose width or pointers are not 16-aligned use the *_unaligned
// families, built for shorter rows); longer rows go to the looped kernels on a persistent
// grid of PER_SM programs per multiprocessor.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops/softmax/softmax.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;
using runtime::flags_for;
using runtime::KernelFamily;
using runtime::KernelSpec;

using runtime::as_rows;
using runtime::from_rows;
using runtime::Rows;

struct Families {
  const KernelFamily& aligned;    // single pass, 16-aligned rows
  const KernelFamily& unaligned;  // single pass, any rows (shorter maximum)
  const KernelFamily& looped;     // any row length, both alignments
};

// The variant for (m, n) rows and the number of programs to launch.
std::pair<const KernelSpec*, int64_t> choose(const char* op, const Families& fams,
                                             const Rows& rows, uint32_t flags) {
  // Column offsets are 32-bit in the kernels, including a prefetch up to two chunks past
  // the row's end.
  constexpr int64_t kMaxRow = INT32_MAX - (1 << 16);
  FK_CHECK(rows.n <= kMaxRow, op, ": a softmax over more than ", kMaxRow,
           " elements is not supported on CUDA, got ", rows.n);
  const auto& single = flags & runtime::kFlagAligned ? fams.aligned : fams.unaligned;
  if (rows.n <= single.max_block(rows.x2d)) {
    const auto& k = single.pick(op, rows.x2d, rows.n, flags);
    return {&k, checks::ceil_div(rows.m, k.constexpr_value("ROWS"))};
  }
  const auto& k = fams.looped.pick(op, rows.x2d, 0, flags);
  const int64_t sms = runtime::device_sm_count(rows.x2d.device().index());
  return {&k, std::min(rows.m, k.constexpr_value("PER_SM") * sms)};
}

Tensor softmax_cuda(Tensor x, int64_t dim) {
  constexpr const char* op = "fk::softmax";
  const int64_t d = check_softmax(x, dim);
  if (x.numel() == 0) return aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto rows = as_rows(x, d);
  auto y = aten::empty({rows.m, rows.n}, x.scalar_type(), x.device());
  static const Families fams{runtime::family("softmax_fwd"),
                             runtime::family("softmax_fwd_unaligned"),
                             runtime::family("softmax_fwd_looped")};
  auto [k, programs] = choose(op, fams, rows, flags_for(rows.n, {&rows.x2d, &y}));
  KernelArgs args;
  args.ptr(rows.x2d).ptr(y).i64(rows.n).i64(rows.n).i64(rows.m).i32(rows.n);
  runtime::launch(op, *k, x.device(), {programs, 1, 1}, args);
  return from_rows(y, x, d);
}

Tensor softmax_backward_cuda(Tensor grad_y, Tensor y, int64_t dim) {
  constexpr const char* op = "fk::_softmax_backward";
  const int64_t d = check_softmax_backward(grad_y, y, dim);
  if (y.numel() == 0) return aten::empty(y.sizes(), y.scalar_type(), y.device());
  auto ys = as_rows(y, d);
  auto dys = as_rows(grad_y, d);
  auto dx = aten::empty({ys.m, ys.n}, y.scalar_type(), y.device());
  static const Families fams{runtime::family("softmax_bwd"),
                             runtime::family("softmax_bwd_unaligned"),
                             runtime::family("softmax_bwd_looped")};
  auto [k, programs] = choose(op, fams, ys, flags_for(ys.n, {&dys.x2d, &ys.x2d, &dx}));
  KernelArgs args;
  args.ptr(dys.x2d).ptr(ys.x2d).ptr(dx).i64(ys.n).i64(ys.n).i64(ys.n).i64(ys.m).i32(ys.n);
  runtime::launch(op, *k, y.device(), {programs, 1, 1}, args);
  return from_rows(dx, y, d);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("softmax", TORCH_BOX(&fk::ops::softmax_cuda));
  m.impl("_softmax_backward", TORCH_BOX(&fk::ops::softmax_backward_cuda));
}
