// CPU reference of fk::moe_permute / fk::moe_unpermute and their backward ops: the row map
// in plain loops, the data moved with ATen's index operators (fp32 accumulation; float64 for
// float64 inputs).
#include <vector>

#include "ops/moe_permute/moe_permute.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// The routed (token, expert) pairs of a row map, token-major, experts in increasing order:
// destination rows, tokens, and flat (t * E + e) indices, as int64 CPU tensors.
struct Routed {
  Tensor rows, tokens, flat;
  int64_t count;
};

Tensor long_tensor(const std::vector<int64_t>& v) {
  auto t = aten::empty({static_cast<int64_t>(v.size())}, kLong, Device(DeviceType::CPU));
  auto* p = static_cast<int64_t*>(t.data_ptr());
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  return t;
}

// Every entry must be -1 or a row of permuted (n rows).
Routed routed_pairs(const char* op, const Tensor& row_id_map, int64_t n) {
  auto map = aten::contiguous(row_id_map);
  const int64_t t = map.size(0), e = map.size(1);
  const auto* r = static_cast<const int32_t*>(map.data_ptr());
  std::vector<int64_t> rows, toks, flat;
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < e; ++j) {
      const int64_t v = r[i * e + j];
      FK_CHECK(v >= -1 && v < n, op, ": row_id_map[", i, ", ", j, "] is ", v,
               ", not -1 or a row of permuted (", n, " rows)");
      if (v < 0) continue;
      rows.push_back(v);
      toks.push_back(i);
      flat.push_back(i * e + j);
    }
  }
  const auto count = static_cast<int64_t>(rows.size());
  return {long_tensor(rows), long_tensor(toks), long_tensor(flat), count};
}

// dst (rows, ...) with dst[index[i]] = src[i].
Tensor index_copy(const Tensor& dst, const Tensor& index, const Tensor& src) {
  return aten::call("aten::index_copy", "", dst, int64_t{0}, index, src);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> moe_permute_cpu(
    Tensor tokens, Tensor routing_map, std::optional<Tensor> probs, int64_t pad_to,
    std::optional<int64_t> num_out_rows) {
  constexpr const char* op = "fk::moe_permute";
  check_moe_permute(op, tokens, routing_map, probs, pad_to, num_out_rows);
  return moe_permute_reference(op, tokens, routing_map, probs, pad_to, num_out_rows);
}

// sum over each token's routed rows of y[row] (times its weight), accumulated in acc dtype.
Tensor gather_sum(const Tensor& y, const Routed& r, const std::optional<Tensor>& probs,
                  int64_t t) {
  const auto acc = checks::acc_type(y);
  auto contrib = aten::to(aten::index_select(y, 0, r.rows), acc);
  if (has(probs)) {
    const int64_t e = probs->size(1);
    auto w = aten::index_select(aten::reshape(*probs, {t * e}), 0, r.flat);
    contrib = contrib * aten::unsqueeze(aten::to(w, acc), 1);
  }
  auto out = aten::zeros({t, y.size(1)}, acc, y.device());
  auto index = aten::expand(aten::unsqueeze(r.tokens, 1), {r.count, y.size(1)});
  aten::scatter_add_(out, 0, index, contrib);
  return aten::to(out, y.scalar_type());
}

Tensor moe_unpermute_cpu(Tensor permuted, Tensor row_id_map, std::optional<Tensor> probs) {
  constexpr const char* op = "fk::moe_unpermute";
  const auto s = check_moe_unpermute(op, permuted, row_id_map, probs);
  const Routed r = routed_pairs(op, row_id_map, permuted.size(0));
  return gather_sum(permuted, r, probs, s.tokens);
}

std::tuple<Tensor, Tensor> moe_permute_backward_cpu(Tensor grad_permuted,
                                                    std::optional<Tensor> grad_permuted_probs,
                                                    Tensor row_id_map) {
  const auto s = check_moe_permute_backward(grad_permuted, grad_permuted_probs, row_id_map);
  const Routed r =
      routed_pairs("fk::_moe_permute_backward", row_id_map, grad_permuted.size(0));
  auto dtokens = gather_sum(grad_permuted, r, std::nullopt, s.tokens);
  Tensor dprobs;
  if (has(grad_permuted_probs)) {
    dprobs = aten::zeros({s.tokens * s.experts}, grad_permuted_probs->scalar_type(),
                         grad_permuted.device());
    dprobs = index_copy(dprobs, r.flat, aten::index_select(*grad_permuted_probs, 0, r.rows));
    dprobs = aten::reshape(dprobs, {s.tokens, s.experts});
  }
  return {dtokens, dprobs};
}

std::tuple<Tensor, Tensor> moe_unpermute_backward_cpu(Tensor grad_out, Tensor permuted,
                                                      Tensor row_id_map,
                                                      std::optional<Tensor> probs,
                                                      bool want_probs) {
  const auto s = check_moe_unpermute_backward(grad_out, permuted, row_id_map, probs);
  const Routed r =
      routed_pairs("fk::_moe_unpermute_backward", row_id_map, permuted.size(0));
  const auto acc = checks::acc_type(grad_out);
  auto g = aten::to(aten::index_select(grad_out, 0, r.tokens), acc);  // (routed, H)
  Tensor w;
  if (has(probs)) {
    w = aten::to(aten::index_select(aten::reshape(*probs, {s.tokens * s.experts}), 0, r.flat),
                 acc);
  }
  auto dperm = aten::zeros({permuted.size(0), s.hidden}, grad_out.scalar_type(),
                           grad_out.device());
  auto scaled = has(probs) ? g * aten::unsqueeze(w, 1) : g;
  dperm = index_copy(dperm, r.rows, aten::to(scaled, grad_out.scalar_type()));
  Tensor dprobs;
  if (want_probs && has(probs)) {
    auto y = aten::to(aten::index_select(permuted, 0, r.rows), acc);
    auto dots = aten::sum(g * y, {1});
    dprobs = aten::zeros({s.tokens * s.experts}, probs->scalar_type(), grad_out.device());
    dprobs = index_copy(dprobs, r.flat, aten::to(dots, probs->scalar_type()));
    dprobs = aten::reshape(dprobs, {s.tokens, s.experts});
  }
  return {dperm, dprobs};
}

}  // namespace

