// The chunked algorithm of fk::fused_linear_cross_entropy in ATen operators (through the
// stable dispatcher), registered for CPU and CUDA alike: the matmuls are ATen's (cuBLAS on
// CUDA), the cross entropy of each chunk is cross_entropy_rows (the Triton kernels on CUDA,
// the reference on CPU).
//
// Per chunk of rows: logits = x_c @ W^T (+ b) into one reused (rows, V) buffer; the
// cross entropy kernel writes the loss rows and the logits' gradient into that buffer;
// grad_x_c = G @ W, grad_W (+)= G^T @ x_c (the first chunk writes, the others add; in
// float32 with accum_dtype=float32), grad_b (+)= column sums of G. For a mean the
// denominators are computed once, on the device, before the loop.
//
// The stable dispatcher passes no Scalar argument, so addmm (beta, alpha) is out of reach:
// a product is added to an accumulator with aten::linear.out(out, a, w, bias = out), which
// ATen runs as addmm_out(out, out, a, w^T) with beta 1 (copying out onto itself is a no-op).
#include <algorithm>
#include <vector>

#include "ops/fused_linear_cross_entropy/fused_linear_cross_entropy.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// grad_weight = sum over chunks of G_c^T @ x_c, in `acc`, returned in the weight's dtype.
class WeightGradSum {
 public:
  WeightGradSum(const Tensor& x, const Tensor& weight, ScalarType acc, int64_t chunk_rows)
      : weight_(weight), acc_(acc), v_(weight.size(0)), h_(weight.size(1)) {
    blocked_ = x.is_cuda() && acc != x.scalar_type();
    if (blocked_) {
      // Float32 sums of 16-bit products on CUDA: cuBLAS writes a float32 product of the
      // 16-bit operands (mm.dtype_out), but has no Scalar-free way to add one to a float32
      // accumulator. So the sum is kept in blocks of rows of V, and each later chunk writes
      // a block's product into a float32 temporary that aten::add sums with the block (a
      // new tensor that replaces it). Against an in-place accumulating GEMM that is two
      // more passes over a float32 grad_weight per chunk, and two float32 blocks of extra
      // memory, sized together no larger than the chunk's logits buffer.
      const int64_t logits_bytes = chunk_rows * v_ * static_cast<int64_t>(x.element_size());
      block_ = std::clamp<int64_t>(logits_bytes / (2 * 4 * std::max<int64_t>(h_, 1)), 1, v_);
    } else {
      sum_ = aten::empty({v_, h_}, acc, weight.device());
    }
  }

  // Adds G^T @ xs (G: the chunk's (r, V) logits' gradient, xs: its (r, H) rows of x).
  void add(const Tensor& g, const Tensor& xs, bool first) {
    const auto gt = aten::t(g);
    if (blocked_) return add_blocked(gt, xs, first);
    if (acc_ == xs.scalar_type()) return accumulate(gt, xs, first);
    // CPU: float32 sums of 16-bit operands, multiplied in float32.
    accumulate(aten::to(gt, acc_), aten::to(xs, acc_), first);
  }

  Tensor result() {
    if (!blocked_) return aten::to(sum_, weight_.scalar_type());
    auto out = aten::empty({v_, h_}, weight_.scalar_type(), weight_.device());
    tmp_ = Tensor();
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const int64_t off = static_cast<int64_t>(i) * block_;
      aten::copy_(aten::narrow(out, 0, off, blocks_[i].size(0)), blocks_[i]);
      blocks_[i] = Tensor();
    }
    return out;
  }

 private:
  void accumulate(const Tensor& a, const Tensor& b, bool first) {
    if (first) {
      aten::mm_out(sum_, a, b);
    } else {
      aten::linear_out(sum_, a, aten::t(b), sum_);  // sum_ += a @ b
    }
  }

  void add_blocked(const Tensor& gt, const Tensor& xs, bool first) {
    if (!first && !tmp_.defined()) tmp_ = aten::empty({block_, h_}, kFloat, xs.device());
    for (int64_t off = 0, i = 0; off < v_; off += block_, ++i) {
      const int64_t len = std::min(block_, v_ - off);
      const auto a = aten::narrow(gt, 0, off, len);
      if (first) {
        blocks_.push_back(aten::empty({len, h_}, kFloat, xs.device()));
        aten::mm_out_dtype(blocks_.back(), a, xs);
      } else {
        const auto prod = aten::narrow(tmp_, 0, 0, len);
        aten::mm_out_dtype(prod, a, xs);
        blocks_[i] = aten::add(blocks_[i], prod);
      }
    }
  }

  Tensor weight_;
  ScalarType acc_;
  int64_t v_, h_;
  bool blocked_ = false;
  Tensor sum_;                  // not blocked: the (V, H) sum in acc_
  int64_t block_ = 0;           // blocked: rows of V per block
  std::vector<Tensor> blocks_;  // blocked: the float32 sums, block_ rows each (the last fewer)
  Tensor tmp_;                  // blocked: one block's product
};

}  // namespace

