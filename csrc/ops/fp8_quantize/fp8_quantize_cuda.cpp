// CUDA kernel of fk::fp8_quantize: AOT-compiled Triton (triton_src/fp8_quantize.py). One
// launch over the tiles of x reads x once and writes every copy asked for; the tile is the
// picked variant's (TILE_M x TILE_K: 128 x 128, or narrower for one copy of 1 x 128 blocks).
// Variants with PERSISTENT > 0 walk the tiles over a persistent grid instead.
#include "ops/fp8_quantize/fp8_quantize.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using checks::ceil_div;

// The forms' variant flags (triton_src/fp8_quantize.py, FLAG_ROWS, FLAG_COLS, FLAG_WEIGHT).
constexpr uint32_t kBoth = 0, kRows = 2, kCols = 4, kWeight = 8;
using runtime::KernelArgs;

std::tuple<Tensor, Tensor, Tensor, Tensor> fp8_quantize_cuda(Tensor x, int64_t block_rows,
                                                            std::string layout,
                                                            bool pow2_scales) {
  constexpr const char* op = "fk::fp8_quantize";
  const auto want = check_fp8_quantize(x, block_rows, layout);
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t nm = ceil_div(m, kFp8Block), nk = ceil_div(k, kFp8Block);
  const bool weight = block_rows != 1;
  auto xc = aten::contiguous(x);
  // The aligned variant: M and K multiples of 16 and x 16-byte aligned (the outputs are
  // fresh allocations).
  const uint32_t aligned =
      m % 16 == 0 && k % 16 == 0 && runtime::aligned16({&xc}) ? runtime::kFlagAligned : 0;
  if (weight && want.columnwise && x.scalar_type() == kFloat && !aligned) {
    // float32 weights in the unaligned variant: its transposed store (tl.trans) wrote wrong
    // values (NaN among them) into the column-wise copy on sm_90 (Triton 3.6;
    // benchmarks/NOTES.md v14), so the row-wise copy is written and the column-wise one is
    // its transpose (a copy). The aligned variant stores that copy in 32-bit words, with no
    // tl.trans (PACKED = 2).
    auto [q1, s1, unused_q, unused_s] = fp8_quantize_cuda(xc, block_rows, "rowwise",
                                                          pow2_scales);
    Tensor qt1 = aten::clone(aten::t(q1)), st1 = aten::clone(aten::t(s1));
    if (!want.rowwise) return {Tensor(), Tensor(), qt1, st1};
    return {q1, s1, qt1, st1};
  }
  Tensor q, s, qt, st;
  if (want.rowwise) {
    q = aten::empty({m, k}, kFloat8e4m3, x.device());
    s = weight ? aten::empty({nm, nk}, kFloat, x.device())
               : aten::empty({nk, m}, kFloat, x.device());
  }
  if (want.columnwise) {
    qt = aten::empty({k, m}, kFloat8e4m3, x.device());
    st = weight ? aten::empty({nk, nm}, kFloat, x.device())
                : aten::empty({nm, k}, kFloat, x.device());
  }
  if (m == 0 || k == 0) return {q, s, qt, st};
  check_fp8_gpu(op, x);
  const uint32_t form = weight ? kWeight
                       : want.rowwise && want.columnwise ? kBoth
                       : want.rowwise ? kRows
                                      : kCols;
  static const auto& fam = runtime::family("fp8_quantize");
  const auto& kern = fam.pick(op, xc, kFp8Block, form | aligned);
  const int64_t tile_m = kern.constexpr_value("TILE_M"), tile_k = kern.constexpr_value("TILE_K");
  const int64_t tiles_m = ceil_div(m, tile_m), tiles_k = ceil_div(k, tile_k);
  // Tiles of columns run along the grid's y dimension (at most 65535 on CUDA).
  FK_CHECK(tiles_k <= 65535, op, ": x has ", k, " columns; the CUDA kernel takes at most ",
           65535 * tile_k, " here (65535 tiles of ", tile_k, ")");
  const Tensor& q_any = want.rowwise ? q : qt;  // the pointers of a copy not asked for are
  const Tensor& s_any = want.rowwise ? s : st;  // never written; any valid one will do
  KernelArgs args;
  args.ptr(xc).ptr(want.rowwise ? q : q_any).ptr(want.rowwise ? s : s_any)
      .ptr(want.columnwise ? qt : q_any).ptr(want.columnwise ? st : s_any)
      .i64(m).i64(k).i32(weight ? 1 : 0).i32(want.rowwise ? 1 : 0)
      .i32(want.columnwise ? 1 : 0).i32(pow2_scales ? 1 : 0);
  // A variant with PERSISTENT = n runs n programs per multiprocessor, each walking the
  // tiles with a stride of the grid (at most one program a tile).
  if (const int64_t per_sm = kern.constexpr_value("PERSISTENT"); per_sm > 0) {
    const int64_t programs =
        runtime::persistent_grid(tiles_m * tiles_k, x.device(), per_sm).programs;
    runtime::launch(op, kern, x.device(), {programs, 1, 1}, args);
  } else {
    runtime::launch(op, kern, x.device(), {tiles_m, tiles_k, 1}, args);
  }
  return {q, s, qt, st};
}

}  // namespace

Tensor segment_blocks_cuda(const char* op, const char* family, const Tensor& x,
                           const Tensor& tokens_per_expert, int64_t m, int64_t rows) {
  const int64_t experts = tokens_per_expert.size(0);
  const auto& kern = runtime::family(family).pick(op, x, experts, 0);
  Tensor table = aten::empty({rows, 3}, kLong, x.device());
  KernelArgs args;
  args.ptr(tokens_per_expert).ptr(table).i64(experts).i64(m).i64(rows);
  runtime::launch(op, kern, x.device(), {ceil_div(rows, kern.constexpr_value("RB")), 1, 1},
                  args);
  return table;
}

void check_fp8_gpu(const char* op, const Tensor& x) {
  const int cap = runtime::device_capability(x.device().index());
  FK_CHECK(runtime::arch_for_capability(cap / 10, cap % 10) >= 90, op,
           ": float8_e4m3fn kernels need a GPU of compute capability 9.0 or newer, got ",
           cap / 10, ".", cap % 10, " on ", x.device());
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("fp8_quantize", TORCH_BOX(&fk::ops::fp8_quantize_cuda));
}
