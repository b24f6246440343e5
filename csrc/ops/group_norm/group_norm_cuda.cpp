// CUDA kernels of fk::group_norm: AOT-compiled Triton (triton_src/group_norm.py, whose
// docstring reasons out the design and its bytes).
//
// Forward: one persistent launch, each program over whole (sample, group) rows: a statistics
// pass (x from DRAM), then a normalize pass (x again, from L2) writing y, mean and rstd.
// Backward: one persistent launch (per-channel sums of dy * xhat and dy, stored per
// (sample, channel), then dx from the same group re-read from L2), then one small launch
// summing the per-(sample, channel) partials over the batch into dweight and dbias.
// On sm_90 and newer, groups of 2-8 whole tiles (cluster_programs) run the cluster kernels
// instead: one tile per program, a group per thread-block cluster, x and dy read once.
#include <algorithm>
#include <array>

#include "ops/group_norm/group_norm.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"
#include "runtime/rows.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// Mirrors triton_src/group_norm.py: TILES, HW_BUCKETS, ALIGNED_MIN_HW, KEY, FLAG_EVEN_C.
struct Tile {
  int64_t elems, most_per_sm;
};
constexpr std::array<Tile, 2> kTiles = {{{1024, 8}, {8192, 2}}};
constexpr std::array<int64_t, 5> kHwBuckets = {1, 8, 64, 512, 4096};
constexpr int64_t kAlignedMinHw = 64;
constexpr int64_t kKey = int64_t{1} << 16;
constexpr uint32_t kFlagEvenC = 2;
// Bytes of groups in flight the persistent grid aims at, so that the second pass over a
// group finds it in L2 (40 MB on A100, 50 MB on H100 / H200).
constexpr int64_t kL2Budget = int64_t{32} << 20;

// Mirrors triton_src/group_norm.py: CLUSTER_TILE, CLUSTER_HW (powers of two from 64 up to
// the tile), CLUSTER_MAX (_common.py).
constexpr int64_t kClusterTile = 8192;
constexpr int64_t kClusterMinHw = 64;
constexpr int64_t kClusterMax = 8;
// Groups of one tile keep the persistent kernels (the cluster form was timed from 2 tiles).
constexpr int64_t kClusterMin = 2;

// Programs per group (the cluster size) of the cluster kernels, 0 where they do not apply:
// HW a power of two in [64, kClusterTile] (one tile row), Cg a multiple of the tile's
// kClusterTile / HW channels, 2-8 tiles a group, every tensor 16-byte aligned, and a build
// with the family's variants for x's GPU and dtype (sm_90 and newer).
int64_t cluster_programs(const runtime::KernelFamily& fam, const Tensor& x, int64_t cg,
                         int64_t hw, std::initializer_list<const Tensor*> ts) {
  if (hw < kClusterMinHw || hw > kClusterTile || (hw & (hw - 1)) != 0) return 0;
  const int64_t bc = kClusterTile / hw;
  if (cg % bc != 0) return 0;
  const int64_t cl = cg / bc;
  if (cl < kClusterMin || cl > kClusterMax || !runtime::aligned16(ts)) return 0;
  return fam.max_block(x) >= hw ? cl : 0;
}

// weight / bias for the cluster kernels, which read them in x's dtype (has 1) or float32
// (has 2): as they are when of x's dtype or float32, else converted to float32; `fallback`
// stands in for an absent one (has 0, never read).
struct Param {
  Tensor t;
  int64_t has;
};
Param cluster_param(const std::optional<Tensor>& p, const Tensor& x, const Tensor& fallback) {
  if (!has(p)) return {fallback, 0};
  if (p->scalar_type() == x.scalar_type()) return {aten::contiguous(*p), 1};
  return {aten::contiguous(aten::to(*p, kFloat)), 2};
}

struct Choice {
  int64_t hw, c, most_per_sm;
};

// The tile shape that wastes the fewest masked lanes over a group (ties: the larger tile).
Choice choose_tile(int64_t cg, int64_t hw) {
  Choice best{0, 0, 0};
  int64_t best_lanes = 0;
  for (const auto& t : kTiles) {
    for (int64_t h : kHwBuckets) {
      if (h > t.elems) continue;
      const int64_t c = t.elems / h;
      const int64_t lanes = checks::ceil_div(hw, h) * h * checks::ceil_div(cg, c) * c;
      if (best.hw == 0 || lanes <= best_lanes) {
        best = {h, c, t.most_per_sm};
        best_lanes = lanes;
      }
    }
  }
  return best;
}

