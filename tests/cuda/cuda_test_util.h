// Helpers of the CUDA kernel tests (test_backend_ops.cc, test_cuda_kernels_task_a.cc,
// test_cuda_kernels_task_b.cc): CUDA_REQUIRE / STATUS_REQUIRE, a stream, device buffers, values
// stored as f32/bf16/f16 (by the cpu backend's conversions, cpu_attention/ops/ops.h) with their
// exact f32 values, random inputs, and the error measures the tolerances apply to. Test-only;
// every function runs on the calling thread. The programs that include it link moebatch_cpu_ops.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu_attention/ops/ops.h"
#include "cuda/kernels.h"
#include "engine/model/dtype.h"

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

// The cpu ops' name for a GPU element type (same storage: f32, IEEE f16, bf16 bit patterns).
inline DType CpuDType(GpuDType t) {
  return t == GpuDType::kF32 ? DType::kF32 : t == GpuDType::kBF16 ? DType::kBF16 : DType::kF16;
}

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
  const auto n = static_cast<int64_t>(x.size());
  HostTensor t{dtype, std::vector<unsigned char>(x.size() * GpuDTypeSize(dtype)),
               std::vector<float>(x.size())};
  STATUS_REQUIRE(cpu_ops::ConvertF32To(x.data(), n, t.bytes.data(), CpuDType(dtype)));
  STATUS_REQUIRE(cpu_ops::ConvertToF32(t.bytes.data(), CpuDType(dtype), n, t.values.data()));
  return t;
}

// The f32 values of the elements of `dtype` held in `bytes`.
inline std::vector<float> Load(GpuDType dtype, const std::vector<unsigned char>& bytes) {
  const auto n = static_cast<int64_t>(bytes.size() / GpuDTypeSize(dtype));
  std::vector<float> out(n);
  STATUS_REQUIRE(cpu_ops::ConvertToF32(bytes.data(), CpuDType(dtype), n, out.data()));
  return out;
}

inline std::vector<float> Normal(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// max |got - want| / max |want| over the elements; an element NaN in both counts as equal, a NaN
// or an infinity in one only makes the error infinite.
template <typename Want>
double MaxRelError(const std::vector<float>& got, const std::vector<Want>& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = static_cast<double>(want[i]);
    if (std::isnan(g) && std::isnan(w)) continue;
    if (!std::isfinite(g) || !std::isfinite(w)) {
      if (g == w) continue;  // the same infinity
      return std::numeric_limits<double>::infinity();
    }
    err = std::max(err, std::abs(g - w));
    ref = std::max(ref, std::abs(w));
  }
  return ref > 0 ? err / ref : err;
}

// The largest distance in units in the last place of `dtype` between elements of a and b (byte
// buffers of that dtype): how many representable values lie between them (+0 and -0 are one
// value). An element NaN in both counts as equal; NaN in one only gives the maximum of int64.
inline int64_t MaxUlpDistance(GpuDType dtype, const std::vector<unsigned char>& a,
                              const std::vector<unsigned char>& b) {
  REQUIRE(a.size() == b.size());
  const size_t elem = GpuDTypeSize(dtype);
  const int bits = static_cast<int>(elem * 8);
  const uint64_t sign = uint64_t{1} << (bits - 1);
  const uint64_t exp_mask = dtype == GpuDType::kF32    ? 0x7f800000u
                            : dtype == GpuDType::kBF16 ? 0x7f80u
                                                       : 0x7c00u;
  auto is_nan = [&](uint64_t u) { return (u & exp_mask) == exp_mask && (u & ~sign & ~exp_mask); };
  auto key = [&](uint64_t u) {  // monotonic in the value
    const auto magnitude = static_cast<int64_t>(u & ~sign);
    return (u & sign) ? -magnitude : magnitude;
  };
  int64_t worst = 0;
  for (size_t i = 0; i < a.size(); i += elem) {
    uint64_t ua = 0, ub = 0;
    std::memcpy(&ua, a.data() + i, elem);
    std::memcpy(&ub, b.data() + i, elem);
    if (is_nan(ua) || is_nan(ub)) {
      if (is_nan(ua) && is_nan(ub)) continue;
      return std::numeric_limits<int64_t>::max();
    }
    worst = std::max(worst, std::abs(key(ua) - key(ub)));
  }
  return worst;
}

template <typename T>
std::vector<unsigned char> Bytes(const std::vector<T>& v) {
  std::vector<unsigned char> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace moebatch::gpu::testing
