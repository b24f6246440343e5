// CUDA kernels of fk::swiglu_fp8, fk::moe_swiglu_fp8 and their backwards: AOT-compiled Triton
// (triton_src/swiglu_fp8.py). The forward reads x once and writes every copy asked for.
#include <initializer_list>

#include "ops/swiglu_fp8/swiglu_fp8.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using checks::ceil_div;
using runtime::KernelArgs;
using Out5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

constexpr int64_t kMaxExperts = 1024;  // triton_src/swiglu_fp8.py MAX_EXPERTS
constexpr int64_t kRowTile = 32;       // row tile of the row-wise-only kernels
constexpr int64_t kDxRows = 4;         // rows per program of the dx kernel (DX_ROWS)
constexpr int64_t kDxQRows = 8;        // ... and of its row-wise quantizing form (DX_Q_ROWS)
// The aligned variants writing the column-wise copy alone (triton_src/swiglu_fp8.py
// FLAG_COLS): the forward's in narrower tiles, TILE_N columns; the quantized backward's as
// slabs at more warps.
constexpr uint32_t kFlagColsOnly = 2;

void check_grid_y(const char* op, int64_t n) {
  // Tiles of 128 columns run along the grid's y dimension (at most 65535 on CUDA).
  FK_CHECK(ceil_div(n, kFp8Block) <= 65535, op, ": x has n = ", n,
           " columns per half; the CUDA kernel takes at most ", 65535 * kFp8Block,
           " (65535 blocks of 128)");
}

// The aligned variants: M and n multiples of 16 and every input 16-byte aligned (the aligned
// variants hint every pointer; the outputs are fresh allocations).
uint32_t align_flags(int64_t m, int64_t n, std::initializer_list<const Tensor*> inputs) {
  return m % 16 == 0 && n % 16 == 0 && runtime::aligned16(inputs) ? runtime::kFlagAligned : 0;
}

// The forward of both forms; probs / tpe null for the plain one.
Out5 forward(const char* op, const Tensor& x, const Tensor* probs, const Tensor* tpe,
             Fp8Layout want, bool pow2, bool return_h) {
  const int64_t m = x.size(0), n = x.size(1) / 2;
  const int64_t experts = tpe ? tpe->size(0) : 0;
  const auto dev = x.device();
  Tensor q, s, qt, st, h;
  if (want.rowwise) {
    q = aten::empty({m, n}, kFloat8e4m3, dev);
    s = aten::empty({ceil_div(n, kFp8Block), m}, kFloat, dev);
  }
  if (want.columnwise) {
    qt = aten::empty({n, m}, kFloat8e4m3, dev);
    st = aten::empty({tpe ? moe_scale_rows(m, experts) : ceil_div(m, kFp8Block), n}, kFloat,
                     dev);
  }
  if (return_h) h = aten::empty({m, n}, x.scalar_type(), dev);
  if (m == 0 || n == 0) {
    if (st.defined()) aten::fill_(st, 1.0);  // the MoE form's unused blocks
    return {q, s, qt, st, h};
  }
  check_fp8_gpu(op, x);
  check_grid_y(op, n);
  const bool segmented = tpe && want.columnwise;
  FK_CHECK(!segmented || experts <= kMaxExperts, op, ": the column-wise copy takes at most ",
           kMaxExperts, " experts on CUDA, got ", experts);
  auto xc = aten::contiguous(x);
  Tensor pc = probs ? aten::contiguous(*probs) : xc;
  static const auto& plain = runtime::family("swiglu_fp8_fwd");
  static const auto& moe = runtime::family("moe_swiglu_fp8_fwd");
  const int64_t tile = want.columnwise ? kFp8Block : kRowTile;
  const int64_t rows = segmented ? moe_scale_rows(m, experts) : ceil_div(m, tile);
  // The MoE form's tiles read their block's rows from a table of the segments' blocks.
  Tensor blocks = segmented ? segment_blocks_cuda(op, "moe_swiglu_fp8_blocks", xc,
                                                  aten::contiguous(aten::to(*tpe, kLong)), m,
                                                  rows)
                            : xc;
  const uint32_t flags = align_flags(m, n, {&xc, &pc});
  const auto& fam = segmented ? moe : plain;
  const int64_t block = segmented ? experts : tile;
  // The aligned variants are compiled for their copies: both, or (kFlagColsOnly) the
  // column-wise copy alone in narrower tiles. Where n needs more of those than the grid's y
  // dimension takes (65535; 128 columns fit, checked), the unaligned variant, which reads
  // its copies from the arguments.
  const bool cols_only = !want.rowwise && (flags & runtime::kFlagAligned) != 0;
  const auto* kern = &fam.pick(op, xc, block, flags | (cols_only ? kFlagColsOnly : 0u));
  if (ceil_div(n, kern->constexpr_value("TILE_N")) > 65535) {
    kern = &fam.pick(op, xc, block, 0);
  }
  const Tensor& q_any = want.rowwise ? q : qt;  // the pointers of a copy not asked for are
  const Tensor& s_any = want.rowwise ? s : st;  // never written; any valid one will do
  KernelArgs args;
  args.ptr(xc).ptr(pc).ptr(blocks).ptr(q_any).ptr(s_any)
      .ptr(want.columnwise ? qt : q_any).ptr(want.columnwise ? st : s_any)
      .ptr(return_h ? h : xc).i64(m).i64(n).i64(segmented ? experts : 0)
      .i32(probs ? 1 : 0).i32(want.rowwise ? 1 : 0).i32(want.columnwise ? 1 : 0)
      .i32(return_h ? 1 : 0).i32(pow2 ? 1 : 0);
  runtime::launch(op, *kern, dev, {rows, ceil_div(n, kern->constexpr_value("TILE_N")), 1},
                  args);
  return {q, s, qt, st, h};
}

