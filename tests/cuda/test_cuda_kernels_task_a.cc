// cuda/kernels.h, task A and the elementwise kernels (embedding gather, RMSNorm, RoPE, prefill
// attention, residual and conversions, argument checks) against straightforward CPU loops (float64,
// or float in the CPU backend's order where the kernel promises the CPU's rounding), on random
// inputs of several sizes, odd ones included. Tolerances: 1e-5 relative (max abs error / max abs
// reference) for f32 outputs, 1e-2 for bf16/f16 outputs; exact for indices, copies and
// conversions. Needs a CUDA GPU: without one the binary exits 77 (tests/cuda/gpu_catch_main.cc) and
// ctest shows the tests as skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/kernels.h"
#include "tests/cuda/cuda_test_util.h"

using namespace moebatch::gpu;
using namespace moebatch::gpu::testing;

TEST_CASE("EmbeddingGather widens the rows of the ids, zero rows for bad ids", "[cuda]") {
  std::mt19937 rng(1);
  Stream stream;
  const int64_t vocab = 50;
  for (GpuDType dtype : kAllDTypes) {
    for (int64_t hidden : {4096, 100}) {
      const HostTensor table = Store(dtype, Normal(rng, vocab * hidden));
      DeviceBuffer<unsigned char> table_d(table.bytes);
      for (int64_t tokens : {1, 37}) {
        CAPTURE(Name(dtype), hidden, tokens);
        std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
        std::vector<int32_t> ids(tokens);
        for (int32_t& id : ids) id = pick(rng);
        if (tokens > 7) {
          ids[5] = -1;
          ids[6] = static_cast<int32_t>(vocab);
        }
        DeviceBuffer<int32_t> ids_d(ids);
        DeviceBuffer<float> h_d(tokens * hidden);
        STATUS_REQUIRE(EmbeddingGather(table_d.get(), dtype, vocab, hidden, ids_d.get(), tokens,
                                       h_d.get(), stream.get()));
        stream.Sync();
        std::vector<float> want(tokens * hidden, 0.0f);
        for (int64_t t = 0; t < tokens; ++t) {
          if (ids[t] < 0 || ids[t] >= vocab) continue;
          std::copy_n(table.values.data() + ids[t] * hidden, hidden, want.data() + t * hidden);
        }
        CHECK(h_d.Download() == want);
      }
    }
  }
}

TEST_CASE("RmsNorm matches MixtralRMSNorm in float64", "[cuda]") {
  std::mt19937 rng(2);
  Stream stream;
  const float eps = 1e-5f;
  struct Shape {
    int64_t rows, n;
  };
  for (Shape s : {Shape{1, 4096}, Shape{37, 100}, Shape{5, 4096}, Shape{3, 1}, Shape{2, 6144}}) {
    const std::vector<float> x = Normal(rng, s.rows * s.n, 3.0f);
    DeviceBuffer<float> x_d(x);
    for (GpuDType wtype : kAllDTypes) {
      const HostTensor w = Store(wtype, Normal(rng, s.n));
      DeviceBuffer<unsigned char> w_d(w.bytes);
      std::vector<double> want(s.rows * s.n);
      for (int64_t r = 0; r < s.rows; ++r) {
        double sum_sq = 0;
        for (int64_t i = 0; i < s.n; ++i) sum_sq += double(x[r * s.n + i]) * x[r * s.n + i];
        const double inv = 1.0 / std::sqrt(sum_sq / s.n + eps);
        for (int64_t i = 0; i < s.n; ++i) {
          want[r * s.n + i] = w.values[i] * (x[r * s.n + i] * inv);
        }
      }
      for (GpuDType otype : kAllDTypes) {
        CAPTURE(s.rows, s.n, Name(wtype), Name(otype));
        DeviceBuffer<unsigned char> out_d(s.rows * s.n * GpuDTypeSize(otype));
        STATUS_REQUIRE(RmsNorm(x_d.get(), w_d.get(), wtype, s.rows, s.n, eps, out_d.get(), otype,
                               stream.get()));
        stream.Sync();
        const double err = MaxRelError(Load(otype, out_d.Download()), want);
        CAPTURE(err);
        CHECK(err <= Tolerance(otype));
      }
      // In place (f32 out).
      DeviceBuffer<float> inplace_d(x);
      STATUS_REQUIRE(RmsNorm(inplace_d.get(), w_d.get(), wtype, s.rows, s.n, eps, inplace_d.get(),
                             GpuDType::kF32, stream.get()));
      stream.Sync();
      CHECK(MaxRelError(inplace_d.Download(), want) <= 1e-5);
    }
  }
}

