#include "runtime/kernels.h"

#include <torch/csrc/stable/accelerator.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "runtime/driver.h"

namespace fk::runtime {

int64_t KernelSpec::constexpr_value(const char* name) const {
  for (const auto& c : constexprs) {
    if (c.name != nullptr && std::strcmp(c.name, name) == 0) return c.value;
  }
  FK_CHECK(false, "fk: kernel variant ", variant, " has no constexpr ", name);
}

namespace {

const char* dtype_name(ScalarType t) {
  switch (t) {
    case kFloat: return "fp32";
    case kBFloat16: return "bf16";
    case kHalf: return "fp16";
    default: return nullptr;
  }
}

std::string built_archs_text() {
  std::string out;
  std::string all = kBuiltArchs;
  size_t pos = 0;
  while (pos <= all.size()) {
    size_t end = all.find(';', pos);
    if (end == std::string::npos) end = all.size();
    std::string a = all.substr(pos, end - pos);
    if (!a.empty()) {
      if (!out.empty()) out += ", ";
      out += "sm_" + a + (std::stoi(a) >= 90 ? "a" : "");
    }
    pos = end + 1;
  }
  return out;
}

struct DeviceInfo {
  int capability = 0;
  int sm_count = 0;
  double bandwidth_gbps = 0;  // peak DRAM bandwidth (0: not reported)
  std::string name;
  CUcontext ctx = nullptr;
};

constexpr int kMaxDevices = 64;

const DeviceInfo& device_info(int device) {
  FK_CHECK(device >= 0 && device < kMaxDevices, "fk: CUDA device index ", device,
              " out of range");
  static std::once_flag once[kMaxDevices];
  static DeviceInfo infos[kMaxDevices];
  std::call_once(once[device], [device] {
    const Driver& d = driver();
    CUdevice dev;
    FK_CU_CHECK(d.cuDeviceGet(&dev, device), "fk: device query");
    int major = 0, minor = 0, sms = 0;
    FK_CU_CHECK(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                "fk: device query");
    FK_CU_CHECK(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                "fk: device query");
    FK_CU_CHECK(d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                "fk: device query");
    // The memory clock (kHz, double data rate) and bus width (bits); a driver that reports
    // neither leaves the bandwidth unknown, and the default variants run.
    int mem_khz = 0, bus_bits = 0;
    if (d.cuDeviceGetAttribute(&mem_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev) !=
            CUDA_SUCCESS ||
        d.cuDeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev) !=
            CUDA_SUCCESS) {
      mem_khz = bus_bits = 0;
    }
    const double bandwidth = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    char name[256] = {0};
    FK_CU_CHECK(d.cuDeviceGetName(name, sizeof(name) - 1, dev), "fk: device query");
    CUcontext ctx = nullptr;
    FK_CU_CHECK(d.cuDevicePrimaryCtxRetain(&ctx, dev), "fk: retaining the primary context");
    infos[device] = DeviceInfo{major * 10 + minor, sms, bandwidth, name, ctx};
  });
  return infos[device];
}

// Loaded functions, one slot per (device, table entry).
struct LoadedFunctions {
  std::unique_ptr<std::atomic<CUfunction>[]> fns;
  std::mutex mu;
  LoadedFunctions() : fns(new std::atomic<CUfunction>[kKernelTableSize]) {
    for (size_t i = 0; i < kKernelTableSize; ++i) fns[i].store(nullptr);
  }
};

CUfunction load_function(const char* op, const KernelSpec& k, int device) {
  static LoadedFunctions per_device[kMaxDevices];
  const size_t index = static_cast<size_t>(&k - kKernelTable);
  auto& slot = per_device[device];
  CUfunction fn = slot.fns[index].load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  std::lock_guard<std::mutex> lock(slot.mu);
  fn = slot.fns[index].load(std::memory_order_relaxed);
  if (fn != nullptr) return fn;

  const Driver& d = driver();
  const DeviceInfo& info = device_info(device);
  const std::string ctx_msg = std::string(op) + ": loading kernel " + k.variant + " (sm_" +
                              std::to_string(k.arch) + ") on cuda:" + std::to_string(device);
  CUcontext current = nullptr;
  FK_CU_CHECK(d.cuCtxGetCurrent(&current), ctx_msg);
  if (current != info.ctx) FK_CU_CHECK(d.cuCtxSetCurrent(info.ctx), ctx_msg);
  CUmodule mod = nullptr;
  FK_CU_CHECK(d.cuModuleLoadData(&mod, k.image_begin), ctx_msg);
  FK_CU_CHECK(d.cuModuleGetFunction(&fn, mod, k.entry), ctx_msg);
  if (k.shared_bytes > 48 * 1024) {
    int static_shared = 0;
    FK_CU_CHECK(d.cuFuncGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                ctx_msg);
    FK_CU_CHECK(d.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     k.shared_bytes - static_shared),
                ctx_msg);
  }
  if (k.num_ctas == 16) {
    FK_CU_CHECK(d.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                ctx_msg);
  }
  slot.fns[index].store(fn, std::memory_order_release);
  return fn;
}

