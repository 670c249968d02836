// Shared by tests/cuda/test_backend_ops*.cc: every kernel of cuda/kernels.h against the cpu
// backend's op of the same name (cpu_attention/ops/ops.h), the outputs compared under the op's
// tolerance.
//
// Tolerances (GPU against CPU; the reasons are kernels.h's and kernels_common.cuh's promises):
//   exact          copies, index ops and conversions (EmbeddingGather, GatherRows,
//                  BuildExpertPermutation, ArgmaxRows, RouterTopK's ids, AddResidual,
//                  ConvertF32To, ConvertToF32), DequantizeRows (DequantizeRow's f32 operations,
//                  then one rounding) and CombineExperts (the CPU's products and sums,
//                  each rounded, in the CPU's order); bitwise, a NaN matching any NaN
//   ulp(n)         elementwise, n units in the last place of the output dtype: SiLU-mul f32 4 and
//                  router weights 16 (CUDA's expf is within 2 ulp of glibc's), 16-bit outputs 1
//                  (the f32 values before the rounding may differ in their last bits)
//   relative(x)    max |gpu - cpu| / max |cpu|: RMSNorm f32 1e-5 (a block tree against the CPU's
//                  sequential sum of squares), RoPE 2e-6 (cosf/sinf within 2 ulp, then a
//                  difference of products), prefill attention 1e-5 (tiles of 64 keys and warp-tree
//                  dot products against the CPU's per-key online softmax), the task B chain 1e-5
// On the emulator the device's expf/cosf are the host's, so the ulp and RoPE rows are met exactly
// there; the bounds are for a GPU.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace moebatch::gpu::testing {

// The backends compared with the cpu ops: this program's CUDA device.
inline constexpr const char* kBackend = "cuda";

// How close a backend's output must be to the cpu op's.
struct Tolerance {
  enum Kind { kExact, kUlp, kRelative } kind = kExact;
  double bound = 0;  // kUlp: units in the last place of the output dtype; kRelative: see above
};
constexpr Tolerance Exact() { return {Tolerance::kExact, 0}; }
constexpr Tolerance Ulp(double n) { return {Tolerance::kUlp, n}; }
constexpr Tolerance Relative(double x) { return {Tolerance::kRelative, x}; }

inline std::string Describe(Tolerance t) {
  std::ostringstream out;
  out << (t.kind == Tolerance::kExact ? "exact" : t.kind == Tolerance::kUlp ? "ulp" : "relative");
  if (t.kind != Tolerance::kExact) out << " " << t.bound;
  return out.str();
}

// Index of the first element of a and b (`dtype` bytes) whose bits differ, unless both are NaN;
// -1 when none does.
inline int64_t FirstMismatch(GpuDType dtype, const std::vector<unsigned char>& a,
                             const std::vector<unsigned char>& b) {
  const size_t elem = GpuDTypeSize(dtype);
  const std::vector<float> fa = Load(dtype, a), fb = Load(dtype, b);
  for (size_t i = 0; i < a.size(); i += elem) {
    if (std::memcmp(a.data() + i, b.data() + i, elem) == 0) continue;
    if (std::isnan(fa[i / elem]) && std::isnan(fb[i / elem])) continue;
    return static_cast<int64_t>(i / elem);
  }
  return -1;
}

// The backend's output against the cpu op's, both `dtype` elements.
inline void CheckOutput(const char* what, GpuDType dtype, const std::vector<unsigned char>& got,
                        const std::vector<unsigned char>& want, Tolerance tol) {
  INFO(kBackend << " " << what << " (" << Name(dtype) << ") against the cpu op, " << Describe(tol));
  REQUIRE(got.size() == want.size());
  switch (tol.kind) {
    case Tolerance::kExact: {
      const int64_t at = FirstMismatch(dtype, got, want);
      std::ostringstream first;
      if (at >= 0) {
        first << "first difference at element " << at << ": " << std::setprecision(9)
              << Load(dtype, got)[at] << " against " << Load(dtype, want)[at];
      }
      INFO(first.str());
      CHECK(at < 0);
      break;
    }
    case Tolerance::kUlp: {
      const int64_t ulp = MaxUlpDistance(dtype, got, want);
      CAPTURE(ulp);
      CHECK(ulp <= tol.bound);
      break;
    }
    case Tolerance::kRelative: {
      const double err = MaxRelError(Load(dtype, got), Load(dtype, want));
      CAPTURE(err);
      CHECK(err <= tol.bound);
      break;
    }
  }
}

inline void CheckOutput(const char* what, const std::vector<float>& got,
                        const std::vector<float>& want, Tolerance tol) {
  CheckOutput(what, GpuDType::kF32, Bytes(got), Bytes(want), tol);
}

inline void CheckIds(const char* what, const std::vector<int32_t>& got,
                     const std::vector<int32_t>& want) {
  INFO(kBackend << " " << what << " against the cpu op, exact");
  CHECK(got == want);
}

// The tolerance of an output that is an f32 value rounded to `out` (f32: `f32`; 16-bit: 1 ulp).
inline Tolerance Rounded(GpuDType out, Tolerance f32) {
  return out == GpuDType::kF32 ? f32 : Ulp(1);
}

// top_k distinct random experts per token.
inline std::vector<int32_t> RandomChoices(std::mt19937& rng, int64_t tokens, int64_t top_k,
                                          int64_t experts) {
  std::vector<int32_t> all(experts), ids;
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  return ids;
}

inline std::vector<float> RopeInvFreq(int64_t d, float theta) {  // as CpuDevice::Create
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  }
  return inv_freq;
}

}  // namespace moebatch::gpu::testing
