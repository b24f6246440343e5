// The chunked algorithm of fk::fused_linear_cross_entropy in ATen, registered for CPU and
// CUDA alike: the matmuls are ATen's (cuBLAS on CUDA), the cross entropy of each chunk is
// cross_entropy_rows (the Triton kernels on CUDA, the reference on CPU).
//
// Per chunk of rows: logits = x_c @ W^T (+ b) into one reused (rows, V) buffer; the
// cross entropy kernel writes the loss rows and the logits' gradient into that buffer;
// grad_x_c = G @ W, grad_W (+)= G^T @ x_c (the first chunk writes, the others add; in
// float32 with accum_dtype=float32), grad_b (+)= column sums of G. For a mean the
// denominators are computed once, on the device, before the loop.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/fused_linear_cross_entropy/fused_linear_cross_entropy.h"

namespace fk::ops {
namespace {

// acc (+)= a @ b in acc's dtype, a and b of the logits' dtype.
void accumulate_mm(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool first) {
  if (acc.scalar_type() == a.scalar_type()) {
    if (first) {
      at::mm_out(acc, a, b);
    } else {
      acc.addmm_(a, b);
    }
  } else if (acc.is_cuda()) {
    // float32 accumulation of a bf16 / fp16 product, in cuBLAS.
    if (first) {
      at::mm_out(acc, a, b, acc.scalar_type());
    } else {
      at::addmm_out(acc, acc, a, b, acc.scalar_type());
    }
  } else {
    auto prod = at::mm(a.to(acc.scalar_type()), b.to(acc.scalar_type()));
    if (first) {
      acc.copy_(prod);
    } else {
      acc.add_(prod);
    }
  }
}

FlceResult fused_linear_cross_entropy_forward_impl(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype, std::array<bool, 3> grad_mask,
    const std::optional<at::Tensor>& grad_rows) {
  const auto o = check_fused_linear_cross_entropy(x, weight, target, bias, ce_weight,
                                                  ignore_index, label_smoothing, reduction,
                                                  lse_square_scale, softcap, chunk_size,
                                                  accum_dtype);
  const int64_t n = x.size(0), h = x.size(1), v = weight.size(0);
  const auto dtype = ce_loss_dtype(x);
  const bool has_bias = bias.has_value() && bias->defined();
  const bool need_x = grad_mask[0], need_w = grad_mask[1], need_b = grad_mask[2] && has_bias;
  const bool any_grad = need_x || need_w || need_b;
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble
                                                  : accum_dtype.value_or(weight.scalar_type());
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto t = target.contiguous();
  at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  at::Tensor cw;
  if (ce_weight.has_value() && ce_weight->defined()) cw = ce_weight->to(dtype).contiguous();
  at::Tensor g_rows;
  if (grad_rows.has_value() && grad_rows->defined()) {
    g_rows = grad_rows->to(x.device(), dtype).contiguous();
    TORCH_CHECK(g_rows.dim() == 1 && g_rows.size(0) == n,
                "fk::_fused_linear_cross_entropy_forward: grad_rows must have shape (", n,
                ",), got ", g_rows.sizes());
  }

  auto loss_rows = at::empty({n}, x.options().dtype(dtype));
  auto z_rows = at::empty({n}, x.options().dtype(dtype));
  at::Tensor gx, gw, gb;
  if (need_x) gx = at::empty({n, h}, x.options());
  // No rows: zero gradients; otherwise the first chunk writes them.
  if (need_w) gw = at::empty({v, h}, weight.options().dtype(acc));
  if (need_b) gb = at::empty({v}, b.options().dtype(acc));
  if (n == 0) {
    if (need_w) gw.zero_();
    if (need_b) gb.zero_();
  }

  if (n > 0) {
    const auto den = cross_entropy_den(t, cw, v, ignore_index, dtype, o.reduction);
    const int64_t rows = flce_chunk_rows(n, h, v, chunk_size);
    auto buf = at::empty({rows, v}, x.options());
    auto wt = wc.t();
    for (int64_t s = 0; s < n; s += rows) {
      const int64_t r = std::min(rows, n - s);
      auto xs = xc.narrow(0, s, r);
      auto lg = buf.narrow(0, 0, r);
      if (has_bias) {
        at::addmm_out(lg, b, xs, wt);
      } else {
        at::mm_out(lg, xs, wt);
      }
      cross_entropy_rows(lg, any_grad ? lg : at::Tensor(), t.narrow(0, s, r), cw, den,
                         loss_rows.narrow(0, s, r), z_rows.narrow(0, s, r), o);
      if (!any_grad) continue;
      if (g_rows.defined()) cross_entropy_scale(lg, lg, g_rows.narrow(0, s, r));
      if (need_x) {
        auto gxs = gx.narrow(0, s, r);
        at::mm_out(gxs, lg, wc);
      }
      if (need_w) accumulate_mm(gw, lg.t(), xs, s == 0);
      if (need_b) {
        if (s == 0) {
          at::sum_out(gb, lg, {0}, false, acc);
        } else {
          gb.add_(lg.sum({0}, false, acc));
        }
      }
    }
  }
  if (need_w && gw.scalar_type() != weight.scalar_type()) gw = gw.to(weight.scalar_type());
  if (need_b && gb.scalar_type() != b.scalar_type()) gb = gb.to(b.scalar_type());
  auto [loss, z] = cross_entropy_reduce(loss_rows, z_rows, o.reduction);
  return {loss, z, gx, gw, gb};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_fused_linear_cross_entropy_forward", fk::ops::fused_linear_cross_entropy_forward_impl);
}

TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_fused_linear_cross_entropy_forward", fk::ops::fused_linear_cross_entropy_forward_impl);
}