// Persistent programs: enough groups in flight to fill every multiprocessor, no more than
// the L2 budget holds (at least one per multiprocessor), at most `most_per_sm` each.
int64_t programs_for(int64_t groups, int64_t group_bytes, const Device& device,
                     int64_t most_per_sm) {
  const int64_t sms = runtime::device_sm_count(device.index());
  const int64_t fit = kL2Budget / std::max<int64_t>(group_bytes, 1);
  return std::min(groups, std::clamp(fit, sms, sms * most_per_sm));
}

uint32_t flags_for(const Choice& t, int64_t hw, std::initializer_list<const Tensor*> ts) {
  return t.hw >= kAlignedMinHw ? runtime::flags_for(hw, ts) : 0;
}

void check_sizes(const char* op, const GroupNormShape& s, int64_t num_groups) {
  const int64_t cg = s.c / num_groups;
  FK_CHECK(cg * s.hw < (int64_t{1} << 31), op, ": a group of x holds ", cg * s.hw,
           " elements, more than the 2^31 - 1 the CUDA kernels index");
  FK_CHECK(s.n * num_groups < (int64_t{1} << 31), op, ": x has ", s.n * num_groups,
           " (sample, group) rows, more than the 2^31 - 1 the CUDA kernels index");
}

// weight / bias as contiguous float32 (the kernels read float32 parameters); `fallback`
// stands in for an absent one (never read: has_w / has_b is 0).
Tensor param_f32(const std::optional<Tensor>& p, const Tensor& fallback) {
  return has(p) ? aten::contiguous(aten::to(*p, kFloat)) : fallback;
}

