// The cuda backend's host memory and copy engine (internal to cuda/; includes CUDA headers):
//  * PinnedAllocator: page-locked host memory (cudaHostAlloc, portable), the WeightStore's for the
//    cuda backend (cuda/cuda_backend.h: PinnedHostAllocator);
//  * DevicePinnedAllocator: the same with the engine's GPU made current first, for the model
//    runner's q/k/v/attention buffers (Device::host_buffer_allocator);
//  * CudaCopyEngine: the data mover's CopyEngine (engine/offload/data_mover.h) that fills device
//    weight slots from pinned memory on its own stream (MoE-Lens §6.5);
// and CudaError / MB_RETURN_IF_ERROR for CUDA runtime calls. Errors as absl::Status: Internal for
// CUDA failures, ResourceExhausted when memory cannot be pinned, Unavailable for a device that
// cannot be made current. Thread-safety: the allocators are thread-safe; the copy engine as
// CopyEngine says (BeforeFill/CopyPacket on the mover thread, OnRelease on the consumer's).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model/host_memory.h"
#include "engine/offload/data_mover.h"

namespace moebatch {

// OK for cudaSuccess, else Internal "what: <CUDA's message>".
inline absl::Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

#define MB_RETURN_IF_ERROR(expr)             \
  do {                                       \
    absl::Status mb_status_ = (expr);        \
    if (!mb_status_.ok()) return mb_status_; \
  } while (0)

// Page-locked host memory (cudaHostAlloc, portable: usable with every device), 4096-aligned.
class PinnedAllocator final : public HostAllocator {
 public:
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override;
  void Free(std::byte* data, size_t bytes) override { cudaFreeHost(data); }
  const char* name() const override { return "pinned"; }
};

// Page-locked memory allocated with `device` current on the calling thread, so that a thread that
// never touched the GPU does not create another device's context (--gpu_device=1 stepped from a
// server thread). For the model runner's q/k/v/attention buffers.
class DevicePinnedAllocator final : public HostAllocator {
 public:
  explicit DevicePinnedAllocator(int device) : device_(device) {}
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override;
  void Free(std::byte* data, size_t bytes) override { pinned_.Free(data, bytes); }
  const char* name() const override { return "pinned"; }

 private:
  int device_;
  PinnedAllocator pinned_;
};

// Device slots filled from pinned memory on the mover's own stream, one packet in flight at a time
// (each packet's event is waited for before the next is issued, MoE-Lens §6.5). A fill is ordered
// after the consumer's release of the slot: OnRelease records an event on the compute stream, and
// BeforeFill waits on the host until the compute stream has passed it (so the mover's busy time is
// copying only). The events block rather than spin: the mover thread must not take a core from
// CPU attention while a packet is in flight.
class CudaCopyEngine final : public CopyEngine {
 public:
  // Slots: device pointers of slot_bytes each; consumer: the stream that reads them.
  static absl::StatusOr<std::unique_ptr<CudaCopyEngine>> Create(int device,
                                                                std::vector<std::byte*> slots,
                                                                size_t slot_bytes,
                                                                cudaStream_t consumer);
  ~CudaCopyEngine() override;

  int num_slots() const override { return static_cast<int>(slots_.size()); }
  size_t slot_bytes() const override { return slot_bytes_; }
  absl::Status BeforeFill(int slot) override;
  absl::Status CopyPacket(int slot, size_t offset, const std::byte* src, size_t bytes) override;
  absl::Status AfterFill(int slot) override { return absl::OkStatus(); }
  void OnRelease(int slot) override;

 private:
  CudaCopyEngine() = default;
  int device_ = 0;
  std::vector<std::byte*> slots_;
  size_t slot_bytes_ = 0;
  cudaStream_t consumer_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t packet_ = nullptr;
  std::vector<cudaEvent_t> released_;
};

}  // namespace moebatch