// Declared in moe_permute.h (the CPU backend of moe_permute's FP8 form builds on it).
std::tuple<Tensor, Tensor, Tensor, Tensor> moe_permute_reference(
    const char* op, const Tensor& tokens, const Tensor& routing_map,
    const std::optional<Tensor>& probs, int64_t pad_to, std::optional<int64_t> num_out_rows) {
  const int64_t t = tokens.size(0), e = routing_map.size(1);
  auto mask = moe_routed_mask(routing_map);
  const auto* m = static_cast<const bool*>(mask.data_ptr());
  // per expert: its routed tokens, its segment's padded size and start
  std::vector<int64_t> count(e, 0), start(e, 0);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < e; ++j) count[j] += m[i * e + j] ? 1 : 0;
  }
  auto tpe = aten::empty({e}, kInt, tokens.device());
  auto* tp = static_cast<int32_t*>(tpe.data_ptr());
  int64_t total = 0;
  for (int64_t j = 0; j < e; ++j) {
    start[j] = total;
    tp[j] = static_cast<int32_t>(checks::ceil_div(count[j], pad_to) * pad_to);
    total += tp[j];
  }
  const int64_t n = num_out_rows.value_or(total);
  FK_CHECK(total <= n, moe_bound_message(op, total, n));
  FK_CHECK(n <= INT32_MAX, op, ": the padded segments need ", n,
           " rows; at most 2^31 - 1 are supported");
  auto row_map = aten::empty({t, e}, kInt, tokens.device());
  auto* rm = static_cast<int32_t*>(row_map.data_ptr());
  std::vector<int64_t> next(start);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < e; ++j) {
      rm[i * e + j] = m[i * e + j] ? static_cast<int32_t>(next[j]++) : -1;
    }
  }
  const Routed r = routed_pairs(op, row_map, n);
  auto permuted = aten::zeros({n, tokens.size(1)}, tokens.scalar_type(), tokens.device());
  permuted = index_copy(permuted, r.rows, aten::index_select(tokens, 0, r.tokens));
  Tensor pp;
  if (has(probs)) {
    pp = aten::zeros({n}, probs->scalar_type(), tokens.device());
    pp = index_copy(pp, r.rows, aten::index_select(aten::reshape(*probs, {t * e}), 0, r.flat));
  }
  return {permuted, pp, row_map, tpe};
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("moe_permute", TORCH_BOX(&fk::ops::moe_permute_cpu));
  m.impl("moe_unpermute", TORCH_BOX(&fk::ops::moe_unpermute_cpu));
  m.impl("_moe_permute_backward", TORCH_BOX(&fk::ops::moe_permute_backward_cpu));
  m.impl("_moe_unpermute_backward", TORCH_BOX(&fk::ops::moe_unpermute_backward_cpu));
}
