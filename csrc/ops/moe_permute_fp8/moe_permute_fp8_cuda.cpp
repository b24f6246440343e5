// CUDA kernels of fk::moe_permute_fp8: moe_permute's row map (moe_rows_cuda), then one
// AOT-compiled Triton kernel (triton_src/moe_permute_fp8.py) that gathers and quantizes:
// the scatter kernel (each token read once, its quantized row written to each of its rows)
// for the row-wise copy alone, the tile kernel (128-row blocks of each segment gathered and
// quantized both ways, 128 columns a program, or the picked variant's narrower tile for the
// column-wise copy alone) when the column-wise copy is asked for.
#include <cstdint>

#include "ops/moe_permute_fp8/moe_permute_fp8.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using checks::ceil_div;
using runtime::KernelArgs;
using Out7 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

constexpr uint32_t kFlagProbsF32 = 2;  // triton_src/moe_permute_fp8.py FLAG_PROBS_F32
// The tile kernel's form for the column-wise copy alone, in its aligned variant only
// (triton_src/moe_permute_fp8.py FLAG_COLS): narrower tiles, TILE_K columns.
constexpr uint32_t kFlagColsOnly = 4;
constexpr int64_t kMaxExperts = 1024;  // triton_src/moe_permute_fp8.py MAX_EXPERTS

Out7 moe_permute_fp8_cuda(Tensor tokens, Tensor routing_map, std::optional<Tensor> probs,
                          int64_t pad_to, std::optional<int64_t> num_out_rows,
                          std::string layout, bool pow2_scales) {
  constexpr const char* op = kMoePermuteFp8;
  const auto want =
      check_moe_permute_fp8(tokens, routing_map, probs, pad_to, num_out_rows, layout);
  const int64_t t = tokens.size(0), h = tokens.size(1), e = routing_map.size(1);
  FK_CHECK(!want.columnwise || e <= kMaxExperts, op, ": the column-wise copy takes at most ",
           kMaxExperts, " experts on CUDA, got ", e);
  FK_CHECK(ceil_div(h, kFp8Block) <= 65535, op, ": tokens have H = ", h,
           " columns; the CUDA kernel takes at most ", 65535 * kFp8Block,
           " (65535 blocks of 128)");
  const Device dev = tokens.device();
  auto x = aten::contiguous(tokens);
  std::optional<Tensor> p;
  if (has(probs)) p = aten::contiguous(*probs);
  auto [row_map, tpe, src, n] = moe_rows_cuda(op, x, routing_map, pad_to, num_out_rows);
  Tensor q, s, qt, st, pp;
  if (want.rowwise) {
    q = aten::empty({n, h}, kFloat8e4m3, dev);
    s = aten::empty({ceil_div(h, kFp8Block), n}, kFloat, dev);
  }
  // The tile kernel runs one program per row of st and one more (the rows past the last
  // segment may need it), which writes a row of st that is dropped.
  const int64_t st_rows = moe_scale_rows(n, e);
  Tensor st_all;
  if (want.columnwise) {
    qt = aten::empty({h, n}, kFloat8e4m3, dev);
    st_all = aten::empty({st_rows + 1, h}, kFloat, dev);
    st = aten::narrow(st_all, 0, 0, st_rows);
  }
  if (p) pp = aten::empty({n}, p->scalar_type(), dev);
  if (n == 0 || h == 0) {
    if (want.columnwise) aten::fill_(st, 1.0);
    return {q, s, qt, st, pp, row_map, tpe};
  }
  check_fp8_gpu(op, x);
  uint32_t flags = h % 16 == 0 && runtime::aligned16({&x}) ? runtime::kFlagAligned : 0;
  if (p && p->scalar_type() == kFloat && x.scalar_type() != kFloat) flags |= kFlagProbsF32;
  const Tensor& pin = p ? *p : x;  // the probs pointers are not used without probs
  const Tensor& pout = p ? pp : x;
  const Tensor& q_any = want.rowwise ? q : qt;  // the pointers of a copy not asked for are
  const Tensor& s_any = want.rowwise ? s : st_all;  // never written; any valid one will do
  KernelArgs args;
  if (!want.columnwise) {
    static const auto& scatter = runtime::family("moe_permute_fp8_scatter");
    const auto& kern = scatter.pick(op, x, 0, flags);
    args.ptr(x).ptr(row_map).ptr(q).ptr(s).ptr(pin).ptr(pout).ptr(src).i64(t).i64(h).i64(e)
        .i64(n).i32(p ? 1 : 0).i32(pow2_scales ? 1 : 0);
    runtime::launch(op, kern, dev, {t + ceil_div(n, kern.constexpr_value("ZR")), 1, 1}, args);
  } else {
    static const auto& tile = runtime::family("moe_permute_fp8_tile");
    // the aligned (slab) variant also needs N % 4 == 0: its words hold four rows' bytes
    const uint32_t tile_flags = n % 4 == 0 ? flags : flags & ~runtime::kFlagAligned;
    // The column-wise copy alone (its blocks are 128 rows x 1 column) in the aligned variant
    // compiled for it (kFlagColsOnly): narrower tiles, TILE_K columns a program.
    const bool cols_only = !want.rowwise && (tile_flags & runtime::kFlagAligned) != 0;
    const auto* kern = &tile.pick(op, x, e, tile_flags | (cols_only ? kFlagColsOnly : 0u));
    // Tiles of columns run along the grid's y dimension (at most 65535): where H needs more
    // of the narrower ones, 128-column tiles (which fit, by the check above).
    if (ceil_div(h, kern->constexpr_value("TILE_K")) > 65535) {
      kern = &tile.pick(op, x, e, tile_flags);
    }
    // The tiles read their block's rows from a table of the segments' blocks.
    Tensor blocks = segment_blocks_cuda(op, "moe_permute_fp8_blocks", x, tpe, n, st_rows + 1);
    args.ptr(x).ptr(src).ptr(blocks).ptr(pin).ptr(pout).ptr(q_any).ptr(s_any).ptr(qt)
        .ptr(st_all).i64(t).i64(h).i64(e).i64(n).i32(want.rowwise ? 1 : 0).i32(p ? 1 : 0)
        .i32(pow2_scales ? 1 : 0);
    runtime::launch(op, *kern, dev,
                    {st_rows + 1, ceil_div(h, kern->constexpr_value("TILE_K")), 1}, args);
  }
  return {q, s, qt, st, pp, row_map, tpe};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("moe_permute_fp8", TORCH_BOX(&fk::ops::moe_permute_fp8_cuda));
}
