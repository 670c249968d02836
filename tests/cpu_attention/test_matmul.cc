// cpu_attention/gemm/matmul.h: y = x Wᵀ, batch-invariant or each call's faster path (oneDNN from
// its row thresholds), against a float64 loop, for every weight dtype and every compute mode, M
// from 1 to 300 (the run-time dimension), with the widened-weight cache on and off.
#include <omp.h>
#include <xmmintrin.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>

#include "cpu_attention/gemm/invariant_linear.h"
#include "cpu_attention/gemm/matmul.h"
#include "engine/model/ggml_quants.h"

using namespace moebatch;

namespace {

double MaxRelError(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return err / ref;
}

// product(isa, x, m, k, w, n, y) over blocks of weights equals, bit for bit, InvariantLinear over
// `wide` (the same weights widened to f32) at every ISA level; returns the first level's y.
using BlockProduct = absl::Status (*)(CpuIsa, const float*, int64_t, int64_t, const std::byte*,
                                      int64_t, float*);
std::vector<float> CheckEqualsWidened(BlockProduct product, const std::vector<float>& x, int64_t m,
                                      int64_t k, const std::vector<std::byte>& w,
                                      const std::vector<float>& wide, int64_t n) {
  std::vector<float> first;
  for (CpuIsa isa : SupportedCpuIsas()) {
    INFO("isa " << CpuIsaName(isa) << " m " << m << " k " << k << " n " << n);
    std::vector<float> want(m * n, std::nanf("")), got(m * n, std::nanf(""));
    InvariantLinear(isa, x.data(), m, k, wide.data(), DType::kF32, n, want.data());
    REQUIRE(product(isa, x.data(), m, k, w.data(), n, got.data()).ok());
    CHECK(std::memcmp(want.data(), got.data(), got.size() * sizeof(float)) == 0);
    if (first.empty()) first = got;
  }
  return first;
}

// A product over blocks of 32 weights (block_bytes each) refuses k not whole blocks, and a null
// pointer, with InvalidArgument.
void CheckRefusesBadSizes(BlockProduct product, size_t block_bytes) {
  std::vector<float> y(4);
  const std::vector<std::byte> w(block_bytes * 4);
  const std::vector<float> x(64);
  const CpuIsa isa = SelectedCpuIsa();
  CHECK(product(isa, x.data(), 1, 48, w.data(), 1, y.data()).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(product(isa, nullptr, 1, 32, w.data(), 1, y.data()).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace

TEST_CASE("Matmul::Linear matches a float64 reference") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t k = 96, n = 40;
  for (DType compute : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t budget : {int64_t{0}, int64_t{1} << 20, int64_t{-1}}) {
      const bool invariant = budget < 0;  // -1: the batch-invariant kernels (no widening)
      for (DType wtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        // A fresh Matmul per weight: its widened copies are keyed by the weight's address.
        auto mm = Matmul::Create(compute, std::max<int64_t>(budget, 0), invariant);
        REQUIRE(mm.ok());  // every host: bf16 without oneDNN bf16 stays on our kernels
        std::vector<float> w32(n * k);
        for (float& v : w32) v = normal(rng);
        std::vector<uint16_t> w16(n * k);
        const void* w = w32.data();
        if (wtype != DType::kF32) {
          ConvertFromF32(wtype, w32.data(), w16.data(), w16.size());
          ConvertToF32(wtype, w16.data(), w32.data(), w32.size());  // the exact stored values
          w = w16.data();
        }
        for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{64}, Matmul::kOneDnnF32MinRows + 44}) {
          std::vector<float> x(m * k), y(m * n, std::nanf(""));
          for (float& v : x) v = normal(rng);
          for (int rep = 0; rep < 2; ++rep) {  // the second call may use the cached copy
            REQUIRE((*mm)->Linear(x.data(), m, k, w, wtype, n, y.data()).ok());
            // f16 compute with f16 weights rounds x to f16 first: the reference does too, so
            // the 1e-5 tolerance holds only if the rounding is f16's (without it the error is
            // ~2^-12 per product).
            const bool f16_rounds = compute == DType::kF16 && wtype == DType::kF16;
            std::vector<double> want(m * n);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (int64_t t = 0; t < k; ++t) {
                  const float xv = f16_rounds ? F16ToF32(F32ToF16(x[i * k + t])) : x[i * k + t];
                  acc += double(xv) * w32[j * k + t];
                }
                want[i * n + j] = acc;
              }
            }
            // bf16 compute rounds x to 8 mantissa bits: ~2^-9 relative per product.
            const double tol = compute != DType::kBF16 || wtype != DType::kBF16 ? 1e-5 : 2e-2;
            INFO("compute " << DTypeName(compute) << " weights " << DTypeName(wtype) << " m " << m
                            << " batch-invariant " << invariant);
            REQUIRE(MaxRelError(y, want) < tol);
          }
        }
      }
    }
  }
}

