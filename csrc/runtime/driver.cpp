#include "runtime/driver.h"

#include <dlfcn.h>


#include <mutex>
#include <string>

namespace fk::runtime {
namespace {

template <typename T>
void resolve(void* lib, const char* name, T& fn) {
  fn = reinterpret_cast<T>(dlsym(lib, name));
  FK_CHECK(fn != nullptr, "fk: the CUDA driver (libcuda.so.1) has no symbol ", name,
              "; the driver is too old for this build of fk");
}

Driver load_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  FK_CHECK(lib != nullptr,
              "fk: cannot load the CUDA driver (libcuda.so.1): ", dlerror(),
              ". CUDA ops need an NVIDIA driver; CPU ops work without one.");
  Driver d{};
  resolve(lib, "cuInit", d.cuInit);
  resolve(lib, "cuGetErrorString", d.cuGetErrorString);
  resolve(lib, "cuDeviceGet", d.cuDeviceGet);
  resolve(lib, "cuDeviceGetAttribute", d.cuDeviceGetAttribute);
  resolve(lib, "cuDeviceGetName", d.cuDeviceGetName);
  resolve(lib, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
  resolve(lib, "cuCtxGetCurrent", d.cuCtxGetCurrent);
  resolve(lib, "cuCtxSetCurrent", d.cuCtxSetCurrent);
  resolve(lib, "cuModuleLoadData", d.cuModuleLoadData);
  resolve(lib, "cuModuleGetFunction", d.cuModuleGetFunction);
  resolve(lib, "cuFuncSetAttribute", d.cuFuncSetAttribute);
  resolve(lib, "cuFuncGetAttribute", d.cuFuncGetAttribute);
  resolve(lib, "cuLaunchKernel", d.cuLaunchKernel);
  resolve(lib, "cuLaunchKernelEx", d.cuLaunchKernelEx);
  CUresult r = d.cuInit(0);
  FK_CHECK(r == CUDA_SUCCESS, "fk: cuInit failed with CUDA error ", static_cast<int>(r));
  return d;
}

}  // namespace

const Driver& driver() {
  static const Driver d = load_driver();  // thread-safe static initialization
  return d;
}

const char* error_string(CUresult r) {
  const char* s = nullptr;
  if (driver().cuGetErrorString(r, &s) != CUDA_SUCCESS || s == nullptr) {
    return "unknown CUDA error";
  }
  return s;
}

namespace {

using GetStream = int32_t (*)(int32_t device_index, void** ret_stream);

GetStream load_stream_getter() {
  const char* name = "aoti_torch_get_current_cuda_stream";
  void* fn = dlsym(RTLD_DEFAULT, name);
  if (fn == nullptr) {
    // torch's libraries are loaded with local symbol scope from Python: ask the already
    // loaded libtorch_cuda.so directly.
    if (void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD)) fn = dlsym(lib, name);
  }
  FK_CHECK(fn != nullptr, "fk: this torch has no ", name,
           " (a CPU-only build of torch?); fk's CUDA ops need a CUDA build of torch");
  return reinterpret_cast<GetStream>(fn);
}

}  // namespace

CUstream current_stream(int device) {
  static const GetStream get = load_stream_getter();
  void* stream = nullptr;
  FK_CHECK(get(device, &stream) == 0, "fk: cannot get torch's current CUDA stream on cuda:",
           device);
  return static_cast<CUstream>(stream);
}

}  // namespace fk::runtime