TEST_CASE("ApplyRope matches rotate_half with f32 angles", "[cuda]") {
  std::mt19937 rng(3);
  Stream stream;
  struct Shape {
    int64_t tokens, heads, d;
  };
  for (Shape s :
       {Shape{37, 32, 128}, Shape{1, 8, 128}, Shape{37, 8, 64}, Shape{5, 3, 2}, Shape{4, 2, 256}}) {
    CAPTURE(s.tokens, s.heads, s.d);
    const int64_t half = s.d / 2;
    std::vector<float> inv_freq(half);  // as CpuDevice::Create, rope_theta 1e6 (Mixtral)
    for (int64_t i = 0; i < half; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(s.d);
      inv_freq[i] = 1.0f / std::pow(1e6f, exponent);
    }
    std::uniform_int_distribution<int64_t> pick(0, 32767);
    std::vector<int64_t> positions(s.tokens);
    for (int64_t& p : positions) p = pick(rng);
    positions[0] = 0;
    const std::vector<float> x = Normal(rng, s.tokens * s.heads * s.d);
    std::vector<double> want(x.size());
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float freq = static_cast<float>(positions[t]) * inv_freq[i];  // f32, as the CPU
        const double c = std::cos(static_cast<double>(freq));
        const double sn = std::sin(static_cast<double>(freq));
        for (int64_t h = 0; h < s.heads; ++h) {
          const int64_t base = (t * s.heads + h) * s.d;
          const double a = x[base + i], b = x[base + i + half];
          want[base + i] = a * c - b * sn;
          want[base + i + half] = b * c + a * sn;
        }
      }
    }
    DeviceBuffer<float> x_d(x);
    DeviceBuffer<int64_t> pos_d(positions);
    DeviceBuffer<float> inv_freq_d(inv_freq);
    STATUS_REQUIRE(
        ApplyRope(x_d.get(), s.tokens, s.heads, s.d, pos_d.get(), inv_freq_d.get(), stream.get()));
    stream.Sync();
    const double err = MaxRelError(x_d.Download(), want);
    CAPTURE(err);
    CHECK(err <= 1e-5);
  }
}