TEST_CASE("Matmul::Create refuses a compute dtype it does not have") {
  auto mm = Matmul::Create(static_cast<DType>(7));
  REQUIRE(mm.status().code() == absl::StatusCode::kInvalidArgument);
}

// invariant_linear.h: the fixed-order kernel at every ISA level this CPU has, against float64 and
// against each other bit for bit; K not a multiple of 16 (the scalar tail), edge blocks in M and N,
// dot-product tiles of up to 31 rows over long K (17 and 23 rows); the calls of 10+ rows on AVX2
// and 32+ on AVX-512 go lane by lane (invariant_linear_lanes.h): rows not a multiple of its 6- or
// 8-row blocks, columns not a multiple of its panels, whole panels with no tail (stored straight),
// K over 2,048 (lane sums parked between K slices), more than one tile of rows (over 256), K
// under 16 (no lane steps at all); the dot-product tiles over K slices (a block's rows of x over
// 32 KiB).
TEST_CASE("InvariantLinear matches float64 and gives the same bits at every ISA level") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  struct Shape {
    int64_t m, k, n;
  };
  const Shape shapes[] = {{1, 1, 1},
                          {3, 15, 5},
                          {5, 17, 7},
                          {4, 64, 4},
                          {9, 100, 13},
                          {70, 64, 300},
                          {2, 4096, 9},
                          {130, 33, 67},
                          {40, 1040, 37},
                          {17, 1300, 21},
                          {10, 16, 16},
                          {23, 4100, 40},
                          {48, 2048, 64},
                          {300, 48, 20},
                          {12, 7, 40},
                          {11, 0, 17},  // these two: K < 16, only the tail
                          // the lane path: several K slices and chunks of row blocks (60 rows,
                          // K 8,210), and tiles of rows split (530 rows)
                          {60, 8210, 20},
                          {530, 40, 18},
                          // the dot-product tiles over K slices with the lane sums parked (their
                          // rows of x over 32 KiB), a K % 16 tail after the last slice
                          {5, 9000, 11},
                          {20, 9000, 11}};
  for (DType wtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& s : shapes) {
      std::vector<float> x(s.m * s.k), w32(s.n * s.k);
      for (float& v : x) v = normal(rng);
      for (float& v : w32) v = normal(rng);
      std::vector<uint16_t> w16(s.n * s.k);
      const void* w = w32.data();
      if (wtype != DType::kF32) {
        ConvertFromF32(wtype, w32.data(), w16.data(), w16.size());
        ConvertToF32(wtype, w16.data(), w32.data(), w32.size());
        w = w16.data();
      }
      std::vector<double> want(s.m * s.n);
      double scale = 0;
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          double acc = 0, mag = 0;
          for (int64_t t = 0; t < s.k; ++t) {
            acc += double(x[i * s.k + t]) * w32[j * s.k + t];
            mag += std::abs(double(x[i * s.k + t]) * w32[j * s.k + t]);
          }
          want[i * s.n + j] = acc;
          scale = std::max(scale, mag);
        }
      }
      std::vector<float> first;
      for (CpuIsa isa : SupportedCpuIsas()) {
        std::vector<float> y(s.m * s.n, std::nanf(""));
        InvariantLinear(isa, x.data(), s.m, s.k, w, wtype, s.n, y.data());
        INFO("isa " << CpuIsaName(isa) << " weights " << DTypeName(wtype) << " m " << s.m << " k "
                    << s.k << " n " << s.n);
        double err = 0;
        for (size_t i = 0; i < y.size(); ++i) err = std::max(err, std::abs(y[i] - want[i]));
        CHECK(err <= 1e-6 * scale);  // ~K roundings of 2^-24 each, relative to sum |x·w|
        if (first.empty()) {
          first = y;
        } else {
          CHECK(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

// The pair order (invariant_linear.h, InvariantLinearBf16) written out for one element, as the
// header states it; the caller sets DAZ and FTZ.
float PairOrderModel(const uint16_t* x, const uint16_t* w, int64_t k) {
  const auto f = [](uint16_t b) { return BF16ToF32(b); };
  const int64_t k32 = k - k % 32, k16 = k - k % 16;
  float lanes[16] = {};
  for (int64_t c = 0; c < k32; c += 32) {
    for (int j = 0; j < 16; ++j) {
      lanes[j] = std::fma(f(x[c + 2 * j + 1]), f(w[c + 2 * j + 1]), lanes[j]);
      lanes[j] = std::fma(f(x[c + 2 * j]), f(w[c + 2 * j]), lanes[j]);
    }
  }
  if (k16 > k32) {
    for (int j = 0; j < 16; ++j) lanes[j] = std::fma(f(x[k32 + j]), f(w[k32 + j]), lanes[j]);
  }
  for (int s = 8; s >= 1; s >>= 1) {
    for (int i = 0; i < s; ++i) lanes[i] += lanes[i + s];
  }
  float sum = lanes[0];
  for (int64_t t = k16; t < k; ++t) sum = std::fma(f(x[t]), f(w[t]), sum);
  return sum;
}

// bf16 compute: every path (each ISA level; on AVX-512, with and without vdpbf16ps where the CPU
// has it) gives the model's bits, with products exact and sums rounded (float64 within K
// roundings), and with denormal inputs and results flushed as vdpbf16ps flushes them. Shapes cover
// K's whole chunks, a half chunk and a tail, long K (> 512), and the row counts of every path
// (dot products, lane by lane).
TEST_CASE("InvariantLinearBf16 gives the pair order's bits on every path") {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  struct Shape {
    int64_t m, k, n;
  };
  const Shape shapes[] = {{1, 32, 1},     {3, 15, 5},     {5, 17, 7},     {4, 64, 4},
                          {9, 100, 13},   {70, 64, 300},  {2, 4096, 9},   {130, 33, 67},
                          {40, 1040, 37}, {17, 1300, 21}, {10, 48, 16},   {23, 4100, 40},
                          {48, 2048, 64}, {300, 50, 20},  {12, 7, 40},    {11, 0, 17},
                          {16, 560, 33},  {64, 2080, 48}, {60, 8210, 20}, {530, 40, 18}};
  for (bool tiny : {false, true}) {
    for (const Shape& s : shapes) {
      std::vector<uint16_t> x(s.m * s.k), w(s.n * s.k);
      for (uint16_t& v : x) v = F32ToBF16(normal(rng));
      for (uint16_t& v : w) v = F32ToBF16(normal(rng));
      if (tiny) {  // products below f32's normal range, and denormal bf16 inputs
        for (size_t i = 0; i < x.size(); i += 3) x[i] = F32ToBF16(normal(rng) * 1e-20f);
        for (size_t i = 0; i < w.size(); i += 5) w[i] = F32ToBF16(normal(rng) * 1e-19f);
        for (size_t i = 1; i < x.size(); i += 7) x[i] = static_cast<uint16_t>(1 + i % 0x7f);
        for (size_t i = 2; i < w.size(); i += 11) w[i] = static_cast<uint16_t>(0x8001 + i % 0x7f);
        // Whole rows of them, so that sums stay in the denormal range: x's first row tiny against
        // w's first row tiny, x's last row denormal against every weight row.
        for (int64_t t = 0; t < s.k; ++t) {
          x[t] = F32ToBF16(normal(rng) * 1e-20f);
          w[t] = F32ToBF16(normal(rng) * 1e-19f);
          x[(s.m - 1) * s.k + t] = static_cast<uint16_t>((t % 2 ? 0x8000 : 0) + 1 + t % 0x7f);
        }
      }
      std::vector<float> want(s.m * s.n);
      {
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040);
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            want[i * s.n + j] = PairOrderModel(x.data() + i * s.k, w.data() + j * s.k, s.k);
          }
        }
        _mm_setcsr(csr);
      }
      if (!tiny) {  // the model against float64 (no denormals here)
        double err = 0, scale = 0;
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            double acc = 0, mag = 0;
            for (int64_t t = 0; t < s.k; ++t) {
              const double p = double(BF16ToF32(x[i * s.k + t])) * BF16ToF32(w[j * s.k + t]);
              acc += p;
              mag += std::abs(p);
            }
            err = std::max(err, std::abs(want[i * s.n + j] - acc));
            scale = std::max(scale, mag);
          }
        }
        CHECK(err <= 1e-6 * scale);
      }
      // The explicit paths (vdpbf16ps off, on where usable) and the default choice (2).
      for (CpuIsa isa : SupportedCpuIsas()) {
        for (int path : {0, 1, 2}) {
          if (path == 1 && (isa != CpuIsa::kAvx512 || !CpuAvx512Bf16Usable())) continue;
          const bool vdpbf16ps = path == 1;
          std::vector<float> y(s.m * s.n, std::nanf(""));
          if (path == 2) {
            InvariantLinearBf16(isa, x.data(), s.m, s.k, w.data(), s.n, y.data());
          } else {
            InvariantLinearBf16(isa, x.data(), s.m, s.k, w.data(), s.n, y.data(), vdpbf16ps);
          }
          INFO("isa " << CpuIsaName(isa) << " path " << path << " tiny " << tiny << " m " << s.m
                      << " k " << s.k << " n " << s.n);
          int64_t differ = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            differ += std::memcmp(&y[i], &want[i], sizeof(float)) != 0;
          }
          CHECK(differ == 0);
        }
      }
    }
  }
  // The default takes vdpbf16ps only where the CPU can run it.
  CHECK((!CpuVdpbf16psPays() || CpuAvx512Bf16Usable()));
}

