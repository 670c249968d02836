// Helpers of the CUDA kernel tests (test_cuda_kernels_task_a.cc, test_cuda_kernels_task_b.cc):
// CUDA_REQUIRE / STATUS_REQUIRE, a stream, device buffers, values stored as f32/bf16/f16 with their
// exact f32 values, random inputs, and the relative error the tolerances apply to (1e-5 for f32
// outputs, 1e-2 for bf16/f16). Test-only; every function runs on the calling thread.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda/kernels.h"

namespace moebatch::gpu::testing {

#define CUDA_REQUIRE(expr)                                \
  do {                                                    \
    const cudaError_t cuda_err_ = (expr);                 \
    INFO(#expr << ": " << cudaGetErrorString(cuda_err_)); \
    REQUIRE(cuda_err_ == cudaSuccess);                    \
  } while (0)

#define STATUS_REQUIRE(expr)                   \
  do {                                         \
    const absl::Status status_ = (expr);       \
    INFO(#expr << ": " << status_.ToString()); \
    REQUIRE(status_.ok());                     \
  } while (0)

inline constexpr GpuDType kAllDTypes[] = {GpuDType::kF32, GpuDType::kBF16, GpuDType::kF16};

inline const char* Name(GpuDType t) {
  return t == GpuDType::kF32 ? "f32" : t == GpuDType::kBF16 ? "bf16" : "f16";
}

inline double Tolerance(GpuDType out) { return out == GpuDType::kF32 ? 1e-5 : 1e-2; }

// A CUDA stream for the kernels under test.
class Stream {
 public:
  Stream() { CUDA_REQUIRE(cudaStreamCreate(&stream_)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void Sync() const { CUDA_REQUIRE(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

// n elements of T in device memory.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    CUDA_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  void Upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    CUDA_REQUIRE(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    CUDA_REQUIRE(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Values stored as `dtype`: the bytes to upload and the exact f32 value of each element.
struct HostTensor {
  GpuDType dtype;
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

inline HostTensor Store(GpuDType dtype, const std::vector<float>& x) {
  HostTensor t{dtype, std::vector<unsigned char>(x.size() * GpuDTypeSize(dtype)),
               std::vector<float>(x.size())};
  for (size_t i = 0; i < x.size(); ++i) {
    unsigned char* dst = t.bytes.data() + i * GpuDTypeSize(dtype);
    if (dtype == GpuDType::kF32) {
      t.values[i] = x[i];
      std::memcpy(dst, &x[i], 4);
    } else if (dtype == GpuDType::kBF16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
      t.values[i] = __bfloat162float(b);
      std::memcpy(dst, &b, 2);
    } else {
      const __half h = __float2half_rn(x[i]);
      t.values[i] = __half2float(h);
      std::memcpy(dst, &h, 2);
    }
  }
  return t;
}

// The f32 values of n elements of `dtype` held in `bytes`.
inline std::vector<float> Load(GpuDType dtype, const std::vector<unsigned char>& bytes) {
  const size_t n = bytes.size() / GpuDTypeSize(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* src = bytes.data() + i * GpuDTypeSize(dtype);
    if (dtype == GpuDType::kF32) {
      std::memcpy(&out[i], src, 4);
    } else if (dtype == GpuDType::kBF16) {
      __nv_bfloat16 b;
      std::memcpy(&b, src, 2);
      out[i] = __bfloat162float(b);
    } else {
      __half h;
      std::memcpy(&h, src, 2);
      out[i] = __half2float(h);
    }
  }
  return out;
}

inline std::vector<float> Normal(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// max |got - want| / max |want|; infinite when got holds a NaN or an infinity.
template <typename Want>
double MaxRelError(const std::vector<float>& got, const std::vector<Want>& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    ref = std::max(ref, std::abs(static_cast<double>(want[i])));
  }
  return ref > 0 ? err / ref : err;
}

}  // namespace moebatch::gpu::testing