TEST_CASE("AddResidual and the dtype conversions", "[cuda]") {
  std::mt19937 rng(9);
  Stream stream;
  for (int64_t n : {1, 101, 37 * 4096}) {
    CAPTURE(n);
    std::vector<float> x = Normal(rng, n, 100.0f);
    const std::vector<float> h = Normal(rng, n);
    DeviceBuffer<float> h_d(h), x_d(x);
    STATUS_REQUIRE(AddResidual(h_d.get(), x_d.get(), n, stream.get()));
    stream.Sync();
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = h[i] + x[i];
    CHECK(h_d.Download() == want);

    // Rounding corner cases: signed zero, infinity, f16 overflow, subnormals, halfway points.
    const std::vector<float> corners = {
        0.0f,  -0.0f,  INFINITY,          -INFINITY,          70000.0f, -65520.0f,
        1e-7f, -3e-8f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 2048, 1e-40f,   3.4e38f};
    std::copy_n(corners.begin(), std::min<size_t>(corners.size(), x.size()), x.begin());
    x_d.Upload(x);
    for (GpuDType dtype : kAllDTypes) {
      CAPTURE(Name(dtype));
      const HostTensor want_typed = Store(dtype, x);
      DeviceBuffer<unsigned char> typed_d(n * GpuDTypeSize(dtype));
      STATUS_REQUIRE(ConvertF32To(x_d.get(), n, typed_d.get(), dtype, stream.get()));
      stream.Sync();
      CHECK(typed_d.Download() == want_typed.bytes);
      DeviceBuffer<float> back_d(n);
      STATUS_REQUIRE(ConvertToF32(typed_d.get(), dtype, n, back_d.get(), stream.get()));
      stream.Sync();
      const std::vector<float> back = back_d.Download();
      CHECK(std::memcmp(back.data(), want_typed.values.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("PrefillAttention matches causal GQA attention in float64", "[cuda]") {
  std::mt19937 rng(10);
  Stream stream;
  struct Case {
    int64_t heads, kv_heads, d, window;
    std::vector<int32_t> cu_seqlens;
    int64_t tokens;
  };
  const std::vector<Case> cases = {
      {32, 8, 128, 0, {0, 1, 18, 318}, 318},  // lengths 1, 17, 300; GQA 4
      {8, 2, 64, 32, {0, 1, 18, 318}, 318},   // sliding window 32
      {4, 4, 256, 0, {0, 37, 37, 42}, 42},    // MHA, an empty sequence, d 256
      {6, 3, 80, 5, {0, 70}, 70},             // small window, d not a power of two
      {1, 1, 33, 0, {0, 130}, 130},           // odd d, several tiles
      {2, 1, 64, 200, {3, 10, 140}, 143},     // rows 0-2 and 140-142 in no sequence
  };
  for (const Case& c : cases) {
    CAPTURE(c.heads, c.kv_heads, c.d, c.window, c.tokens);
    const int64_t num_seqs = static_cast<int64_t>(c.cu_seqlens.size()) - 1;
    const std::vector<float> q = Normal(rng, c.tokens * c.heads * c.d);
    const std::vector<float> k = Normal(rng, c.tokens * c.kv_heads * c.d);
    const std::vector<float> v = Normal(rng, c.tokens * c.kv_heads * c.d);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const float untouched = 7.0f;
    std::vector<double> want(c.tokens * c.heads * c.d, untouched);
    const int64_t group = c.heads / c.kv_heads;
    std::vector<double> scores;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t start = c.cu_seqlens[s], end = c.cu_seqlens[s + 1];
      for (int64_t i = start; i < end; ++i) {
        const int64_t first = c.window > 0 ? std::max(start, i - c.window + 1) : start;
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t g = h / group;
          const float* qi = q.data() + (i * c.heads + h) * c.d;
          scores.assign(i - first + 1, 0.0);
          double max_score = -INFINITY;
          for (int64_t j = first; j <= i; ++j) {
            const float* kj = k.data() + (j * c.kv_heads + g) * c.d;
            double dot = 0;
            for (int64_t x = 0; x < c.d; ++x) dot += double(qi[x]) * kj[x];
            scores[j - first] = dot * scale;
            max_score = std::max(max_score, scores[j - first]);
          }
          double sum = 0;
          for (double& sc : scores) sum += sc = std::exp(sc - max_score);
          double* o = want.data() + (i * c.heads + h) * c.d;
          std::fill(o, o + c.d, 0.0);
          for (int64_t j = first; j <= i; ++j) {
            const float* vj = v.data() + (j * c.kv_heads + g) * c.d;
            const double p = scores[j - first] / sum;
            for (int64_t x = 0; x < c.d; ++x) o[x] += p * vj[x];
          }
        }
      }
    }
    DeviceBuffer<float> q_d(q), k_d(k), v_d(v);
    DeviceBuffer<int32_t> cu_d(c.cu_seqlens);
    DeviceBuffer<float> out_d(std::vector<float>(c.tokens * c.heads * c.d, untouched));
    STATUS_REQUIRE(PrefillAttention(q_d.get(), k_d.get(), v_d.get(), cu_d.get(), num_seqs, c.tokens,
                                    c.heads, c.kv_heads, c.d, scale, c.window, out_d.get(),
                                    stream.get()));
    stream.Sync();
    const double err = MaxRelError(out_d.Download(), want);
    CAPTURE(err);
    CHECK(err <= 1e-5);
  }
}

TEST_CASE("Bad sizes are InvalidArgument and launch nothing", "[cuda]") {
  Stream stream;
  DeviceBuffer<float> f(1024);
  DeviceBuffer<int32_t> i32(1024);
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
  CHECK(invalid(ApplyRope(f.get(), 1, 1, 3, i64.get(), f.get(), s)));     // odd d
  CHECK(invalid(ApplyRope(f.get(), 1, 1, 2048, i64.get(), f.get(), s)));  // d too large
  CHECK(invalid(RouterTopK(f.get(), 1, 65, 2, i32.get(), f.get(), s)));
  CHECK(invalid(RouterTopK(f.get(), 1, 8, 0, i32.get(), f.get(), s)));
  CHECK(invalid(RouterTopK(f.get(), 1, 8, 9, i32.get(), f.get(), s)));
  CHECK(invalid(BuildExpertPermutation(i32.get(), 1, 2, 257, i32.get(), i32.get(), i32.get(), s)));
  CHECK(invalid(BuildExpertPermutation(i32.get(), 1, 2, 8, nullptr, i32.get(), i32.get(), s)));
  CHECK(invalid(GatherRows(f.get(), GpuDType::kF32, 4, 0, i32.get(), 1, f.get(), s)));
  CHECK(invalid(ArgmaxRows(f.get(), 1, 0, i32.get(), s)));
  CHECK(invalid(ArgmaxRows(nullptr, 1, 4, i32.get(), s)));
  CHECK(invalid(SiluMul(f.get(), f.get(), GpuDType::kF32, 1, 4, f.get(), GpuDType::kF16, s)));
  CHECK(invalid(CombineExperts(f.get(), i32.get(), i32.get(), f.get(), 1, 65, 4, f.get(), s)));
  CHECK(invalid(AddResidual(f.get(), f.get(), -1, s)));
  CHECK(invalid(ConvertF32To(f.get(), 4, f.get(), bad_dtype, s)));
  CHECK(invalid(ConvertToF32(nullptr, GpuDType::kBF16, 4, f.get(), s)));
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 6, 4, 64, 0.125f, 0,
                                 f.get(), s)));  // heads not a multiple of kv_heads
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 8, 2, 257, 0.125f, 0,
                                 f.get(), s)));
  CHECK(invalid(PrefillAttention(f.get(), f.get(), f.get(), i32.get(), 1, 4, 8, 2, 64, 0.125f, -1,
                                 f.get(), s)));
  // Zero rows is fine and launches nothing.
  CHECK(RmsNorm(nullptr, nullptr, GpuDType::kF32, 0, 4, 1e-5f, nullptr, GpuDType::kF32, s).ok());
  CHECK(PrefillAttention(nullptr, nullptr, nullptr, nullptr, 0, 0, 8, 2, 64, 0.125f, 0, nullptr, s)
            .ok());
  stream.Sync();
}