// Hugging Face MXFP4 checkpoints (gpt-oss): the weights widened exactly, so the product is
// InvariantLinear's over the dequantized f32 weights (engine/model/ggml_quants.h's DequantizeRow),
// bit for bit at every ISA level: every code, and the exponents of subnormal (e 0, 1), tiny,
// ordinary and huge (e 254, 255) scales. Shapes: one tile and several of weight rows (k 2,880:
// gpt-oss's hidden size); rows of x on the few-rows path (1 to 9: 4 at a time and the rest) and
// the many-rows one (lane by lane on AVX2; over 256 rows: two lane tiles).
TEST_CASE("InvariantLinearMxfp4 equals InvariantLinear over the widened weights, every ISA") {
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> byte(0, 255), exponent(110, 135);
  struct Shape {
    int64_t m, k, n;
  };
  const Shape shapes[] = {{1, 32, 1},     {3, 64, 5},    {9, 2880, 30}, {2, 96, 7},
                          {17, 2880, 47}, {70, 96, 600}, {300, 64, 20}, {1, 0, 3}};
  for (const Shape& s : shapes) {
    const int64_t blocks = s.k / 32;
    std::vector<std::byte> w(static_cast<size_t>(s.n * blocks * 17));
    for (int64_t b = 0; b < s.n * blocks; ++b) {
      std::byte* block = w.data() + b * 17;
      const int special[] = {0, 1, 254, 255};
      block[0] = std::byte(b % 7 == 0 ? special[(b / 7) % 4] : exponent(rng));
      for (int j = 1; j < 17; ++j) block[j] = std::byte(byte(rng));
    }
    std::vector<float> wide(static_cast<size_t>(s.n * s.k));
    for (int64_t r = 0; r < s.n; ++r) {
      REQUIRE(
          DequantizeRow(GgmlType::kMXFP4, w.data() + r * blocks * 17, s.k, wide.data() + r * s.k)
              .ok());
    }
    // Activations small enough that the huge scales stay finite: |x w| < 2^127 · 12 · 1e-30.
    std::vector<float> x(static_cast<size_t>(s.m * s.k));
    for (float& v : x) v = normal(rng) * 1e-30f;
    CheckEqualsWidened(InvariantLinearMxfp4, x, s.m, s.k, w, wide, s.n);
  }
  CheckRefusesBadSizes(InvariantLinearMxfp4, 17);
}

