// cuda/kernels.h: what is particular to the kernels, task A and the elementwise ones (the argument
// checks of every kernel, with the GPU's own launch limits: kMaxRouterExperts,
// kMaxPermutationExperts, kMaxCombineTopK, kMaxAttentionHeadDim, RoPE's d <= 1024; zero rows
// launch nothing). What each kernel computes is checked against the cpu backend's op of the same
// name in test_backend_ops.cc, on every shape and dtype there. Needs a CUDA GPU: without one the
// binary exits 77 (tests/cuda/gpu_catch_main.cc) and ctest shows the tests as skipped.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <vector>

#include "cuda/kernels.h"
#include "tests/cuda/cuda_test_util.h"

using namespace moebatch::gpu;
using namespace moebatch::gpu::testing;

TEST_CASE("Bad sizes are InvalidArgument and launch nothing", "[cuda]") {
  Stream stream;
  const std::vector<float> ones(1024, 1.0f);
  const std::vector<int32_t> zeros(1024, 0);
  DeviceBuffer<float> f(ones);
  DeviceBuffer<int32_t> i32(zeros);
  DeviceBuffer<int64_t> i64(16);
  const cudaStream_t s = stream.get();
  const auto bad_dtype = static_cast<GpuDType>(7);
  auto invalid = [](const absl::Status& st) {
    INFO(st.ToString());
    return st.code() == absl::StatusCode::kInvalidArgument;
  };
  CHECK(invalid(EmbeddingGather(f.get(), bad_dtype, 4, 4, i32.get(), 1, f.get(), s)));
  CHECK(invalid(EmbeddingGather(f.get(), GpuDType::kF32, 0, 4, i32.get(), 1, f.get(), s)));
  CHECK(invalid(EmbeddingGather(nullptr, GpuDType::kF32, 4, 4, i32.get(), 1, f.get(), s)));
  CHECK(
      invalid(RmsNorm(f.get(), f.get(), GpuDType::kF32, 1, 0, 1e-5f, f.get(), GpuDType::kF32, s)));
  CHECK(
      invalid(RmsNorm(f.get(), f.get(), GpuDType::kF32, -1, 4, 1e-5f, f.get(), GpuDType::kF32, s)));
  CHECK(invalid(RmsNorm(f.get(), f.get(), GpuDType::kF32, 1, 4, 1e-5f, f.get(), GpuDType::kBF16,
                        s)));  // in place into another dtype
  CHECK(invalid(ApplyRope(f.get(), 1, 1, 3, i64.get(), f.get(), 1.0f, s)));     // odd d
  CHECK(invalid(ApplyRope(f.get(), 1, 1, 2048, i64.get(), f.get(), 1.0f, s)));  // d too large
  CHECK(invalid(RouterTopK(f.get(), 1, 257, 2, i32.get(), f.get(), true, s)));
  CHECK(invalid(RouterTopK(f.get(), 1, 8, 0, i32.get(), f.get(), true, s)));
  CHECK(invalid(RouterTopK(f.get(), 1, 8, 9, i32.get(), f.get(), true, s)));
  CHECK(invalid(BuildExpertPermutation(i32.get(), 1, 2, 257, i32.get(), i32.get(), i32.get(), s)));
  CHECK(invalid(BuildExpertPermutation(i32.get(), 1, 2, 8, nullptr, i32.get(), i32.get(), s)));
  CHECK(invalid(GatherRows(f.get(), GpuDType::kF32, 4, 0, i32.get(), 1, f.get(), s)));
  CHECK(invalid(ArgmaxRows(f.get(), 1, 0, i32.get(), s)));
  CHECK(invalid(ArgmaxRows(nullptr, 1, 4, i32.get(), s)));
  CHECK(invalid(SiluMul(f.get(), f.get(), GpuDType::kF32, 1, 4, f.get(), GpuDType::kF16, s)));
  CHECK(invalid(
      CombineExperts(f.get(), i32.get(), i32.get(), f.get(), 1, 65, 4, f.get(), nullptr, s)));
  CHECK(invalid(AddResidual(f.get(), f.get(), -1, s)));
  CHECK(invalid(ConvertF32To(f.get(), 4, f.get(), bad_dtype, s)));
  CHECK(invalid(ConvertToF32(nullptr, GpuDType::kBF16, 4, f.get(), s)));
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 6, 4, 64, 0.125f, 0,
                                 nullptr, f.get(), s)));  // heads not a multiple of kv_heads
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 8, 2, 1025, 0.125f, 0,
                                 nullptr, f.get(), s)));
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 8, 2, 64, 0.125f, -1,
                                 nullptr, f.get(), s)));
  // Zero rows is fine and launches nothing.
  CHECK(RmsNorm(nullptr, nullptr, GpuDType::kF32, 0, 4, 1e-5f, nullptr, GpuDType::kF32, s).ok());
  CHECK(PrefillAttention(nullptr, nullptr, nullptr, nullptr, 0, 0, 8, 2, 64, 0.125f, 0, nullptr,
                         nullptr, s)
            .ok());
  stream.Sync();
  // Nothing was launched: every buffer an invalid call was given as its output is as uploaded.
  CHECK(f.Download() == ones);
  CHECK(i32.Download() == zeros);
}
