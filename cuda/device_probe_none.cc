#include "absl/status/status.h"
#include "cuda/device_probe.h"

namespace moebatch {

absl::StatusOr<std::vector<GpuInfo>> ProbeGpus() {
  return absl::UnavailableError("this build of moebatch has no CUDA code (nvcc was not found)");
}

}  // namespace moebatch