TEST_CASE("InvariantLinearQ8_0 equals InvariantLinear over the dequantized weights, every ISA") {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> byte(0, 255);
  struct Shape {
    int64_t m, k, n;
  };
  // Few rows (the dot-product tiles, widened in registers; over K slices at 5,632 and 8,224) and
  // many (the lane path's packed panels: AVX2 from 21 rows, AVX-512 from 32), partial panels and
  // K slices.
  const Shape shapes[] = {{1, 32, 1},    {3, 64, 5},     {9, 2048, 30}, {2, 96, 7},
                          {10, 160, 17}, {17, 5632, 47}, {33, 64, 40},  {70, 96, 600},
                          {300, 64, 20}, {64, 8224, 24}, {7, 8224, 9},  {1, 0, 3}};
  for (const Shape& s : shapes) {
    const int64_t blocks = s.k / 32;
    std::vector<std::byte> w(static_cast<size_t>(s.n * blocks * 34));
    for (int64_t b = 0; b < s.n * blocks; ++b) {
      std::byte* block = w.data() + b * 34;
      // The scale: normal f16 values, and now and then a subnormal, zero or negative one.
      const float d = b % 11 == 0 ? 3e-6f * static_cast<float>(b % 3 - 1) : normal(rng) * 0.02f;
      const uint16_t h = F32ToF16(d);
      std::memcpy(block, &h, 2);
      for (int j = 2; j < 34; ++j) block[j] = std::byte(byte(rng));  // q in [-128, 127]
    }
    std::vector<float> wide(static_cast<size_t>(s.n * s.k));
    for (int64_t r = 0; r < s.n; ++r) {
      REQUIRE(DequantizeRow(GgmlType::kQ8_0, w.data() + r * blocks * 34, s.k, wide.data() + r * s.k)
                  .ok());
    }
    std::vector<float> x(static_cast<size_t>(s.m * s.k));
    for (float& v : x) v = normal(rng);
    const std::vector<float> first =
        CheckEqualsWidened(InvariantLinearQ8_0, x, s.m, s.k, w, wide, s.n);
    // Each row alone gives the bits it gave among the others (the dot-product tiles for one row,
    // the lane path for many).
    if (s.m > 1 && s.k > 0) {
      for (int64_t r : {int64_t{0}, s.m - 1}) {
        std::vector<float> one(s.n);
        REQUIRE(InvariantLinearQ8_0(x.data() + r * s.k, 1, s.k, w.data(), s.n, one.data()).ok());
        CHECK(std::memcmp(one.data(), first.data() + r * s.n, one.size() * sizeof(float)) == 0);
      }
    }
  }
  CheckRefusesBadSizes(InvariantLinearQ8_0, 34);
}