FlceResult fused_linear_cross_entropy_forward_impl(
    Tensor x, Tensor weight, Tensor target, std::optional<Tensor> bias,
    std::optional<Tensor> ce_weight, int64_t ignore_index, double label_smoothing,
    std::string reduction, double lse_square_scale, std::optional<double> softcap,
    std::optional<int64_t> chunk_size, std::optional<ScalarType> accum_dtype,
    std::vector<bool> grad_mask, std::optional<Tensor> grad_rows, bool use_token_scaling,
    bool extras) {
  auto o = check_fused_linear_cross_entropy(x, weight, target, bias, ce_weight, ignore_index,
                                            label_smoothing, reduction, lse_square_scale,
                                            softcap, chunk_size, accum_dtype);
  o.token_scaling = use_token_scaling;
  const int64_t n = x.size(0), h = x.size(1), v = weight.size(0);
  const auto dtype = ce_loss_dtype(x);
  const bool has_bias = has(bias);
  const bool need_x = grad_mask[0], need_w = grad_mask[1], need_b = grad_mask[2] && has_bias;
  const bool any_grad = need_x || need_w || need_b;
  const auto acc =
      x.scalar_type() == kDouble ? kDouble : accum_dtype.value_or(weight.scalar_type());
  auto xc = aten::contiguous(x);
  auto wc = aten::contiguous(weight);
  auto t = aten::contiguous(target);
  Tensor b = has_bias ? aten::contiguous(*bias) : Tensor();
  Tensor cw;
  if (has(ce_weight)) cw = aten::contiguous(aten::to(*ce_weight, dtype));
  Tensor g_rows;
  if (has(grad_rows)) {
    g_rows = aten::contiguous(aten::to(*grad_rows, x.device(), dtype));
    FK_CHECK(g_rows.dim() == 1 && g_rows.size(0) == n,
             "fk::_fused_linear_cross_entropy_forward: grad_rows must have shape (", n,
             ",), got ", shape_of(g_rows));
  }

  auto loss_rows = aten::empty({n}, dtype, x.device());
  auto z_rows = aten::empty({n}, dtype, x.device());
  Tensor gx, gw, gb, pred, accuracy;
  if (need_x) gx = aten::empty({n, h}, x.scalar_type(), x.device());
  if (extras) pred = aten::empty({n}, kLong, x.device());
  if (n == 0) {
    // No rows: zero gradients.
    if (need_w) gw = aten::zeros({v, h}, weight.scalar_type(), weight.device());
    if (need_b) gb = aten::zeros({v}, b.scalar_type(), b.device());
    if (extras) accuracy = cross_entropy_accuracy(pred, t, ignore_index, o.reduction);
    auto [loss, z] = cross_entropy_reduce(loss_rows, z_rows, o.reduction);
    return {loss, z, gx, gw, gb, accuracy, pred};
  }

  const auto den = cross_entropy_den(t, cw, v, ignore_index, dtype, o.reduction);
  check_targets_in_range("fk::fused_linear_cross_entropy", t, v, ignore_index, den,
                         o.reduction);
  const int64_t rows = flce_chunk_rows(n, h, v, chunk_size);
  auto buf = aten::empty({rows, v}, x.scalar_type(), x.device());
  auto wt = aten::t(wc);
  std::optional<WeightGradSum> w_sum;
  if (need_w) w_sum.emplace(x, weight, acc, rows);
  if (need_b) gb = aten::empty({v}, acc, b.device());  // the first chunk writes it
  for (int64_t s = 0; s < n; s += rows) {
    const int64_t r = std::min(rows, n - s);
    auto xs = aten::narrow(xc, 0, s, r);
    auto lg = aten::narrow(buf, 0, 0, r);
    if (has_bias) {
      aten::linear_out(lg, xs, wc, b);
    } else {
      aten::mm_out(lg, xs, wt);
    }
    cross_entropy_rows(lg, any_grad ? lg : Tensor(), aten::narrow(t, 0, s, r), cw, den,
                       aten::narrow(loss_rows, 0, s, r), aten::narrow(z_rows, 0, s, r),
                       extras ? aten::narrow(pred, 0, s, r) : Tensor(), o);
    if (!any_grad) continue;
    if (g_rows.defined()) cross_entropy_scale(lg, lg, aten::narrow(g_rows, 0, s, r));
    if (need_x) aten::mm_out(aten::narrow(gx, 0, s, r), lg, wc);
    if (need_w) w_sum->add(lg, xs, s == 0);
    if (need_b) {
      if (s == 0) {
        aten::sum_out(gb, lg, {0}, false, acc);
      } else {
        aten::add_(gb, aten::sum(lg, {0}, false, acc));
      }
    }
  }
  buf = Tensor();
  if (need_w) gw = w_sum->result();
  if (need_b) gb = aten::to(gb, b.scalar_type());
  if (extras) accuracy = cross_entropy_accuracy(pred, t, ignore_index, o.reduction);
  auto [loss, z] = cross_entropy_reduce(loss_rows, z_rows, o.reduction);
  return {loss, z, gx, gw, gb, accuracy, pred};
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_fused_linear_cross_entropy_forward",
         TORCH_BOX(&fk::ops::fused_linear_cross_entropy_forward_impl));
}

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_fused_linear_cross_entropy_forward",
         TORCH_BOX(&fk::ops::fused_linear_cross_entropy_forward_impl));
}
