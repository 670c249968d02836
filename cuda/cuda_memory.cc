#include "cuda/cuda_memory.h"

#include "cuda/cuda_backend.h"

namespace moebatch {

absl::StatusOr<std::byte*> PinnedAllocator::Allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot pin ", bytes, " bytes of host memory (cudaHostAlloc: ", cudaGetErrorString(err),
        "; is LimitMEMLOCK infinity?)"));
  }
  return static_cast<std::byte*>(p);
}

absl::StatusOr<std::byte*> DevicePinnedAllocator::Allocate(size_t bytes) {
  if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device_, ": ", cudaGetErrorString(err)));
  }
  return pinned_.Allocate(bytes);
}

absl::StatusOr<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::Create(
    int device, std::vector<std::byte*> slots, size_t slot_bytes, cudaStream_t consumer) {
  std::unique_ptr<CudaCopyEngine> e(new CudaCopyEngine());
  e->device_ = device;
  e->slots_ = std::move(slots);
  e->slot_bytes_ = slot_bytes;
  e->consumer_ = consumer;
  MB_RETURN_IF_ERROR(CudaError(cudaSetDevice(device), "cudaSetDevice"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamCreateWithFlags(&e->stream_, cudaStreamNonBlocking),
                               "data mover stream"));
  constexpr unsigned kFlags = cudaEventDisableTiming | cudaEventBlockingSync;
  MB_RETURN_IF_ERROR(CudaError(cudaEventCreateWithFlags(&e->packet_, kFlags), "data mover event"));
  e->released_.assign(e->slots_.size(), nullptr);
  for (cudaEvent_t& ev : e->released_) {
    MB_RETURN_IF_ERROR(CudaError(cudaEventCreateWithFlags(&ev, kFlags), "slot event"));
  }
  return e;
}

CudaCopyEngine::~CudaCopyEngine() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaEvent_t ev : released_) {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
  if (packet_ != nullptr) cudaEventDestroy(packet_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaCopyEngine::BeforeFill(int slot) {
  MB_RETURN_IF_ERROR(CudaError(cudaSetDevice(device_), "cudaSetDevice (data mover)"));
  // An event never recorded (the slot's first fill) is complete.
  return CudaError(cudaEventSynchronize(released_[slot]), "wait for slot release");
}

absl::Status CudaCopyEngine::CopyPacket(int slot, size_t offset, const std::byte* src,
                                        size_t bytes) {
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(slots_[slot] + offset, src, bytes, cudaMemcpyHostToDevice, stream_),
                "weight packet H2D"));
  MB_RETURN_IF_ERROR(CudaError(cudaEventRecord(packet_, stream_), "packet event"));
  return CudaError(cudaEventSynchronize(packet_), "weight packet");
}

void CudaCopyEngine::OnRelease(int slot) {
  // Called on the compute thread (the device is current there). Should the record fail, the event
  // keeps its last record and the next fill could overwrite the slot early; the failure is a CUDA
  // error that the compute stream's next synchronisation reports anyway.
  cudaEventRecord(released_[slot], consumer_);
}

// --- cuda/cuda_backend.h
// --------------------------------------------------------------------------

HostAllocator* PinnedHostAllocator() {
  static PinnedAllocator* allocator = new PinnedAllocator();
  return allocator;
}

absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(
    int device, const std::vector<std::byte*>& device_slots, size_t slot_bytes,
    void* consumer_stream) {
  auto engine = CudaCopyEngine::Create(device, device_slots, slot_bytes,
                                       static_cast<cudaStream_t>(consumer_stream));
  if (!engine.ok()) return engine.status();
  return std::unique_ptr<CopyEngine>(*std::move(engine));
}

}  // namespace moebatch
