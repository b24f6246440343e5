// CUDA kernels of fk::moe_permute / fk::moe_unpermute and their backward ops: AOT-compiled
// Triton (triton_src/moe_permute.py). The row map is built on the device; the only host
// synchronisation is moe_permute's when no num_out_rows is given (the output's row count).
#include <cstdint>

#include "ops/moe_permute/moe_permute.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using checks::ceil_div;
using runtime::KernelArgs;

constexpr uint32_t kFlagProbsF32 = 2;  // triton_src/moe_permute.py FLAG_PROBS_F32

const runtime::KernelSpec& pick(const char* op, const char* family, const Tensor& like,
                                uint32_t flags = 0) {
  return runtime::family(family).pick(op, like, 0, flags);
}

// The data kernels' flags: aligned rows when H is a multiple of 16 and the (rows, H) tensors
// are 16-byte aligned; float32 probs with 16-bit tokens.
// `probs` is any probs-typed tensor the kernel reads or writes (undefined: none).
uint32_t move_flags(int64_t h, std::initializer_list<const Tensor*> data, const Tensor& like,
                    const Tensor& probs) {
  uint32_t flags = h % 16 == 0 && runtime::aligned16(data) ? runtime::kFlagAligned : 0;
  if (probs.defined() && probs.scalar_type() == kFloat && like.scalar_type() != kFloat) {
    flags |= kFlagProbsF32;
  }
  return flags;
}

// src (n,) int32: t for each row the map points to, -1 for the others (padding).
Tensor row_sources(const char* op, const Tensor& like, const Tensor& row_map, int64_t n) {
  auto src = aten::full({n}, -1.0, kInt, like.device());
  const int64_t t = row_map.size(0), e = row_map.size(1);
  if (t == 0 || e == 0 || n == 0) return src;
  const auto& kern = pick(op, "moe_permute_invert", like);
  KernelArgs args;
  args.ptr(row_map).ptr(src).i64(t).i64(e).i64(n);
  const int64_t nb = ceil_div(t, kern.constexpr_value("BT"));
  runtime::launch(op, kern, like.device(), {nb, ceil_div(e, kern.constexpr_value("BE")), 1},
                  args);
  return src;
}

// out (n, H) = each token's row of x at each of its rows (times probs), padding rows 0;
// pout[row] = pin[t, e] when pout is defined (its padding 0); dw[t, e] = x[t] . other[row]
// when dw is defined.
void scatter_rows(const char* op, const Tensor& x, const Tensor& row_map, const Tensor& src,
                  const std::optional<Tensor>& w, const Tensor& out, const Tensor& pin,
                  const Tensor& pout, const Tensor& other, const Tensor& dw) {
  const int64_t t = x.size(0), h = x.size(1), e = row_map.size(1), n = out.size(0);
  const Tensor& probs = has(w) ? *w : pin;
  const uint32_t flags = move_flags(h, {&x, &out, &other}, x, probs);
  const auto& kern = pick(op, "moe_permute_scatter", x, flags);
  const Tensor& any_p = probs.defined() ? probs : x;  // for the pointers not used
  const int64_t zr = kern.constexpr_value("ZR");
  KernelArgs args;
  args.ptr(x).ptr(row_map).ptr(has(w) ? *w : any_p).ptr(out)
      .ptr(pin.defined() ? pin : any_p).ptr(pout.defined() ? pout : any_p)
      .ptr(other.defined() ? other : out).ptr(dw.defined() ? dw : any_p).ptr(src)
      .i64(t).i64(h).i64(e).i64(n).i32(has(w) ? 1 : 0).i32(pout.defined() ? 1 : 0)
      .i32(dw.defined() ? 1 : 0);
  runtime::launch(op, kern, x.device(), {t + ceil_div(n, zr), 1, 1}, args);
}

