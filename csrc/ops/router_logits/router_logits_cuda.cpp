// CUDA kernels of fk::router_logits: AOT-compiled Triton (triton_src/router_logits.py), one
// GEMM kernel in three variants per dtype (forward, grad x, grad weight). Inputs are made
// contiguous (a copy only for inputs that are not); no float32 copy of x or the weight is
// made. The grad-weight product reduces over the tokens in `splits` slices of a float32
// buffer, summed in a fixed order by torch (deterministic).
#include <algorithm>

#include "ops/router_logits/router_logits.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// triton_src/router_logits.py PRODUCT_FLAGS
constexpr uint32_t kFwd = 2, kDx = 4, kDw = 8;

// Contiguous (rows, last dim) view of t (a copy only when t is not contiguous).
Tensor as_rows(const Tensor& t) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) m *= t.size(d);
  return aten::view(aten::contiguous(t), {m, t.size(-1)});
}

const runtime::KernelFamily& kernels() {
  static const auto& fam = runtime::family("router_gemm");
  return fam;
}

// C = A @ B through the variant of `product` for x's dtype: grid of output tiles times
// `splits` slices of K (k_per_split rows each).
void gemm(const char* op, uint32_t product, const Tensor& x, const Tensor& a, const Tensor& b,
          const Tensor& c, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
          int64_t ldc, int64_t splits, int64_t k_per_split) {
  // (triton_src/router_logits.py's _ALIGNED_INTS: the strides and the sizes.)
  const bool aligned = lda % 16 == 0 && ldb % 16 == 0 && ldc % 16 == 0 && m % 16 == 0 &&
                       n % 16 == 0 && k % 16 == 0 && k_per_split % 16 == 0 &&
                       runtime::aligned16({&a, &b, &c});
  const auto& kern = kernels().pick(op, x, 0, product | (aligned ? runtime::kFlagAligned : 0));
  KernelArgs args;
  args.ptr(a).ptr(b).ptr(c).i32(m).i32(n).i32(k).i32(lda).i32(ldb).i32(ldc).i32(k_per_split);
  const int64_t tiles = checks::ceil_div(m, kern.constexpr_value("BLOCK_M")) *
                        checks::ceil_div(n, kern.constexpr_value("BLOCK_N"));
  runtime::launch(op, kern, x.device(), {tiles, splits, 1}, args);
}

Tensor router_logits_cuda(Tensor x, Tensor weight, std::optional<ScalarType> weight_grad_dtype) {
  constexpr const char* op = "fk::router_logits";
  check_router_logits(x, weight, weight_grad_dtype);
  auto x2 = as_rows(x);
  auto w = aten::contiguous(weight);
  const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
  Shape sizes = sizes_vec(x);
  sizes.back() = n;
  auto out = aten::empty(sizes, kFloat, x.device());
  if (m == 0 || n == 0) return out;
  if (k == 0) {
    aten::zero_(out);
    return out;
  }
  gemm(op, kFwd, x2, x2, w, out, m, n, k, k, k, n, 1, k);
  return out;
}

std::tuple<Tensor, Tensor> router_logits_backward_cuda(Tensor grad_logits, Tensor x,
                                                       Tensor weight,
                                                       std::vector<bool> output_mask,
                                                       std::optional<ScalarType> weight_grad_dtype) {
  constexpr const char* op = "fk::_router_logits_backward";
  check_router_logits_backward(grad_logits, x, weight, weight_grad_dtype);
  auto x2 = as_rows(x);
  auto w = aten::contiguous(weight);
  auto g = as_rows(grad_logits);
  const int64_t t = x2.size(0), h = x2.size(1), e = w.size(0);
  Tensor dx, dw;
  if (output_mask[0]) {
    dx = aten::empty(sizes_vec(x), x.scalar_type(), x.device());
    if (e == 0) {
      aten::zero_(dx);
    } else if (t > 0 && h > 0) {  // dx (t, h) = g (t, e) @ w (e, h)
      gemm(op, kDx, x2, g, w, dx, t, h, e, e, h, h, 1, e);
    }
  }
  if (output_mask[1]) {
    const ScalarType dt = router_weight_grad_dtype(weight, weight_grad_dtype);
    if (t == 0 || e == 0 || h == 0) {
      dw = aten::zeros({e, h}, dt, x.device());
    } else {
      // dw (e, h) = g^T (e, t) @ x (t, h): split the t rows so that about two programs per
      // SM run, each slice at least 4 K steps deep.
      const auto& kern = kernels().pick(op, x2, 0, kDw);
      const int64_t bk = kern.constexpr_value("BLOCK_K");
      const int64_t tiles = checks::ceil_div(e, kern.constexpr_value("BLOCK_M")) *
                            checks::ceil_div(h, kern.constexpr_value("BLOCK_N"));
      const int64_t sms = runtime::device_sm_count(x.device().index());
      int64_t splits = std::max<int64_t>(1, std::min(checks::ceil_div(2 * sms, tiles),
                                                     checks::ceil_div(t, 4 * bk)));
      const int64_t k_per_split = checks::ceil_div(checks::ceil_div(t, splits), bk) * bk;
      splits = checks::ceil_div(t, k_per_split);
      if (splits == 1) {
        auto out = aten::empty({e, h}, kFloat, x.device());
        gemm(op, kDw, x2, g, x2, out, e, h, t, e, h, h, 1, k_per_split);
        dw = aten::to(out, dt);
      } else {
        auto parts = aten::empty({splits, e, h}, kFloat, x.device());
        gemm(op, kDw, x2, g, x2, parts, e, h, t, e, h, h, splits, k_per_split);
        dw = aten::to(aten::sum(parts, {0}), dt);  // fp32 sum, one rounding
      }
    }
  }
  return {dx, dw};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("router_logits", TORCH_BOX(&fk::ops::router_logits_cuda));
  m.impl("_router_logits_backward", TORCH_BOX(&fk::ops::router_logits_backward_cuda));
}
