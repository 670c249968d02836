#include <cuda_runtime.h>

#include "cuda/device_probe.h"

namespace moebatch {

absl::StatusOr<std::vector<GpuInfo>> ProbeGpus() {
  std::vector<GpuInfo> gpus;
  int count = 0;
  // Without a driver or device this returns an error: that means "no GPU", not a failure.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    gpus.push_back(GpuInfo{i, prop.name, prop.major, prop.minor, prop.totalGlobalMem});
  }
  return gpus;
}

}  // namespace moebatch
