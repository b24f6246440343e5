// Schemas of fk::moe_permute, fk::moe_unpermute and their backward ops, and the input checks
// every backend shares (python/fk/ops/moe_permute.py raises the same messages from the fake
// kernels).
#include "ops/moe_permute/moe_permute.h"

#include <cstdint>

#include "runtime/checks.h"

namespace fk::ops {

namespace {

bool is_index_dtype(ScalarType st) {
  return st == kBool || st == kByte || st == ScalarType::Char || st == ScalarType::Short ||
         st == kInt || st == kLong;
}

// probs (T, E), float32 or `like`'s dtype, on like's device.
void check_probs(const char* op, const Tensor& probs, const char* like_name, const Tensor& like,
                 int64_t t, int64_t e) {
  checks::check_same_device(op, "probs", probs, like_name, like);
  checks::check_float(op, "probs", probs);
  FK_CHECK(probs.scalar_type() == kFloat || probs.scalar_type() == like.scalar_type(), op,
           ": probs must be float32 or the dtype of ", like_name, " (",
           like.scalar_type(), "), got ", probs.scalar_type());
  FK_CHECK(probs.dim() == 2 && probs.size(0) == t && probs.size(1) == e, op,
           ": probs must have shape (", t, ", ", e, "), got ", shape_of(probs));
}

}  // namespace

MoeSizes check_moe_permute(const char* op, const Tensor& tokens, const Tensor& routing_map,
                           const std::optional<Tensor>& probs, int64_t pad_to,
                           std::optional<int64_t> num_out_rows) {
  FK_CHECK(tokens.dim() == 2, op, ": tokens must be 2-D (T, H), got shape ", shape_of(tokens));
  checks::check_float(op, "tokens", tokens);
  checks::check_same_device(op, "tokens", tokens, "routing_map", routing_map);
  FK_CHECK(routing_map.dim() == 2 && routing_map.size(0) == tokens.size(0), op,
           ": routing_map must have shape (", tokens.size(0), ", E), got ",
           shape_of(routing_map));
  FK_CHECK(is_index_dtype(routing_map.scalar_type()), op, ": routing_map has dtype ",
           routing_map.scalar_type(), ", which is not supported (supported: bool, integers)");
  const int64_t t = tokens.size(0), e = routing_map.size(1);
  if (has(probs)) check_probs(op, *probs, "tokens", tokens, t, e);
  FK_CHECK(pad_to >= 1 && pad_to <= INT32_MAX, op, ": pad_to must be in [1, 2^31), got ",
           pad_to);
  if (num_out_rows.has_value()) {
    FK_CHECK(*num_out_rows >= 0 && *num_out_rows <= INT32_MAX, op,
             ": num_out_rows must be in [0, 2^31), got ", *num_out_rows);
  }
  return {t, tokens.size(1), e};
}

MoeSizes check_moe_unpermute(const char* op, const Tensor& permuted, const Tensor& row_id_map,
                             const std::optional<Tensor>& probs) {
  FK_CHECK(permuted.dim() == 2, op, ": permuted must be 2-D (N, H), got shape ",
           shape_of(permuted));
  checks::check_float(op, "permuted", permuted);
  checks::check_same_device(op, "permuted", permuted, "row_id_map", row_id_map);
  FK_CHECK(row_id_map.dim() == 2 && row_id_map.scalar_type() == kInt, op,
           ": row_id_map must be a 2-D (T, E) int32 tensor (moe_permute's), got ",
           row_id_map.scalar_type(), " of shape ", shape_of(row_id_map));
  FK_CHECK(permuted.size(0) <= INT32_MAX, op, ": permuted has ", permuted.size(0),
           " rows; at most 2^31 - 1 are supported");
  const int64_t t = row_id_map.size(0), e = row_id_map.size(1);
  if (has(probs)) check_probs(op, *probs, "permuted", permuted, t, e);
  return {t, permuted.size(1), e};
}

MoeSizes check_moe_permute_backward(const Tensor& grad_permuted,
                                    const std::optional<Tensor>& grad_permuted_probs,
                                    const Tensor& row_id_map) {
  constexpr const char* op = "fk::_moe_permute_backward";
  const auto s = check_moe_unpermute(op, grad_permuted, row_id_map, std::nullopt);
  if (has(grad_permuted_probs)) {
    const Tensor& g = *grad_permuted_probs;
    checks::check_same_device(op, "grad_permuted_probs", g, "grad_permuted", grad_permuted);
    checks::check_float(op, "grad_permuted_probs", g);
    FK_CHECK(g.dim() == 1 && g.size(0) == grad_permuted.size(0), op,
             ": grad_permuted_probs must have shape (", grad_permuted.size(0), ",), got ",
             shape_of(g));
  }
  return s;
}

MoeSizes check_moe_unpermute_backward(const Tensor& grad_out, const Tensor& permuted,
                                      const Tensor& row_id_map,
                                      const std::optional<Tensor>& probs) {
  constexpr const char* op = "fk::_moe_unpermute_backward";
  const auto s = check_moe_unpermute(op, permuted, row_id_map, probs);
  checks::check_pair(op, "grad_out", grad_out, "permuted", permuted);
  FK_CHECK(grad_out.dim() == 2 && grad_out.size(0) == s.tokens && grad_out.size(1) == s.hidden,
           op, ": grad_out must have shape (", s.tokens, ", ", s.hidden, "), got ",
           shape_of(grad_out));
  return s;
}

std::string moe_bound_message(const char* op, int64_t needed, int64_t num_out_rows) {
  return str(op, ": the padded segments need ", needed, " rows but num_out_rows is ",
             num_out_rows, " (a token routed to more than topk experts, or a bound too small)");
}

Tensor moe_routed_mask(const Tensor& routing_map) {
  if (routing_map.scalar_type() == kBool) return aten::contiguous(routing_map);
  return aten::contiguous(aten::ne(routing_map, aten::scalar_int(0)));
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (permuted (N, H), permuted_probs (N,) or undefined, row_id_map (T, E) int32,
  // tokens_per_expert (E,) int32): see python/fk/ops/moe_permute.py.
  m.def("moe_permute(Tensor tokens, Tensor routing_map, Tensor? probs=None, int pad_to=16, "
        "int? num_out_rows=None) -> (Tensor, Tensor, Tensor, Tensor)");
  // out (T, H): each token's rows of permuted summed back, weighted by probs when given.
  m.def("moe_unpermute(Tensor permuted, Tensor row_id_map, Tensor? probs=None) -> Tensor");
  // (grad of tokens (T, H), grad of probs (T, E) or undefined without grad_permuted_probs).
  m.def("_moe_permute_backward(Tensor grad_permuted, Tensor? grad_permuted_probs, "
        "Tensor row_id_map) -> (Tensor, Tensor)");
  // (grad of permuted (N, H), its padding rows 0; grad of probs (T, E) when want_probs).
  m.def("_moe_unpermute_backward(Tensor grad_out, Tensor permuted, Tensor row_id_map, "
        "Tensor? probs, bool want_probs) -> (Tensor, Tensor)");
}
