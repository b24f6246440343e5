// CPU reference of fk::moe_permute_fp8: moe_permute's CPU reference, then fk::fp8_quantize's
// reference of 1 x 128 blocks (row-wise, and per expert segment for the column-wise copy).
#include "ops/moe_permute_fp8/moe_permute_fp8.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

using Out7 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

Out7 moe_permute_fp8_cpu(Tensor tokens, Tensor routing_map, std::optional<Tensor> probs,
                         int64_t pad_to, std::optional<int64_t> num_out_rows, std::string layout,
                         bool pow2_scales) {
  const auto want =
      check_moe_permute_fp8(tokens, routing_map, probs, pad_to, num_out_rows, layout);
  auto [permuted, pp, row_map, tpe] =
      moe_permute_reference(kMoePermuteFp8, tokens, routing_map, probs, pad_to, num_out_rows);
  auto pf = aten::to(permuted, kFloat);  // exact: permuted holds copies of the tokens
  Tensor q, s, qt, st;
  if (want.rowwise) std::tie(q, s) = fp8_quantize_rows(pf, pow2_scales);
  if (want.columnwise) {
    std::tie(qt, st) = fp8_quantize_segments(pf, segment_counts(tpe), pow2_scales);
  }
  return {q, s, qt, st, pp, row_map, tpe};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("moe_permute_fp8", TORCH_BOX(&fk::ops::moe_permute_fp8_cpu));
}
