// fk::moe_permute / fk::moe_unpermute: mixture-of-experts tokens gathered into expert-major
// rows, each expert's segment padded to a multiple of pad_to, and summed back (the
// semantics and the row map: python/fk/ops/moe_permute.py).
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// The sizes every backend works with.
struct MoeSizes {
  int64_t tokens, hidden, experts;
};

// tokens (T, H) floating; routing_map (T, E) bool or integer; probs undefined or (T, E)
// float32 or tokens' dtype; all on one device; pad_to >= 1; num_out_rows >= 0. `op` names
// the caller (fk::moe_permute or its FP8 form) in the messages.
MoeSizes check_moe_permute(const char* op, const Tensor& tokens, const Tensor& routing_map,
                           const std::optional<Tensor>& probs, int64_t pad_to,
                           std::optional<int64_t> num_out_rows);

// permuted (N, H) floating; row_id_map (T, E) int32; probs undefined or (T, E) float32 or
// permuted's dtype; one device. `op` names the caller in the messages.
MoeSizes check_moe_unpermute(const char* op, const Tensor& permuted, const Tensor& row_id_map,
                             const std::optional<Tensor>& probs);

// grad_permuted_probs undefined or (N,) floating on grad_permuted's device, N =
// grad_permuted.size(0); plus check_moe_unpermute's checks of grad_permuted and the map.
MoeSizes check_moe_permute_backward(const Tensor& grad_permuted,
                                    const std::optional<Tensor>& grad_permuted_probs,
                                    const Tensor& row_id_map);

// grad_out (T, H) of permuted's dtype and device; plus check_moe_unpermute's checks.
MoeSizes check_moe_unpermute_backward(const Tensor& grad_out, const Tensor& permuted,
                                      const Tensor& row_id_map,
                                      const std::optional<Tensor>& probs);

// The rows a bound must allow for, as the message of a bound that is too small says.
std::string moe_bound_message(const char* op, int64_t needed, int64_t num_out_rows);

// The routing map as a contiguous bool tensor (nonzero entries are routed).
Tensor moe_routed_mask(const Tensor& routing_map);

// The row map of moe_permute built on the device (CUDA; moe_permute_cuda.cpp), for the ops that
// move tokens by it: row_map (T, E) int32, tokens_per_expert (E,) int32, src (n,) int32 (the
// token of each row, -1 for padding rows and the rows past the last segment) and the row
// count n: num_out_rows (a device-side assert fires when the segments need more), or the
// padded segments' total (one host synchronisation). x is the contiguous tokens (T, H).
struct MoeRows {
  Tensor row_map, tokens_per_expert, src;
  int64_t n;
};
MoeRows moe_rows_cuda(const char* op, const Tensor& x, const Tensor& routing_map,
                      int64_t pad_to, std::optional<int64_t> num_out_rows);

// The CPU reference of moe_permute (moe_permute_cpu.cpp), after check_moe_permute: (permuted,
// permuted_probs, row_id_map, tokens_per_expert); `op` names the caller in the messages.
std::tuple<Tensor, Tensor, Tensor, Tensor> moe_permute_reference(
    const char* op, const Tensor& tokens, const Tensor& routing_map,
    const std::optional<Tensor>& probs, int64_t pad_to, std::optional<int64_t> num_out_rows);

}  // namespace fk::ops
