// cuda/cuda_backend.h in builds without nvcc.
#include "absl/status/status.h"
#include "cuda/cuda_backend.h"

namespace moebatch {
namespace {
absl::Status NoCuda() {
  return absl::UnavailableError("this build of moebatch has no CUDA code (nvcc was not found)");
}
}  // namespace

HostAllocator* PinnedHostAllocator() { return nullptr; }

absl::StatusOr<DType> CudaComputeDType(int device) { return NoCuda(); }

absl::StatusOr<int64_t> CudaMemoryBudget(const CudaBackendOptions& options) { return NoCuda(); }

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const WeightStore& store,
                                                         const CudaBackendOptions& options) {
  return NoCuda();
}

absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(
    int device, const std::vector<std::byte*>& device_slots, size_t slot_bytes,
    void* consumer_stream) {
  return NoCuda();
}

}  // namespace moebatch
