// Schemas of the vocabulary-parallel cross entropy ops, the shared checks, and the drivers
// the CPU and CUDA backends register. Fake kernels, the communication and autograd:
// python/fk/ops/vocab_parallel_cross_entropy.py.
#include "ops/vocab_parallel_cross_entropy/vocab_parallel_cross_entropy.h"

#include "runtime/checks.h"

namespace fk::ops {

namespace {
constexpr const char* kOp = "fk::vocab_parallel_cross_entropy";
}  // namespace

VpOptions check_vocab_parallel_cross_entropy(const char* op, const Tensor& logits,
                                             const Tensor& target,
                                             const std::optional<Tensor>& weight,
                                             int64_t vocab_start, int64_t vocab_size,
                                             int64_t ignore_index, double label_smoothing,
                                             double lse_square_scale,
                                             std::optional<double> softcap) {
  FK_CHECK(logits.dim() == 2, op, ": logits must have shape (N, V_local), got ",
           shape_of(logits));
  checks::check_float(op, "logits", logits);
  const int64_t v = logits.size(1);
  FK_CHECK(v >= 1, op, ": logits must have at least one class, got shape ", shape_of(logits));
  // The target and option checks of cross entropy (their messages), weights checked here.
  check_ce_target_and_options(op, "logits", logits, logits.size(0), v, target, std::nullopt,
                              "weight", ignore_index, label_smoothing, "sum",
                              lse_square_scale, softcap);
  if (has(weight)) {
    checks::check_same_device(op, "logits", logits, "weight", *weight);
    checks::check_float(op, "weight", *weight);
    FK_CHECK(weight->dim() == 1 && weight->size(0) == v, op, ": weight must have shape (", v,
             ",) (this shard's class weights), got ", shape_of(*weight));
  }
  FK_CHECK(vocab_start >= 0 && vocab_start + v <= vocab_size, op, ": the shard's classes [",
           vocab_start, ", ", vocab_start + v, ") must lie in [0, vocab_size) = [0, ",
           vocab_size, ")");
  return VpOptions{vocab_start, vocab_size, ignore_index, label_smoothing, lse_square_scale,
                   softcap};
}

void check_vocab_parallel_stats(const char* op, const Tensor& logits, const Tensor& stats,
                                const Tensor& den, const std::optional<Tensor>& grad_scale) {
  const auto dtype = ce_loss_dtype(logits);
  const int64_t n = logits.size(0);
  checks::check_same_device(op, "logits", logits, "stats", stats);
  FK_CHECK(stats.scalar_type() == dtype, op, ": stats must be ", dtype, ", got ",
           stats.scalar_type());
  FK_CHECK(stats.dim() == 3 && stats.size(0) >= 1 && stats.size(1) == kVpStats &&
               stats.size(2) == n,
           op, ": stats must have shape (world, ", kVpStats, ", ", n, "), got ",
           shape_of(stats));
  checks::check_same_device(op, "logits", logits, "den", den);
  FK_CHECK(den.scalar_type() == dtype && den.dim() == 1 && den.size(0) == 2, op,
           ": den must be a (2,) tensor of ", dtype, ", got ", den.scalar_type(), " ",
           shape_of(den));
  if (has(grad_scale)) {
    const auto& g = *grad_scale;
    checks::check_same_device(op, "logits", logits, "grad_scale", g);
    FK_CHECK(g.scalar_type() == dtype, op, ": grad_scale must be ", dtype, ", got ",
             g.scalar_type());
    FK_CHECK(g.dim() == 0 || (g.dim() == 1 && g.size(0) == n), op,
             ": grad_scale must be a scalar or have shape (", n, ",), got ", shape_of(g));
  }
}

Tensor vp_ce_stats_impl(Tensor logits, Tensor target, std::optional<Tensor> weight,
                        int64_t vocab_start, int64_t vocab_size, int64_t ignore_index,
                        double label_smoothing, std::optional<double> softcap) {
  const auto o = check_vocab_parallel_cross_entropy(kOp, logits, target, weight, vocab_start,
                                                    vocab_size, ignore_index, label_smoothing,
                                                    0.0, softcap);
  const auto dtype = ce_loss_dtype(logits);
  const int64_t n = logits.size(0);
  auto stats = aten::empty({kVpStats, n}, dtype, logits.device());
  if (n == 0) return stats;
  auto t = aten::contiguous(target);
  check_targets_in_range(kOp, t, vocab_size, ignore_index, Tensor(), CeReduction::None);
  auto x = aten::contiguous(logits);
  Tensor w;
  if (has(weight)) w = aten::contiguous(aten::to(*weight, dtype));
  if (x.is_cuda()) {
    vp_ce_stats_cuda(x, t, w, stats, o);
  } else {
    vp_ce_stats_cpu(x, t, w, stats, o);
  }
  return stats;
}

namespace {

std::tuple<Tensor, Tensor> run_loss(const Tensor& x, const Tensor& grad, const Tensor& target,
                                    const std::optional<Tensor>& weight, const Tensor& stats,
                                    const Tensor& den, const std::optional<Tensor>& grad_scale,
                                    const VpOptions& o) {
  const auto dtype = ce_loss_dtype(x);
  const int64_t n = x.size(0);
  auto loss_rows = aten::empty({n}, dtype, x.device());
  auto z_rows = aten::empty({n}, dtype, x.device());
  if (n == 0) return {loss_rows, z_rows};
  auto t = aten::contiguous(target);
  Tensor w, scale;
  if (has(weight)) w = aten::contiguous(aten::to(*weight, dtype));
  if (has(grad_scale)) scale = aten::contiguous(*grad_scale);
  auto st = aten::contiguous(stats);
  auto d = aten::contiguous(den);
  if (x.is_cuda()) {
    vp_ce_loss_cuda(x, grad, t, w, st, d, scale, loss_rows, z_rows, o);
  } else {
    vp_ce_loss_cpu(x, grad, t, w, st, d, scale, loss_rows, z_rows, o);
  }
  return {loss_rows, z_rows};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> vp_ce_loss_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, Tensor stats, Tensor den,
    std::optional<Tensor> grad_scale, int64_t vocab_start, int64_t vocab_size,
    int64_t ignore_index, double label_smoothing, double lse_square_scale,
    std::optional<double> softcap, bool compute_grad) {
  const auto o = check_vocab_parallel_cross_entropy(kOp, logits, target, weight, vocab_start,
                                                    vocab_size, ignore_index, label_smoothing,
                                                    lse_square_scale, softcap);
  check_vocab_parallel_stats(kOp, logits, stats, den, grad_scale);
  auto x = aten::contiguous(logits);
  Tensor grad;
  if (compute_grad) grad = aten::empty_like(x);
  auto [loss, z] = run_loss(x, grad, target, weight, stats, den, grad_scale, o);
  return {loss, z, grad};
}

std::tuple<Tensor, Tensor> vp_ce_loss_inplace_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, Tensor stats, Tensor den,
    std::optional<Tensor> grad_scale, int64_t vocab_start, int64_t vocab_size,
    int64_t ignore_index, double label_smoothing, double lse_square_scale,
    std::optional<double> softcap) {
  constexpr const char* op = "fk::_vocab_parallel_cross_entropy_loss_";
  const auto o = check_vocab_parallel_cross_entropy(op, logits, target, weight, vocab_start,
                                                    vocab_size, ignore_index, label_smoothing,
                                                    lse_square_scale, softcap);
  check_vocab_parallel_stats(op, logits, stats, den, grad_scale);
  FK_CHECK(logits.is_contiguous(), op, ": logits must be contiguous");
  return run_loss(logits, logits, target, weight, stats, den, grad_scale, o);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // Per-row statistics (6, N) of this rank's logits (N, V_loc), the classes [vocab_start,
  // vocab_start + V_loc) of vocab_size: local max, sum of exp relative to it, the target's
  // logit and class weight (0 where the target is another rank's), and with label smoothing
  // the sums of w_j x_j and of w_j; float32 (float64 for float64 logits). Softcap applies
  // first. A target that is neither ignore_index nor in [0, vocab_size) raises (on CUDA
  // through a device-side assert).
  m.def("_vocab_parallel_cross_entropy_stats(Tensor logits, Tensor target, Tensor? weight, "
        "int vocab_start, int vocab_size, int ignore_index, float label_smoothing, "
        "float? softcap) -> Tensor");
  // (loss_rows, z_rows, grad) from the stats of every rank (world, 6, N) and the
  // denominators den (2,) ((sum of w_y, count) over non-ignored rows for a mean, else
  // ones): each row's loss (the whole vocabulary's, the same on every rank) and, with
  // compute_grad, the gradient of this shard times grad_scale (a scalar or (N,); None: 1).
  m.def("_vocab_parallel_cross_entropy_loss(Tensor logits, Tensor target, Tensor? weight, "
        "Tensor stats, Tensor den, Tensor? grad_scale, int vocab_start, int vocab_size, "
        "int ignore_index, float label_smoothing, float lse_square_scale, float? softcap, "
        "bool compute_grad) -> (Tensor, Tensor, Tensor)");
  // The same with the gradient written into logits (contiguous).
  m.def("_vocab_parallel_cross_entropy_loss_(Tensor(a!) logits, Tensor target, "
        "Tensor? weight, Tensor stats, Tensor den, Tensor? grad_scale, int vocab_start, "
        "int vocab_size, int ignore_index, float label_smoothing, float lse_square_scale, "
        "float? softcap) -> (Tensor, Tensor)");
}