Out5 swiglu_fp8_cuda(Tensor x, std::string layout, bool pow2_scales, bool return_h) {
  const auto want = check_swiglu_fp8(x, layout);
  return forward(kSwigluFp8, x, nullptr, nullptr, want, pow2_scales, return_h);
}

Out5 moe_swiglu_fp8_cuda(Tensor x, Tensor probs, Tensor tokens_per_expert, std::string layout,
                         bool pow2_scales, bool return_h) {
  const auto want = check_moe_swiglu_fp8(x, probs, tokens_per_expert, layout);
  return forward(kMoeSwigluFp8, x, &probs, &tokens_per_expert, want, pow2_scales, return_h);
}

// dx in x's dtype, or (quant) dx quantized row-wise in 1 x 128 blocks (data (M, 2n), scales
// (2n / 128, M)), and dprobs with probs: (dx, dprobs, data, scales), undefined where not
// asked for.
std::tuple<Tensor, Tensor, Tensor, Tensor> dx_cuda(const char* op, const Tensor& grad_h,
                                                   const Tensor& x, const Tensor* probs,
                                                   bool quant, bool pow2) {
  const int64_t m = x.size(0), n = x.size(1) / 2;
  const auto dev = x.device();
  Tensor dx, dp, q, s;
  if (quant) {
    q = aten::empty({m, 2 * n}, kFloat8e4m3, dev);
    s = aten::empty({2 * n / kFp8Block, m}, kFloat, dev);
  } else {
    dx = aten::empty({m, 2 * n}, x.scalar_type(), dev);
  }
  if (probs) dp = aten::empty({m}, kFloat, dev);
  if (m == 0) return {dx, dp, q, s};
  if (n == 0) {
    if (probs) aten::zero_(dp);
    return {dx, dp, q, s};
  }
  check_fp8_gpu(op, x);
  auto xc = aten::contiguous(x), dh = aten::contiguous(grad_h);
  Tensor pc = probs ? aten::contiguous(*probs) : xc;
  static const auto& plain = runtime::family("swiglu_fp8_dx");
  static const auto& quantized = runtime::family("swiglu_fp8_dx_q");
  // (the dx kernel's aligned variant hints n only, not M)
  const uint32_t flags = align_flags(16, n, {&xc, &dh, &pc});
  const auto& kern = quant ? quantized.pick(op, xc, kFp8Block, flags)
                           : plain.pick(op, xc, 1, flags);
  const Tensor& out = quant ? q : dx;  // a pointer never written when not asked for
  KernelArgs args;
  args.ptr(dh).ptr(xc).ptr(pc).ptr(out).ptr(probs ? dp : out).ptr(quant ? q : out)
      .ptr(quant ? s : out).i64(m).i64(n).i32(probs ? 1 : 0).i32(quant ? 0 : 1)
      .i32(quant ? 1 : 0).i32(pow2 ? 1 : 0);
  const int64_t rows = quant ? kDxQRows : kDxRows;
  runtime::launch(op, kern, dev, {ceil_div(m, rows), 1, 1}, args);
  return {dx, dp, q, s};
}

