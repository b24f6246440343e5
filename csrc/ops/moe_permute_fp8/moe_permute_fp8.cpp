// Schema of fk::moe_permute_fp8 and the checks every backend shares (the fake kernel in
// python/fk/ops/moe_permute_fp8.py raises the same messages).
#include "ops/moe_permute_fp8/moe_permute_fp8.h"

#include "runtime/checks.h"

namespace fk::ops {

Fp8Layout check_moe_permute_fp8(const Tensor& tokens, const Tensor& routing_map,
                                const std::optional<Tensor>& probs, int64_t pad_to,
                                std::optional<int64_t> num_out_rows, const std::string& layout) {
  // the dtype first: moe_permute's own check allows float64 on CPU (with another message)
  const auto st = tokens.scalar_type();
  FK_CHECK(st == kFloat || st == kBFloat16 || st == kHalf, kMoePermuteFp8, ": tokens has dtype ",
           st, ", which is not supported (supported: float32, bfloat16, float16)");
  check_moe_permute(kMoePermuteFp8, tokens, routing_map, probs, pad_to, num_out_rows);
  return parse_fp8_layout(kMoePermuteFp8, layout);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (data (N, H) float8_e4m3fn, scales (ceil(H/128), N), data_t (H, N), scales_t
  // ((N + 127 E) // 128, H) per expert segment, permuted_probs (N,), row_id_map (T, E) int32,
  // tokens_per_expert (E,) int32); the copies not asked for by layout and permuted_probs
  // without probs are undefined. See python/fk/ops/moe_permute_fp8.py.
  m.def("moe_permute_fp8(Tensor tokens, Tensor routing_map, Tensor? probs=None, "
        "int pad_to=16, int? num_out_rows=None, str layout='rowwise', bool pow2_scales=False)"
        " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}