// The driver launches on the calling thread's current context. A thread that has made no
// CUDA runtime call yet has none: autograd's device thread, for one, where torch's device
// guard skips cudaSetDevice for the device it already names. The first load of a function
// makes the primary context current on the loading thread only, so a kernel loaded by a
// forward on the main thread and launched by its backward on autograd's thread would fail
// with CUDA_ERROR_INVALID_CONTEXT. Make the device's primary context current where no
// context is (what the runtime does on a thread's first call).
void ensure_context(const char* op, int device) {
  const Driver& d = driver();
  CUcontext current = nullptr;
  FK_CU_CHECK(d.cuCtxGetCurrent(&current), op, ": querying the current CUDA context");
  if (current == nullptr) {
    FK_CU_CHECK(d.cuCtxSetCurrent(device_info(device).ctx), op,
                ": making the primary context of cuda:", device, " current");
  }
}

}  // namespace

int arch_for_capability(int major, int minor) {
  return major == 8 ? 80 : major * 10 + minor;
}

int device_capability(int device) { return device_info(device).capability; }
int device_sm_count(int device) { return device_info(device).sm_count; }

double device_memory_bandwidth_gbps(int device) {
  static const double forced = [] {
    const char* v = std::getenv("FK_MEMORY_BANDWIDTH_GBPS");
    if (v == nullptr || *v == '\0') return -1.0;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    FK_CHECK(end != v && *end == '\0' && x >= 0, "fk: FK_MEMORY_BANDWIDTH_GBPS must be a ",
             "number of GB/s, got '", v, "'");
    return x;
  }();
  return forced >= 0 ? forced : device_info(device).bandwidth_gbps;
}

KernelFamily::KernelFamily(const char* name) : name_(name) {
  for (size_t i = 0; i < kKernelTableSize; ++i) {
    if (name_ == kKernelTable[i].family) {
      specs_.push_back(&kKernelTable[i]);
      has_low_bandwidth_ = has_low_bandwidth_ || (kKernelTable[i].flags & kFlagLowBandwidth);
    }
  }
  std::sort(specs_.begin(), specs_.end(), [](const KernelSpec* a, const KernelSpec* b) {
    return a->block < b->block;
  });
}

const KernelSpec& KernelFamily::pick(const char* op, const Tensor& t, int64_t min_block,
                                     uint32_t flags) const {
  const int device = t.device().index();
  const DeviceInfo& info = device_info(device);
  const int arch = arch_for_capability(info.capability / 10, info.capability % 10);
  const char* dt = dtype_name(t.scalar_type());
  FK_CHECK(dt != nullptr, op, ": dtype ", t.scalar_type(),
              " is not supported on CUDA (supported: float32, bfloat16, float16)");
  bool arch_seen = false;
  const KernelSpec* found = nullptr;
  for (const KernelSpec* k : specs_) {
    if (k->arch != arch) continue;
    arch_seen = true;
    if (k->flags == flags && k->block >= min_block && std::strcmp(k->dtype, dt) == 0) {
      found = k;
      break;
    }
  }
  if (found != nullptr) {
    const double gbps = has_low_bandwidth_ ? device_memory_bandwidth_gbps(device) : 0;
    if (gbps > 0 && gbps < kLowBandwidthGBps) {
      for (const KernelSpec* k : specs_) {
        if (k->arch == arch && k->flags == (flags | kFlagLowBandwidth) &&
            k->block == found->block && std::strcmp(k->dtype, dt) == 0) {
          return *k;
        }
      }
    }
    return *found;
  }
  FK_CHECK(arch_seen, op, ": this build of fk has no kernels for ", info.name,
              " (compute capability ", info.capability / 10, ".", info.capability % 10,
              "); it was built for ", built_archs_text(),
              ". Rebuild with FK_CUDA_ARCHS including ", arch, ".");
  FK_CHECK(false, op, ": no ", name_, " kernel for dtype ", dt, " with block >= ",
              min_block, " (flags ", flags, ") on sm_", arch);
}

int64_t KernelFamily::max_block(const Tensor& t) const {
  const DeviceInfo& info = device_info(t.device().index());
  const int arch = arch_for_capability(info.capability / 10, info.capability % 10);
  const char* dt = dtype_name(t.scalar_type());
  int64_t best = 0;
  for (const KernelSpec* k : specs_) {
    if (k->arch == arch && dt != nullptr && std::strcmp(k->dtype, dt) == 0) {
      best = std::max(best, k->block);
    }
  }
  return best;
}

const KernelFamily& family(const char* name) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::unique_ptr<KernelFamily>> families;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = families[name];
  if (!slot) slot = std::make_unique<KernelFamily>(name);
  return *slot;
}

uint64_t* KernelArgs::next(const char* what) {
  FK_CHECK(n_ < kMax, "fk: too many kernel arguments (", what, ")");
  ptrs_[n_] = &slots_[n_];
  return &slots_[n_++];
}