// A row's result must not depend on how many rows share the call, where the row sits among them,
// what the others hold, or the thread count, bit for bit. Otherwise a greedy request's output
// depends on what else was batched with it (a restart after a crash changes the batch:
// tests/integration/test_crash_safety.py). oneDNN's matmul fails this (its kernel changes with M; M
// 1 vs 2 and M 13 vs 16 differ), which is why the engine runs batch-invariant by default.
TEST_CASE("batch-invariant Matmul: a row's bits do not depend on M, the other rows or threads") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  struct Shape {
    int64_t k, n;
  };
  // The tiny test model's shapes (q/o, k/v, router, w1/w3, w2, lm_head) and larger ones.
  const Shape shapes[] = {{64, 64},    {64, 32},   {64, 8},     {64, 128},  {128, 64},
                          {64, 32000}, {512, 512}, {1024, 256}, {4096, 128}};
  const int max_threads = omp_get_max_threads();
  for (DType compute : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto mm = Matmul::Create(compute, 0, /*batch_invariant=*/true);
    REQUIRE(mm.ok());
    for (const Shape& s : shapes) {
      for (DType wtype : {DType::kF32, DType::kBF16}) {
        std::vector<float> w32(s.n * s.k);
        for (float& v : w32) v = normal(rng);
        std::vector<uint16_t> w16(s.n * s.k);
        ConvertFromF32(DType::kBF16, w32.data(), w16.data(), w16.size());
        const void* w = wtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data();
        std::vector<float> probe(s.k);
        for (float& v : probe) v = normal(rng);
        std::vector<float> alone(s.n);
        omp_set_num_threads(1);
        REQUIRE((*mm)->Linear(probe.data(), 1, s.k, w, wtype, s.n, alone.data()).ok());
        omp_set_num_threads(max_threads);
        for (int64_t m : {2, 3, 5, 8, 13, 16, 31, 64, 65, 100, 257}) {
          std::vector<float> x(m * s.k), y(m * s.n);
          for (float& v : x) v = normal(rng);
          const int64_t at = std::uniform_int_distribution<int64_t>(0, m - 1)(rng);
          std::copy(probe.begin(), probe.end(), x.begin() + at * s.k);
          REQUIRE((*mm)->Linear(x.data(), m, s.k, w, wtype, s.n, y.data()).ok());
          INFO("compute " << DTypeName(compute) << " weights " << DTypeName(wtype) << " k " << s.k
                          << " n " << s.n << " m " << m << " row " << at);
          CHECK(std::memcmp(y.data() + at * s.n, alone.data(), s.n * sizeof(float)) == 0);
        }
      }
    }
  }
}

