// Finding and launching fk's ahead-of-time compiled kernels.
//
//   const auto& fam = fk::runtime::family("rms_norm_fwd");
//   const KernelSpec& k = fam.pick(op, x, /*min_block=*/N, flags);  // variant for x's GPU
//   fk::runtime::KernelArgs args;
//   args.ptr(x).ptr(y).i64(n);
//   fk::runtime::launch(op, k, x.device(), {grid_x, 1, 1}, args);
//
// Modules are loaded lazily, once per (kernel, device), thread-safely, into the device's
// primary context (the one torch uses); kernels run on torch's current stream.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernel_table.h"
#include "runtime/tensor.h"

namespace fk::runtime {

constexpr uint32_t kFlagAligned = 1;  // matches triton_src/_common.py FLAG_ALIGNED
constexpr uint32_t kFlagRows16 = 256;  // FLAG_ROWS16: with kFlagAligned, rows a multiple of 16
// FLAG_LOW_BANDWIDTH: a variant tuned for GPUs whose peak DRAM bandwidth is below
// kLowBandwidthGBps (one cubin serves the H100's 3.35 TB/s and the H200's 4.8 TB/s). Launchers
// never ask for it: pick() prefers it, where a family has one, on such a GPU.
constexpr uint32_t kFlagLowBandwidth = 512;
constexpr double kLowBandwidthGBps = 4000.0;

// The arch whose cubins run on a device of this compute capability (8.x -> 80, else exact).
int arch_for_capability(int major, int minor);

// Compute capability (major * 10 + minor) and multiprocessor count of a CUDA device.
int device_capability(int device);
int device_sm_count(int device);

// Peak DRAM bandwidth of a CUDA device in GB/s (memory clock x bus width x 2), 0 when the
// driver does not report it. FK_MEMORY_BANDWIDTH_GBPS, read once per process, replaces it for
// every device (to run or time the variants tuned for another GPU on this one).
double device_memory_bandwidth_gbps(int device);

// All variants of one kernel family, indexed once.
class KernelFamily {
 public:
  explicit KernelFamily(const char* name);

  // The variant for `t`'s dtype and device with exactly `flags` whose block is the
  // smallest >= min_block. Throws a clear error naming `op` when this build has no
  // kernels for the device, the dtype, or a block that large. On a GPU below
  // kLowBandwidthGBps, a variant of that block with flags | kFlagLowBandwidth comes first.
  const KernelSpec& pick(const char* op, const Tensor& t, int64_t min_block,
                         uint32_t flags) const;

  // Largest block built for this dtype and arch (0 when none).
  int64_t max_block(const Tensor& t) const;

 private:
  std::string name_;
  std::vector<const KernelSpec*> specs_;  // sorted by block
  bool has_low_bandwidth_ = false;        // some variant carries kFlagLowBandwidth
};

const KernelFamily& family(const char* name);

// Kernel arguments, packed as the kernel's parameter list expects them.
class KernelArgs {
 public:
  KernelArgs& ptr(const Tensor& t);
  KernelArgs& ptr(const void* p);
  KernelArgs& i32(int64_t v);  // checked to fit
  KernelArgs& i64(int64_t v);
  KernelArgs& f32(double v);
  int size() const { return n_; }

 private:
  friend void launch(const char*, const KernelSpec&, const Device&, std::array<int64_t, 3>,
                     KernelArgs&, int);
  static constexpr int kMax = 30;
  std::array<uint64_t, kMax + 2> slots_{};
  std::array<void*, kMax + 2> ptrs_{};
  int n_ = 0;
  uint64_t* next(const char* what);
};

// Launches `k` on `device` with a grid of (x, y, z) programs on the current stream.
// `cluster` > 0 launches a kernel built for clusters of one (k.cluster == 1) in thread-block
// clusters of that many programs along x, a size chosen at run time (at most 8; the grid's x
// a multiple); 0 keeps the variant's own.
void launch(const char* op, const KernelSpec& k, const Device& device,
            std::array<int64_t, 3> grid, KernelArgs& args, int cluster = 0);

// 1 if every tensor's data pointer is 16-byte aligned, else 0; used to build variant flags.
bool aligned16(std::initializer_list<const Tensor*> tensors);

}  // namespace fk::runtime
