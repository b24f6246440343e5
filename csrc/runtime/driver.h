// The CUDA driver API, resolved at run time from libcuda.so.1 so that libfk loads (and its
// CPU ops work) on machines with no GPU driver.
#pragma once

#include <cuda.h>

#include "runtime/tensor.h"

namespace fk::runtime {

struct Driver {
  decltype(&::cuInit) cuInit;
  decltype(&::cuGetErrorString) cuGetErrorString;
  decltype(&::cuDeviceGet) cuDeviceGet;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute;
  decltype(&::cuDeviceGetName) cuDeviceGetName;
  decltype(&::cuDevicePrimaryCtxRetain) cuDevicePrimaryCtxRetain;
  decltype(&::cuCtxGetCurrent) cuCtxGetCurrent;
  decltype(&::cuCtxSetCurrent) cuCtxSetCurrent;
  decltype(&::cuModuleLoadData) cuModuleLoadData;
  decltype(&::cuModuleGetFunction) cuModuleGetFunction;
  decltype(&::cuFuncSetAttribute) cuFuncSetAttribute;
  decltype(&::cuFuncGetAttribute) cuFuncGetAttribute;
  decltype(&::cuLaunchKernel) cuLaunchKernel;
  decltype(&::cuLaunchKernelEx) cuLaunchKernelEx;
};

// Loads the driver on first use (thread-safe); throws an error naming what is missing.
const Driver& driver();

// "CUDA_ERROR_...: message" for a driver result code.
const char* error_string(CUresult r);

// torch's current CUDA stream on `device` (aoti_torch_get_current_cuda_stream, looked up at
// run time: a CPU-only torch has no CUDA shim, and its CPU ops must still load).
CUstream current_stream(int device);

}  // namespace fk::runtime

// Checks a driver call; on failure throws with the context (any number of message parts,
// formatted only on failure) and the CUDA error.
#define FK_CU_CHECK(expr, ...)                                                     \
  do {                                                                             \
    CUresult fk_cu_result_ = (expr);                                               \
    FK_CHECK(fk_cu_result_ == CUDA_SUCCESS, __VA_ARGS__, ": ", #expr, " failed: ", \
             ::fk::runtime::error_string(fk_cu_result_));                          \
  } while (0)