// out (T, H) = per token the sum of y at its rows (times probs); dp[t, e] = gpp[row] when
// dp is defined.
void gather_rows(const char* op, const Tensor& y, const Tensor& row_map,
                 const std::optional<Tensor>& w, const Tensor& out, const Tensor& gpp,
                 const Tensor& dp) {
  const int64_t t = row_map.size(0), h = y.size(1), e = row_map.size(1), n = y.size(0);
  if (t == 0) return;
  const Tensor& probs = has(w) ? *w : dp;
  const uint32_t flags = move_flags(h, {&y, &out}, y, probs);
  const auto& kern = pick(op, "moe_unpermute_gather", y, flags);
  const Tensor& any_p = probs.defined() ? probs : out;  // for the pointers not used
  KernelArgs args;
  args.ptr(y).ptr(row_map).ptr(any_p).ptr(out).ptr(gpp.defined() ? gpp : any_p)
      .ptr(dp.defined() ? dp : any_p).i64(t).i64(h).i64(e).i64(n).i32(has(w) ? 1 : 0)
      .i32(dp.defined() ? 1 : 0);
  runtime::launch(op, kern, y.device(), {t, 1, 1}, args);
}

}  // namespace

// Declared in moe_permute.h.
MoeRows moe_rows_cuda(const char* op, const Tensor& x, const Tensor& routing_map,
                      int64_t pad_to, std::optional<int64_t> num_out_rows) {
  const int64_t t = x.size(0), e = routing_map.size(1);
  const Device dev = x.device();
  auto mask = moe_routed_mask(routing_map);
  const bool routes = t > 0 && e > 0;
  // every expert's count is written by the scan kernel when it runs
  auto tpe = routes ? aten::empty({e}, kInt, dev) : aten::zeros({e}, kInt, dev);
  auto row_map = aten::empty({t, e}, kInt, dev);
  // blk (token blocks, E): per block of BT tokens, the routed count of each expert, then its
  // exclusive prefix sum over the blocks (the count and map kernels share their blocks)
  Tensor blk;
  int64_t nb = 0, ne = 0;
  if (routes) {
    const auto& count = pick(op, "moe_permute_count", x);
    const auto& scan = pick(op, "moe_permute_scan", x);
    nb = ceil_div(t, count.constexpr_value("BT"));
    ne = ceil_div(e, count.constexpr_value("BE"));
    blk = aten::empty({nb, e}, kInt, dev);
    KernelArgs a1;
    a1.ptr(mask).ptr(blk).i64(t).i64(e);
    runtime::launch(op, count, dev, {nb, ne, 1}, a1);
    KernelArgs a2;
    a2.ptr(blk).ptr(tpe).i64(nb).i64(e).i32(pad_to);
    runtime::launch(op, scan, dev, {ceil_div(e, scan.constexpr_value("BE")), 1, 1}, a2);
  }
  int64_t n;
  if (num_out_rows.has_value()) {
    n = *num_out_rows;  // no host synchronisation: the map kernel checks the bound below
  } else {
    // one host synchronisation: the row count of the output
    auto total = aten::to(aten::sum_all(tpe, kLong), Device(DeviceType::CPU), kLong);
    n = *static_cast<const int64_t*>(total.data_ptr());
    FK_CHECK(n <= INT32_MAX, op, ": the padded segments need ", n,
             " rows; at most 2^31 - 1 are supported");
  }
  auto src = aten::full({n}, -1.0, kInt, dev);
  if (routes) {
    // whether the padded segments fit in n rows, written by the map kernel
    auto ok = aten::empty({}, kBool, dev);
    KernelArgs a3;
    a3.ptr(mask).ptr(blk).ptr(tpe).ptr(row_map).ptr(n > 0 ? src : row_map).ptr(ok).i64(t)
        .i64(e).i64(n);
    runtime::launch(op, pick(op, "moe_permute_map", x), dev, {nb, ne, 1}, a3);
    if (num_out_rows.has_value()) {
      // a device-side assert when the segments need more rows
      aten::call_n<0>("aten::_assert_async", "msg", ok,
                      str(op, ": the padded segments need more rows than num_out_rows (a "
                          "token routed to more than topk experts, or a bound too small)"));
    }
  } else {
    aten::fill_(row_map, -1.0);  // nothing routed
  }
  return {row_map, tpe, src, n};
}