std::tuple<Tensor, Tensor, Tensor> group_norm_forward_cuda(Tensor x,
                                                           std::optional<Tensor> weight,
                                                           std::optional<Tensor> bias,
                                                           int64_t num_groups, double eps) {
  constexpr const char* op = "fk::group_norm";
  check_group_norm(x, weight, bias, num_groups);
  const auto s = group_norm_shape(x);
  auto xc = aten::contiguous(x);
  auto y = aten::empty(x.sizes(), x.scalar_type(), x.device());
  auto mean = aten::empty({s.n, num_groups}, kFloat, x.device());
  auto rstd = aten::empty({s.n, num_groups}, kFloat, x.device());
  if (x.numel() == 0) {  // no element: an empty y; zero statistics (never read)
    aten::zero_(mean);
    aten::zero_(rstd);
    return {y, mean, rstd};
  }
  check_sizes(op, s, num_groups);
  const int64_t cg = s.c / num_groups, groups = s.n * num_groups;
  static const auto& fwd_cluster = runtime::family("group_norm_fwd_cluster");
  if (const int64_t cl = cluster_programs(fwd_cluster, xc, cg, s.hw, {&xc, &y})) {
    const auto& k = fwd_cluster.pick(op, xc, s.hw, runtime::kFlagAligned);
    const Param w = cluster_param(weight, xc, mean), b = cluster_param(bias, xc, mean);
    KernelArgs args;
    args.ptr(xc).ptr(w.t).ptr(w.t).ptr(b.t).ptr(b.t).ptr(y).ptr(mean).ptr(rstd)
        .i32(num_groups).i32(cl).f32(eps).i32(w.has).i32(b.has);
    runtime::launch(op, k, x.device(), {groups * cl, 1, 1}, args, static_cast<int>(cl));
    return {y, mean, rstd};
  }
  auto w = param_f32(weight, mean), b = param_f32(bias, mean);
  const Choice t = choose_tile(cg, s.hw);
  static const auto& fwd = runtime::family("group_norm_fwd");
  const auto& k = fwd.pick(op, xc, t.hw * kKey + t.c, flags_for(t, s.hw, {&xc, &y}));
  const int64_t group_bytes = cg * s.hw * static_cast<int64_t>(x.element_size());
  KernelArgs args;
  args.ptr(xc).ptr(w).ptr(b).ptr(y).ptr(mean).ptr(rstd).i32(groups).i32(num_groups).i32(cg)
      .i32(s.hw).f32(eps).i32(has(weight) ? 1 : 0).i32(has(bias) ? 1 : 0);
  runtime::launch(op, k, x.device(),
                  {programs_for(groups, group_bytes, x.device(), t.most_per_sm), 1, 1}, args);
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> group_norm_backward_cuda(
    Tensor grad_y, Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias,
    Tensor mean, Tensor rstd, int64_t num_groups, std::vector<bool> output_mask) {
  constexpr const char* op = "fk::_group_norm_backward";
  check_group_norm_backward(grad_y, x, weight, bias, mean, rstd, num_groups);
  FK_CHECK(mean.scalar_type() == kFloat && rstd.scalar_type() == kFloat, op,
           ": mean and rstd must be float32 on CUDA");
  const auto s = group_norm_shape(x);
  const bool want_dx = output_mask[0];
  const bool want_dw = output_mask[1] && has(weight), want_db = output_mask[2] && has(bias);
  Tensor dx = want_dx ? aten::empty(x.sizes(), x.scalar_type(), x.device()) : Tensor();
  Tensor dw = want_dw ? aten::empty({s.c}, weight->scalar_type(), x.device()) : Tensor();
  Tensor db = want_db ? aten::empty({s.c}, bias->scalar_type(), x.device()) : Tensor();
  if (!want_dx && !want_dw && !want_db) return {dx, dw, db};
  if (x.numel() == 0) {
    if (want_dw) aten::zero_(dw);
    if (want_db) aten::zero_(db);
    return {dx, dw, db};
  }
  check_sizes(op, s, num_groups);
  const int64_t cg = s.c / num_groups, groups = s.n * num_groups;
  auto xc = aten::contiguous(x), dy = aten::contiguous(grad_y);
  auto mean_c = aten::contiguous(mean), rstd_c = aten::contiguous(rstd);
  auto partial = aten::empty({2, s.n * s.c}, kFloat, x.device());
  // dx stands in for itself when not wanted: the kernel skips its second pass.
  Tensor dx_arg = want_dx ? dx : xc;
  static const auto& bwd_cluster = runtime::family("group_norm_bwd_cluster");
  if (const int64_t cl = cluster_programs(bwd_cluster, xc, cg, s.hw, {&xc, &dy, &dx_arg})) {
    const auto& k = bwd_cluster.pick(op, xc, s.hw, runtime::kFlagAligned);
    const Param w = cluster_param(weight, xc, mean_c);
    KernelArgs args;
    args.ptr(dy).ptr(xc).ptr(w.t).ptr(w.t).ptr(mean_c).ptr(rstd_c).ptr(dx_arg).ptr(partial)
        .i32(groups).i32(num_groups).i32(cl).i32(w.has).i32(want_dx ? 1 : 0);
    runtime::launch(op, k, x.device(), {groups * cl, 1, 1}, args, static_cast<int>(cl));
  } else {
    auto w = param_f32(weight, mean_c);
    const Choice t = choose_tile(cg, s.hw);
    static const auto& bwd = runtime::family("group_norm_bwd");
    // Aligned, with Cg a multiple of the tile's channels: the prefetching variants.
    uint32_t bflags = flags_for(t, s.hw, {&xc, &dy, &dx_arg});
    if (bflags & runtime::kFlagAligned && cg % t.c == 0) bflags |= kFlagEvenC;
    const auto& k = bwd.pick(op, xc, t.hw * kKey + t.c, bflags);
    const int64_t group_bytes = 2 * cg * s.hw * static_cast<int64_t>(x.element_size());
    KernelArgs args;
    args.ptr(dy).ptr(xc).ptr(w).ptr(mean_c).ptr(rstd_c).ptr(dx_arg).ptr(partial).i32(groups)
        .i32(num_groups).i32(cg).i32(s.hw).i32(has(weight) ? 1 : 0).i32(want_dx ? 1 : 0);
    // The backward holds twice the fp32 values per thread: half the programs per SM.
    const int64_t per_sm = std::max<int64_t>(1, t.most_per_sm / 2);
    const int64_t programs = programs_for(groups, group_bytes, x.device(), per_sm);
    runtime::launch(op, k, x.device(), {programs, 1, 1}, args);
  }

  if (want_dw || want_db) {
    const Tensor& out = want_dw ? dw : db;
    static const auto& reduce = runtime::family("group_norm_reduce");
    const auto& r = reduce.pick(op, out, 0, 0);
    KernelArgs rargs;
    rargs.ptr(partial).ptr(want_dw ? dw : db).ptr(want_db ? db : dw).i32(s.n).i32(s.c)
        .i32(want_dw ? 1 : 0).i32(want_db ? 1 : 0);
    runtime::launch(op, r, x.device(), {checks::ceil_div(s.c, r.block), 1, 1}, rargs);
  }
  return {dx, dw, db};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_group_norm_forward", TORCH_BOX(&fk::ops::group_norm_forward_cuda));
  m.impl("_group_norm_backward", TORCH_BOX(&fk::ops::group_norm_backward_cuda));
}