Out5 swiglu_fp8_backward_cuda(Tensor grad_h, Tensor x, std::string grad_layout,
                              bool pow2_scales) {
  constexpr const char* op = kSwigluFp8Backward;
  const auto want = check_swiglu_fp8_backward(grad_h, x, grad_layout);
  if (!want.rowwise && !want.columnwise) {
    return {std::get<0>(dx_cuda(op, grad_h, x, nullptr, false, false)), Tensor(), Tensor(),
            Tensor(), Tensor()};
  }
  const int64_t m = x.size(0), n = x.size(1) / 2, k = 2 * n;
  const auto dev = x.device();
  Tensor q, s, qt, st;
  if (want.rowwise) {
    q = aten::empty({m, k}, kFloat8e4m3, dev);
    s = aten::empty({k / kFp8Block, m}, kFloat, dev);
  }
  if (want.columnwise) {
    qt = aten::empty({k, m}, kFloat8e4m3, dev);
    st = aten::empty({ceil_div(m, kFp8Block), k}, kFloat, dev);
  }
  if (m == 0 || n == 0) return {Tensor(), q, s, qt, st};
  check_fp8_gpu(op, x);
  check_grid_y(op, n);
  auto xc = aten::contiguous(x), dh = aten::contiguous(grad_h);
  static const auto& fam = runtime::family("swiglu_fp8_bwd_q");
  const int64_t tile = want.columnwise ? kFp8Block : kRowTile;
  // The aligned variants are compiled for their copies: both, or the column-wise copy alone.
  const uint32_t flags = align_flags(m, n, {&xc, &dh});
  const bool cols_only = !want.rowwise && flags != 0;
  const auto& kern = fam.pick(op, xc, tile, flags | (cols_only ? kFlagColsOnly : 0u));
  const Tensor& q_any = want.rowwise ? q : qt;
  const Tensor& s_any = want.rowwise ? s : st;
  KernelArgs args;
  args.ptr(dh).ptr(xc).ptr(q_any).ptr(s_any).ptr(want.columnwise ? qt : q_any)
      .ptr(want.columnwise ? st : s_any).i64(m).i64(n).i32(want.rowwise ? 1 : 0)
      .i32(want.columnwise ? 1 : 0).i32(pow2_scales ? 1 : 0);
  runtime::launch(op, kern, dev, {ceil_div(m, tile), n / kFp8Block, 1}, args);
  return {Tensor(), q, s, qt, st};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> moe_swiglu_fp8_backward_cuda(
    Tensor grad_h, Tensor x, Tensor probs, std::string grad_layout, bool pow2_scales) {
  const bool quant = check_moe_swiglu_fp8_backward(grad_h, x, probs, grad_layout);
  return dx_cuda(kMoeSwigluFp8Backward, grad_h, x, &probs, quant, pow2_scales);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("swiglu_fp8", TORCH_BOX(&fk::ops::swiglu_fp8_cuda));
  m.impl("swiglu_fp8_backward", TORCH_BOX(&fk::ops::swiglu_fp8_backward_cuda));
  m.impl("moe_swiglu_fp8", TORCH_BOX(&fk::ops::moe_swiglu_fp8_cuda));
  m.impl("moe_swiglu_fp8_backward", TORCH_BOX(&fk::ops::moe_swiglu_fp8_backward_cuda));
}