// Not batch-invariant: a call takes the batch-invariant kernels below the oneDNN thresholds (the
// same bits as a batch-invariant Matmul), oneDNN from them; bf16 compute without a oneDNN bf16
// matmul (AVX2-only hosts) runs, on our kernels, rather than being refused.
TEST_CASE("Matmul without batch invariance: each call's path by its size, on every host") {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  const int64_t k = 80, n = 48;
  std::vector<float> w32(n * k);
  for (float& v : w32) v = normal(rng);
  std::vector<uint16_t> w16(n * k);
  ConvertFromF32(DType::kBF16, w32.data(), w16.data(), w16.size());
  for (DType compute : {DType::kF32, DType::kBF16}) {
    auto fast = Matmul::Create(compute, 0, /*batch_invariant=*/false);
    auto fixed = Matmul::Create(compute, 0, /*batch_invariant=*/true);
    REQUIRE(fast.ok());
    REQUIRE(fixed.ok());
    INFO("compute " << DTypeName(compute) << ": " << (*fast)->Describe());
    CHECK((*fixed)->PathFor(100000, DType::kBF16) == Matmul::Path::kInvariant);
    CHECK((*fixed)->Describe().rfind("batch-invariant kernels", 0) == 0);
    for (DType wtype : {DType::kF32, DType::kBF16}) {
      const bool bf16 = compute == DType::kBF16 && wtype == DType::kBF16;
      const int64_t threshold = bf16 ? Matmul::kOneDnnBf16MinRows : Matmul::kOneDnnF32MinRows;
      const Matmul::Path onednn = !bf16                    ? Matmul::Path::kOneDnnF32
                                  : (*fast)->onednn_bf16() ? Matmul::Path::kOneDnnBf16
                                                           : Matmul::Path::kInvariant;
      CHECK((*fast)->PathFor(1, wtype) == Matmul::Path::kInvariant);
      CHECK((*fast)->PathFor(threshold - 1, wtype) == Matmul::Path::kInvariant);
      CHECK((*fast)->PathFor(threshold, wtype) == onednn);
      const void* w = wtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data();
      for (int64_t m : {int64_t{1}, threshold - 1}) {
        std::vector<float> x(m * k), a(m * n), b(m * n);
        for (float& v : x) v = normal(rng);
        REQUIRE((*fast)->Linear(x.data(), m, k, w, wtype, n, a.data()).ok());
        REQUIRE((*fixed)->Linear(x.data(), m, k, w, wtype, n, b.data()).ok());
        INFO("weights " << DTypeName(wtype) << " m " << m);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      }
    }
  }
}