namespace {

std::tuple<Tensor, Tensor, Tensor, Tensor> moe_permute_cuda(
    Tensor tokens, Tensor routing_map, std::optional<Tensor> probs, int64_t pad_to,
    std::optional<int64_t> num_out_rows) {
  constexpr const char* op = "fk::moe_permute";
  const auto s = check_moe_permute(op, tokens, routing_map, probs, pad_to, num_out_rows);
  const int64_t h = s.hidden;
  const Device dev = tokens.device();
  auto x = aten::contiguous(tokens);
  std::optional<Tensor> p;
  if (has(probs)) p = aten::contiguous(*probs);
  auto [row_map, tpe, src, n] = moe_rows_cuda(op, x, routing_map, pad_to, num_out_rows);
  auto permuted = aten::empty({n, h}, x.scalar_type(), dev);
  Tensor pp;
  if (p) pp = aten::empty({n}, p->scalar_type(), dev);
  if (n > 0) {
    scatter_rows(op, x, row_map, src, std::nullopt, permuted, p ? *p : Tensor(), pp, Tensor(),
                 Tensor());
  }
  return {permuted, pp, row_map, tpe};
}

Tensor moe_unpermute_cuda(Tensor permuted, Tensor row_id_map, std::optional<Tensor> probs) {
  constexpr const char* op = "fk::moe_unpermute";
  const auto s = check_moe_unpermute(op, permuted, row_id_map, probs);
  auto y = aten::contiguous(permuted);
  auto map = aten::contiguous(row_id_map);
  std::optional<Tensor> w;
  if (has(probs)) w = aten::contiguous(*probs);
  auto out = aten::empty({s.tokens, s.hidden}, y.scalar_type(), y.device());
  gather_rows(op, y, map, w, out, Tensor(), Tensor());
  return out;
}

std::tuple<Tensor, Tensor> moe_permute_backward_cuda(Tensor grad_permuted,
                                                     std::optional<Tensor> grad_permuted_probs,
                                                     Tensor row_id_map) {
  constexpr const char* op = "fk::_moe_permute_backward";
  const auto s = check_moe_permute_backward(grad_permuted, grad_permuted_probs, row_id_map);
  auto g = aten::contiguous(grad_permuted);
  auto map = aten::contiguous(row_id_map);
  auto dtokens = aten::empty({s.tokens, s.hidden}, g.scalar_type(), g.device());
  Tensor dprobs, gpp;
  if (has(grad_permuted_probs)) {
    gpp = aten::contiguous(*grad_permuted_probs);
    // the kernel's probs-typed pointers are float32 or the tokens' dtype
    if (gpp.scalar_type() != kFloat && gpp.scalar_type() != g.scalar_type()) {
      gpp = aten::to(gpp, kFloat);
    }
    dprobs = aten::empty({s.tokens, s.experts}, gpp.scalar_type(), g.device());
  }
  gather_rows(op, g, map, std::nullopt, dtokens, gpp, dprobs);
  if (dprobs.defined()) dprobs = aten::to(dprobs, grad_permuted_probs->scalar_type());
  return {dtokens, dprobs};
}

std::tuple<Tensor, Tensor> moe_unpermute_backward_cuda(Tensor grad_out, Tensor permuted,
                                                       Tensor row_id_map,
                                                       std::optional<Tensor> probs,
                                                       bool want_probs) {
  constexpr const char* op = "fk::_moe_unpermute_backward";
  const auto s = check_moe_unpermute_backward(grad_out, permuted, row_id_map, probs);
  const int64_t n = permuted.size(0);
  auto g = aten::contiguous(grad_out);
  auto map = aten::contiguous(row_id_map);
  std::optional<Tensor> w;
  if (has(probs)) w = aten::contiguous(*probs);
  auto dperm = aten::empty({n, s.hidden}, g.scalar_type(), g.device());
  Tensor dprobs, y;
  if (want_probs && w) {
    dprobs = aten::empty({s.tokens, s.experts}, w->scalar_type(), g.device());
    y = aten::contiguous(permuted);
  }
  if (n == 0) {
    if (dprobs.defined()) aten::zero_(dprobs);
    return {dperm, dprobs};
  }
  auto src = row_sources(op, g, map, n);
  scatter_rows(op, g, map, src, w, dperm, Tensor(), Tensor(), y, dprobs);
  return {dperm, dprobs};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("moe_permute", TORCH_BOX(&fk::ops::moe_permute_cuda));
  m.impl("moe_unpermute", TORCH_BOX(&fk::ops::moe_unpermute_cuda));
  m.impl("_moe_permute_backward", TORCH_BOX(&fk::ops::moe_permute_backward_cuda));
  m.impl("_moe_unpermute_backward", TORCH_BOX(&fk::ops::moe_unpermute_backward_cuda));
}
