// What the CUDA emulator's runtime (runtime.cc) shares with its cuBLAS (cublas.cc). Internal to
// tests/cuda_emulation/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

namespace moebatch::cuda_emulation {

// Where a byte range lies: in one device allocation (cudaMalloc), in one page-locked host
// allocation (cudaHostAlloc), in neither (pageable host memory), or across an allocation's end.
enum class Where { kPageable, kPinned, kDevice, kStraddles };
Where Locate(const void* p, size_t bytes);

// Queues `work` in `stream`'s order, on its thread. The legacy default stream (nullptr,
// cudaStreamLegacy, cudaStreamPerThread) has a thread too; its work starts after every blocking
// stream's earlier work, and a blocking stream's after the default stream's.
void RunInStream(cudaStream_t stream, std::function<void()> work);

// Waits until every stream is idle (cudaDeviceSynchronize).
void SynchronizeAll();

// Whether `stream` is the default stream or one cudaStreamCreate* made and not yet destroyed.
bool KnownStream(cudaStream_t stream);

// cudaGetLastError's error of the calling host thread.
void SetLastError(cudaError_t err);

// A kernel failed (a deadlock at a barrier): like a GPU's sticky error, every later
// synchronisation answers cudaErrorLaunchFailure, and no further kernel runs.
void Fault();
bool Faulted();

// Prints "cuda emulation: <message>" to stderr: what the emulator found wrong, which a GPU would
// have answered with an error or a fault.
void Report(const std::string& message);

}  // namespace moebatch::cuda_emulation
