// CPU reference of fk::fp8_quantize in ATen operators (through the stable dispatcher): the
// format of python/fk/ops/fp8_quantize.py, block by block on a zero-padded fp32 copy of x.
#include <cmath>

#include "ops/fp8_quantize/fp8_quantize.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

using checks::ceil_div;

Tensor op1(const char* name, const Tensor& t) { return aten::call(name, "", t); }

// Scales of blocks of absolute maximum `amax` (a NaN read as inf), as the kernel computes
// them: max(amax / 448, 2^-126) in fp32, 1 for amax 0, rounded up to a power of two
// when pow2 (in float64, where log2 is exact enough), NaN for amax inf.
Tensor block_scales(const Tensor& amax, bool pow2) {
  auto s = aten::maximum(aten::div(amax, aten::scalar(448.0)),
                         aten::scalar(std::ldexp(1.0, -126)));
  s = aten::where(aten::eq(amax, aten::scalar(0.0)), aten::scalar(1.0), s);
  if (pow2) {
    auto p = op1("aten::exp2", op1("aten::ceil", op1("aten::log2", aten::to(s, kDouble))));
    s = aten::to(p, kFloat);
  }
  return aten::where(aten::eq(amax, aten::scalar(INFINITY)), aten::scalar(NAN), s);
}

// |x| with NaN read as inf.
Tensor abs_nan_inf(const Tensor& x) {
  auto a = op1("aten::abs", x);
  return aten::where(aten::ne(a, a), aten::scalar(INFINITY), a);
}

// x times the fp32 reciprocal of s, clamped to [-448, 448] (NaN kept), rounded to
// float8_e4m3fn.
Tensor to_fp8(const Tensor& x, const Tensor& s) {
  auto q = aten::mul(x, op1("aten::reciprocal", s));
  q = aten::maximum(aten::minimum(q, aten::scalar(448.0)), aten::scalar(-448.0));
  return aten::contiguous(aten::to(q, kFloat8e4m3));
}

// x (r, c) fp32 zero-padded to (rp, cp).
Tensor padded(const Tensor& x, int64_t rp, int64_t cp) {
  auto out = aten::zeros({rp, cp}, kFloat, x.device());
  aten::copy_(aten::narrow(aten::narrow(out, 0, 0, x.size(0)), 1, 0, x.size(1)), x);
  return out;
}

// 128 x 128 blocks: (data (r, c), scales (ceil(r / 128), ceil(c / 128))).
std::pair<Tensor, Tensor> quantize_tiles(const Tensor& x, bool pow2) {
  const int64_t r = x.size(0), c = x.size(1);
  const int64_t nr = ceil_div(r, kFp8Block), nc = ceil_div(c, kFp8Block);
  auto xb = aten::reshape(padded(x, nr * kFp8Block, nc * kFp8Block),
                          {nr, kFp8Block, nc, kFp8Block});
  auto s = block_scales(aten::amax(abs_nan_inf(xb), {1, 3}), pow2);  // (nr, nc)
  auto q = to_fp8(xb, aten::reshape(s, {nr, 1, nc, 1}));
  q = aten::reshape(q, {nr * kFp8Block, nc * kFp8Block});
  return {aten::contiguous(aten::narrow(aten::narrow(q, 0, 0, r), 1, 0, c)), s};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fp8_quantize_cpu(Tensor x, int64_t block_rows,
                                                           std::string layout,
                                                           bool pow2_scales) {
  const auto want = check_fp8_quantize(x, block_rows, layout);
  auto xf = aten::to(x, kFloat);
  Tensor q, s, qt, st;
  if (block_rows == 1) {
    if (want.rowwise) std::tie(q, s) = fp8_quantize_rows(xf, pow2_scales);
    if (want.columnwise) {
      std::tie(qt, st) = fp8_quantize_rows(aten::contiguous(aten::t(xf)), pow2_scales);
    }
  } else {
    std::tie(q, s) = quantize_tiles(xf, pow2_scales);
    if (want.columnwise) {
      // Copies, never views: t() of a matrix with a dim of 1 is already contiguous, and the
      // op's outputs must not share memory.
      qt = aten::clone(aten::t(q));
      st = aten::clone(aten::t(s));
    }
    if (!want.rowwise) q = s = Tensor();
  }
  return {q, s, qt, st};
}

}  // namespace

// Declared in fp8_quantize.h (shared with the ops that fuse quantization).
std::pair<Tensor, Tensor> fp8_quantize_rows(const Tensor& x, bool pow2) {
  const int64_t r = x.size(0), c = x.size(1), nc = ceil_div(c, kFp8Block);
  auto xb = aten::reshape(padded(x, r, nc * kFp8Block), {r, nc, kFp8Block});
  auto s = block_scales(aten::amax(abs_nan_inf(xb), {2}), pow2);  // (r, nc)
  auto q = aten::reshape(to_fp8(xb, aten::unsqueeze(s, 2)), {r, nc * kFp8Block});
  return {aten::contiguous(aten::narrow(q, 1, 0, c)), aten::contiguous(aten::t(s))};
}

// Declared in fp8_quantize.h.
std::vector<int64_t> segment_counts(const Tensor& tokens_per_expert) {
  auto c = aten::contiguous(aten::to(tokens_per_expert, kLong));
  const auto* p = static_cast<const int64_t*>(c.data_ptr());
  return std::vector<int64_t>(p, p + c.numel());
}

// Declared in fp8_quantize.h (the MoE ops' column-wise copy).
std::pair<Tensor, Tensor> fp8_quantize_segments(const Tensor& x,
                                                const std::vector<int64_t>& counts, bool pow2) {
  const int64_t m = x.size(0), k = x.size(1);
  auto xt = aten::contiguous(aten::t(x));  // (K, M)
  auto qt = aten::zeros({k, m}, kFloat8e4m3, x.device());
  auto st = aten::full({moe_scale_rows(m, static_cast<int64_t>(counts.size())), k}, 1.0,
                       kFloat, x.device());
  int64_t off = 0, blk = 0;
  for (int64_t c : counts) {
    if (c == 0) continue;
    auto [q, s] = fp8_quantize_rows(aten::contiguous(aten::narrow(xt, 1, off, c)), pow2);
    aten::copy_(aten::narrow(qt, 1, off, c), q);
    aten::copy_(aten::narrow(st, 0, blk, ceil_div(c, kFp8Block)), s);
    off += c;
    blk += ceil_div(c, kFp8Block);
  }
  return {qt, st};
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("fp8_quantize", TORCH_BOX(&fk::ops::fp8_quantize_cpu));
}
