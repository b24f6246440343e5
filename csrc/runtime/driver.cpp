#include "runtime/driver.h"

#include <dlfcn.h>

#include <c10/util/Exception.h>

#include <mutex>
#include <string>

namespace fk::runtime {
namespace {

template <typename T>
void resolve(void* lib, const char* name, T& fn) {
  fn = reinterpret_cast<T>(dlsym(lib, name));
  TORCH_CHECK(fn != nullptr, "fk: the CUDA driver (libcuda.so.1) has no symbol ", name,
              "; the driver is too old for this build of fk");
}

Driver load_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(lib != nullptr,
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
  TORCH_CHECK(r == CUDA_SUCCESS, "fk: cuInit failed with CUDA error ", static_cast<int>(r));
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

}  // namespace fk::runtime
