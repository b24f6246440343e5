// The table of ahead-of-time compiled kernels that cmake/fk_aot.py generates.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fk::runtime {

struct KernelConstexpr {
  const char* name;
  int64_t value;
};

// One cubin: one variant of one kernel family for one GPU arch.
struct KernelSpec {
  const char* family;   // what an op asks for, e.g. "rms_norm_fwd"
  const char* dtype;    // "fp32" | "bf16" | "fp16"
  int64_t block;        // the bucket the variant covers
  uint32_t flags;       // specialization bits (kFlagAligned, ...)
  int arch;             // 80, 90, 100, ...: compute capability the cubin targets
  const char* entry;    // kernel symbol in the cubin
  const char* variant;  // human-readable variant key, for error messages
  int num_warps;
  int num_ctas;  // CTAs a program spans (Triton's num_ctas)
  int cluster;   // programs launched as one thread-block cluster (1: none)
  int shared_bytes;
  int global_scratch_size;
  int global_scratch_align;
  bool launch_pdl;
  bool cooperative;
  int num_params;  // explicit kernel parameters (the two scratch pointers come after)
  KernelConstexpr constexprs[6];  // up to 6 (cmake/fk_aot.py checks)
  const unsigned char* image_begin;
  const unsigned char* image_end;

  // The value a constexpr argument was compiled with; throws if it has none.
  int64_t constexpr_value(const char* name) const;
};

extern const KernelSpec kKernelTable[];
extern const size_t kKernelTableSize;
extern const char* const kBuiltArchs;  // "80;90;100;..."

}  // namespace fk::runtime
