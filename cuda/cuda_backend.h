// The cuda backend behind a CUDA-free interface: engine/ creates it through these functions and
// sees only a Device (engine/device.h), so no engine logic includes a CUDA header. Builds without
// nvcc link cuda_backend_none.cc, where every function says so (Unavailable).
//
// What the backend is (cuda/cuda_device_internal.h; MoE-Lens §6.4-6.5):
//  * one cudaMalloc of the GpuMemoryPlan (engine/offload/gpu_memory_plan.h) for the budget, carved
//  into
//    the two-slot weight buffer, the resident lm_head and final norm, the activations of
//    max_tokens_per_pass tokens, the dequantization scratch of quantized weights and the cuBLAS
//    workspace: nothing else is allocated on the device;
//  * the weights in page-locked host memory (a WeightStore made with PinnedHostAllocator()),
//    streamed layer by layer into the slots by the DataMover (engine/offload/data_mover.h) with a
//    copy engine on its own CUDA stream, packet by packet; visit i of a layer uses slot i % 2 and
//    the next layer is prefetched while L computes;
//  * task A and task B as cuda/kernels.h kernels plus cuBLAS GEMMs (f32 accumulation) on a compute
//    stream; q/k/v to the host and attention outputs back on a transfer stream, so they never
//    queue behind a weight packet.
// Precision: the compute dtype is the WeightStore's: bf16 on sm_80 and later, f16 on sm_75 (the
// T4 has no bf16 tensor cores; the store converts at load), f32 for the exactness checks.
// Quantized weights (a store with ggml-block tensors: a GGUF file's, or --weight_dtype int8|int4)
// cross PCIe and sit in the slots as blocks; each matrix is dequantized on the GPU
// (gpu::DequantizeRows: ggml's dequantize_row_<type>, rounded once to the compute dtype) into the
// scratch right before its GEMM; lm_head once at set-up into its resident buffer; the embedding's
// gathered rows to f32. So the GEMMs see the decoded weights rounded to the compute dtype (exactly
// the decoded weights in f32), where the cpu backend keeps them exact and quantizes the
// activations to int8 (cpu_attention/gemm/quant_linear.h): tests/cuda/test_cuda_backend.cc
// measures the two against each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device.h"
#include "engine/model/dtype.h"
#include "engine/model/weight_store.h"
#include "engine/offload/data_mover.h"

namespace moebatch {

struct CudaBackendOptions {
  int device = 0;                // CUDA device ordinal
  int64_t gpu_memory_bytes = 0;  // the hard budget (--gpu_memory_gb); 0: CudaMemoryBudget's
  int64_t max_tokens_per_pass = 2048;
  size_t packet_bytes = size_t{64} << 20;  // the data mover's packet
  // Layers 0..r-1 kept on the device for good (GpuMemoryPlan); the others stream through the two
  // slots. -1: as many as the budget leaves room for (MaxResidentLayers).
  int64_t resident_layers = 0;
};

// Page-locked host memory (cudaHostAlloc, portable); null in builds without CUDA. Process-wide.
HostAllocator* PinnedHostAllocator();

// The compute dtype for `device`: bf16 on sm_80 and later, f16 below. Unavailable without CUDA or
// without that device.
absl::StatusOr<DType> CudaComputeDType(int device);

// The GPU memory budget of `options`, bytes: gpu_memory_bytes when positive, else the device's free
// memory less 1 GiB left to CUDA (cuBLAS state, lazily loaded kernels). Unavailable without CUDA or
// without that device; ResourceExhausted when 1 GiB or less is free.
absl::StatusOr<int64_t> CudaMemoryBudget(const CudaBackendOptions& options);

// Debugging aid: with MOEBATCH_CUDA_GUARD_BYTES=N (0 < N <= 1 MiB) in the environment, each buffer
// carved from the arena is followed by N bytes of a fixed pattern, on top of the budget, checked
// after every pass (Logits, GreedyTokens: the device synchronised first): a kernel or copy that
// wrote past a buffer's end fails that pass with Internal naming the buffer. The arena's buffers
// share one cudaMalloc, so neither compute-sanitizer's memcheck nor the CUDA emulator sees such a
// write otherwise. The GPU tests turn it on (tests/cuda/gpu_catch_main.cc).
//
// The cuda backend's Device over `store` (which must outlive it; its dtype is the compute dtype).
// ResourceExhausted when the GpuMemoryPlan exceeds the budget (naming the parts and how many tokens
// per pass would fit), Unavailable without CUDA or a device, Internal for CUDA/cuBLAS failures,
// InvalidArgument for a MOEBATCH_CUDA_GUARD_BYTES outside its range, Unimplemented (naming the
// tensor and its type) for a quantized tensor whose type gpu::GpuDequantizes refuses.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const WeightStore& store,
                                                         const CudaBackendOptions& options);

// The data mover's CUDA copy engine (what CudaDevice uses): fills `device_slots` (device pointers
// of slot_bytes each) from pinned host memory on its own non-blocking stream, one packet in flight
// (each packet's completion awaited before the next is issued), a fill ordered after the release
// event that OnRelease records on `consumer_stream` (a cudaStream_t; null: the legacy default
// stream). For the GPU tests and benchmarks. Unavailable without CUDA.
absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(
    int device, const std::vector<std::byte*>& device_slots, size_t slot_bytes,
    void* consumer_stream);

}  // namespace moebatch