KernelArgs& KernelArgs::ptr(const Tensor& t) {
  return ptr(t.defined() ? t.data_ptr() : nullptr);
}

KernelArgs& KernelArgs::ptr(const void* p) {
  uint64_t* s = next("pointer");
  *s = reinterpret_cast<uint64_t>(p);
  return *this;
}

KernelArgs& KernelArgs::i32(int64_t v) {
  FK_CHECK(v >= INT32_MIN && v <= INT32_MAX, "fk: kernel argument ", v,
              " does not fit in 32 bits");
  uint64_t* s = next("i32");
  int32_t x = static_cast<int32_t>(v);
  std::memcpy(s, &x, sizeof(x));
  return *this;
}

KernelArgs& KernelArgs::i64(int64_t v) {
  uint64_t* s = next("i64");
  std::memcpy(s, &v, sizeof(v));
  return *this;
}

KernelArgs& KernelArgs::f32(double v) {
  uint64_t* s = next("f32");
  float x = static_cast<float>(v);
  std::memcpy(s, &x, sizeof(x));
  return *this;
}

bool aligned16(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t->defined() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  }
  return true;
}

void launch(const char* op, const KernelSpec& k, const Device& device,
            std::array<int64_t, 3> grid, KernelArgs& args, int cluster) {
  FK_CHECK(args.n_ == k.num_params, op, ": kernel ", k.variant, " takes ", k.num_params,
              " arguments, got ", args.n_);
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return;
  FK_CHECK(grid[0] * k.num_ctas <= INT32_MAX && grid[1] <= 65535 && grid[2] <= 65535, op,
              ": launch grid (", grid[0], ", ", grid[1], ", ", grid[2], ") of kernel ",
              k.variant, " is too large");
  const int dev = device.index();
  torch::stable::accelerator::DeviceGuard guard(dev);
  CUfunction fn = load_function(op, k, dev);
  ensure_context(op, dev);
  CUstream stream = current_stream(dev);

  // Triton's two hidden trailing parameters: global scratch and profile scratch.
  Tensor scratch;
  uint64_t global_scratch = 0, profile_scratch = 0;
  if (k.global_scratch_size > 0) {
    const int64_t bytes = static_cast<int64_t>(k.global_scratch_size) * grid[0] * grid[1] *
                          grid[2] * k.num_ctas;
    scratch = aten::empty({bytes + k.global_scratch_align}, kByte, device);
    uintptr_t p = reinterpret_cast<uintptr_t>(scratch.data_ptr());
    const uintptr_t a = static_cast<uintptr_t>(std::max(1, k.global_scratch_align));
    global_scratch = (p + a - 1) / a * a;
  }
  const int n = args.n_;
  args.slots_[n] = global_scratch;
  args.slots_[n + 1] = profile_scratch;
  args.ptrs_[n] = &args.slots_[n];
  args.ptrs_[n + 1] = &args.slots_[n + 1];

  const Driver& d = driver();
  FK_CHECK(cluster == 0 || (k.cluster == 1 && k.num_ctas == 1 && cluster <= 8), op,
           ": kernel ", k.variant, " can't be launched in clusters of ", cluster, " programs");
  const int cl = cluster > 0 ? cluster : k.cluster;
  FK_CHECK(grid[0] % cl == 0, op, ": kernel ", k.variant, " runs in clusters of ", cl,
           " programs; grid ", grid[0], " is not a multiple");
  if (k.num_ctas == 1 && cl == 1 && !k.launch_pdl && !k.cooperative) {
    FK_CU_CHECK(d.cuLaunchKernel(fn, static_cast<unsigned>(grid[0]),
                                 static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2]),
                                 32 * k.num_warps, 1, 1, k.shared_bytes, stream,
                                 args.ptrs_.data(), nullptr),
                op, ": launching kernel ", k.variant);
    return;
  }
  CUlaunchAttribute attrs[4];
  int num_attrs = 0;
  if (k.launch_pdl) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[num_attrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (k.cooperative) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[num_attrs++].value.cooperative = 1;
  }
  if (k.num_ctas != 1 || cl != 1) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[num_attrs].value.clusterDim.x = k.num_ctas * cl;
    attrs[num_attrs].value.clusterDim.y = 1;
    attrs[num_attrs++].value.clusterDim.z = 1;
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[num_attrs++].value.clusterSchedulingPolicyPreference =
        CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  CUlaunchConfig cfg{};
  cfg.gridDimX = static_cast<unsigned>(grid[0] * k.num_ctas);
  cfg.gridDimY = static_cast<unsigned>(grid[1]);
  cfg.gridDimZ = static_cast<unsigned>(grid[2]);
  cfg.blockDimX = 32 * k.num_warps;
  cfg.blockDimY = 1;
  cfg.blockDimZ = 1;
  cfg.sharedMemBytes = k.shared_bytes;
  cfg.hStream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = num_attrs;
  FK_CU_CHECK(d.cuLaunchKernelEx(&cfg, fn, args.ptrs_.data(), nullptr), op,
              ": launching kernel ", k.variant);
}

}  // namespace fk::runtime
