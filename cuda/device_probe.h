// Finds the CUDA GPUs of this host, without making CUDA a dependency of the caller.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moebatch {

struct GpuInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t total_memory_bytes = 0;
};

// The GPUs the CUDA runtime sees. An empty list when there is no GPU or no driver (the cpu backend
// applies); Unavailable when this build has no CUDA code. Thread-safe.
absl::StatusOr<std::vector<GpuInfo>> ProbeGpus();

}  // namespace moebatch
