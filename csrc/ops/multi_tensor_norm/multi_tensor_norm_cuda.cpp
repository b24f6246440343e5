// CUDA kernels of fk::multi_tensor_norm / fk::multi_tensor_count_zeros: AOT-compiled Triton
// (triton_src/multi_tensor_norm.py). Two launches whatever the number of tensors and their
// dtypes: the reduce kernel over a device table of (address, numel, dtype, first block)
// rows, one partial per program, then a one-program finish into the 0-dim result.
//
// The table: built on the host (addresses and sizes are host values) into pinned memory
// from torch's caching host allocator, then copied to the device with a non-blocking copy on
// the current stream (cudaMemcpyAsync: no host synchronization). Under CUDA-graph capture
// the copy becomes a node of the graph that reads the same pinned block at every replay;
// torch never recycles a pinned block allocated during capture (CachingHostAllocator), so
// replays read the table written at capture time, which matches the tensors the graph was
// captured with. (Torch's foreach kernels pass addresses as kernel arguments instead, 4 KiB
// a launch, so a long list takes several launches; here one copy of 32 bytes a tensor
// serves any number of tensors.)
#include <algorithm>

#include "ops/multi_tensor_norm/multi_tensor_norm.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

// triton_src/multi_tensor_norm.py: MODE values, table columns, programs per SM.
constexpr int kSumSquares = 0, kMaxAbs = 1, kCountZeros = 2;
constexpr int64_t kCols = 4;
constexpr int64_t kProgramsPerSm = 8;

int64_t dtype_code(ScalarType t) {
  return t == kFloat ? 0 : t == kBFloat16 ? 1 : 2;  // check_tensor_list allowed only these
}

Tensor reduce(const char* op, const std::vector<Tensor>& tensors, int mode) {
  const Device device = tensors[0].device();
  static const auto& reduce_fam = runtime::family("multi_tensor_reduce");
  static const auto& finish_fam = runtime::family("multi_tensor_finish");
  // The variants are keyed by mode (flags); fp32 names the partials of the norms.
  const Tensor key = aten::empty({0}, kFloat, device);
  const auto& reduce_k = reduce_fam.pick(op, key, 0, static_cast<uint32_t>(mode) << 1);
  const auto& finish_k = finish_fam.pick(op, key, 0, static_cast<uint32_t>(mode) << 1);
  const int64_t block = reduce_k.constexpr_value("BLOCK");
  const ScalarType out_dtype = mode == kCountZeros ? kLong : kFloat;

  // Non-contiguous tensors, and views not 16-byte aligned (the kernel's full blocks use
  // 16-byte loads), are read through contiguous copies (fresh allocations are aligned),
  // held until the launch is queued (the caching allocator orders their reuse after it on
  // this stream).
  std::vector<Tensor> keep;
  std::vector<int64_t> rows;
  rows.reserve(kCols * tensors.size());
  int64_t blocks = 0;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    const bool aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    Tensor c = t.is_contiguous() && aligned ? t : aten::clone(t);
    rows.insert(rows.end(), {reinterpret_cast<int64_t>(c.data_ptr()), c.numel(),
                             dtype_code(c.scalar_type()), blocks});
    blocks += checks::ceil_div(c.numel(), block);
    keep.push_back(std::move(c));
  }
  Tensor out = aten::empty({}, out_dtype, device);
  if (blocks == 0) {
    aten::zero_(out);
    return out;
  }
  const int64_t n = static_cast<int64_t>(rows.size()) / kCols;
  Tensor host = torch::stable::empty({kCols * n}, kLong, std::nullopt,
                                     Device(DeviceType::CPU), /*pin_memory=*/true);
  std::copy(rows.begin(), rows.end(), static_cast<int64_t*>(host.mutable_data_ptr()));
  Tensor table = aten::empty({kCols * n}, kLong, device);
  torch::stable::copy_(table, host, /*non_blocking=*/true);

  const int64_t programs =
      std::min(blocks, kProgramsPerSm * runtime::device_sm_count(device.index()));
  Tensor partial = aten::empty({programs}, out_dtype, device);
  KernelArgs args;
  args.ptr(table).ptr(partial).i32(n);
  runtime::launch(op, reduce_k, device, {programs, 1, 1}, args);
  KernelArgs fargs;
  fargs.ptr(partial).ptr(out).i32(programs);
  runtime::launch(op, finish_k, device, {1, 1, 1}, fargs);
  return out;
}

Tensor multi_tensor_norm_cuda(std::vector<Tensor> tensors, double ord) {
  constexpr const char* op = "fk::multi_tensor_norm";
  check_tensor_list(op, tensors);
  check_norm_ord(ord);
  return reduce(op, tensors, ord == 2.0 ? kSumSquares : kMaxAbs);
}

Tensor multi_tensor_count_zeros_cuda(std::vector<Tensor> tensors) {
  constexpr const char* op = "fk::multi_tensor_count_zeros";
  check_tensor_list(op, tensors);
  return reduce(op, tensors, kCountZeros);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("multi_tensor_norm", TORCH_BOX(&fk::ops::multi_tensor_norm_cuda));
  m.impl("multi_tensor_count_zeros", TORCH_BOX(&fk::ops::multi_tensor_count_zeros_cuda));
}
