// The helpers the CUDA kernel files share (cuda/kernels_task_a.cu, cuda/kernels_task_b.cu):
// launch limits, argument checks that answer absl::Status, dtype dispatch, f32 conversions and
// warp/block sums. Internal to cuda/; everything has internal linkage (one copy per file).
//
// Numerics of every kernel: f32 everywhere, IEEE division and sqrt (nvcc's defaults; these files
// must not be built with --use_fast_math), cosf/sinf/expf rather than the __ intrinsics. Where the
// CPU reference (cpu_attention/ops/) does a product and a sum separately, the kernels use
// __fmul_rn / __fadd_rn so nvcc cannot contract them into an FMA: RoPE, SiLU-mul and the combine do
// the CPU's operations in the CPU's order. They are not bit-equal to it: CUDA's cosf/sinf/expf are
// within 2 ulp where glibc's are nearly correctly rounded, so RoPE, SiLU and the router weights may
// differ in the last bit. Reductions (RMSNorm, q.k) run as trees, so they differ from the CPU's
// sequential sums by rounding only.
//
// Launchers validate sizes (InvalidArgument, nothing launched), pick the template instance for the
// dtypes, launch on the caller's stream and check cudaGetLastError (CheckLaunch).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/kernels.h"

namespace moebatch::gpu {
namespace {

constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();  // gridDim.x limit (2^31 - 1)
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxElementwiseBlocks = int64_t{1} << 16;  // then grid-stride loops

// --- Host helpers --------------------------------------------------------------------------------

template <typename... Args>
absl::Status Invalid(const char* fn, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(fn, ": ", args...));
}

bool ValidDType(GpuDType t) {
  return t == GpuDType::kF16 || t == GpuDType::kBF16 || t == GpuDType::kF32;
}

absl::Status CheckDType(const char* fn, const char* what, GpuDType t) {
  if (ValidDType(t)) return absl::OkStatus();
  return Invalid(fn, what, " has an unknown GpuDType (", static_cast<int>(t), ")");
}

// After a launch: the launch's own error, or an earlier asynchronous one.
absl::Status CheckLaunch(const char* fn) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(fn, ": kernel launch failed: ", cudaGetErrorName(err),
                                          " (", cudaGetErrorString(err), ")"));
}

unsigned ElementwiseBlocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(
      (n + kElementwiseThreads - 1) / kElementwiseThreads, kMaxElementwiseBlocks));
}

// Calls f(Tag<T>{}) with T the element type of `t` (validated by the caller).
template <typename T>
struct Tag {
  using type = T;
};

template <typename F>
auto Dispatch(GpuDType t, F&& f) {
  switch (t) {
    case GpuDType::kF16:
      return f(Tag<__half>{});
    case GpuDType::kBF16:
      return f(Tag<__nv_bfloat16>{});
    case GpuDType::kF32:
      break;
  }
  return f(Tag<float>{});
}

// --- Device helpers ------------------------------------------------------------------------------

__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromF32(float v);
template <>
__device__ __forceinline__ float FromF32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Sum over the 32 lanes of a warp (butterfly: every lane gets the same, deterministic result).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the block, returned to every thread. blockDim.x a multiple of 32; call at most
// once per kernel (the shared slots are not re-armed).
__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0f;
    v = WarpSum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

constexpr int kRowThreads = 256;  // one block per row: embedding, RMSNorm, gather, combine, argmax

}  // namespace
}  // namespace moebatch::gpu
