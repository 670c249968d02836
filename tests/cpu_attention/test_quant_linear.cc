// cpu_attention/gemm/quant_linear.h: y = x · Wᵀ with W in ggml block formats, for every supported
// type, against a float64 reference built from DequantizeRow (engine/model/ggml_quants.h), the
// vector kernels against the portable model bit for bit, a row's bits against the batch it is in
// and the thread count, and the refusals.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_attention/gemm/quant_linear.h"
#include "engine/model/dtype.h"
#include "engine/model/ggml_quants.h"

using namespace moebatch;

namespace {

const GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                           GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K,
                           GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kMXFP4};

GgmlTypeTraits Traits(GgmlType type) { return *GgmlTypeInfo(static_cast<uint32_t>(type)); }

void PutHalf(std::byte* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// n rows of k weights of `type`: random bytes, then every f16 scale field (d, dmin, m) written
// with a finite, moderate value and MXFP4's exponent kept near 2^0. Every byte pattern of the
// other fields (quants, 6-bit scales, int8 Q6_K scales) is a valid block.
std::vector<std::byte> RandomWeights(GgmlType type, int64_t n, int64_t k, std::mt19937& rng) {
  const GgmlTypeTraits t = Traits(type);
  const int64_t blocks = n * k / t.block_size;
  std::vector<std::byte> w(static_cast<size_t>(blocks * t.type_size));
  std::uniform_int_distribution<int> byte(0, 255);
  for (std::byte& b : w) b = static_cast<std::byte>(byte(rng));
  std::uniform_real_distribution<float> mag(0.5f, 2.0f), offset(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(124, 131);
  for (int64_t i = 0; i < blocks; ++i) {
    std::byte* p = w.data() + i * t.type_size;
    switch (type) {
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        PutHalf(p, mag(rng) * (offset(rng) < 0 ? -0.01f : 0.01f));
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        PutHalf(p, mag(rng) * 0.01f);
        PutHalf(p + 2, offset(rng) * 0.1f);
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        PutHalf(p, mag(rng) * 1e-3f);
        PutHalf(p + 2, mag(rng) * 1e-3f);
        break;
      case GgmlType::kQ6_K:
        PutHalf(p + 208, mag(rng) * 1e-3f);
        break;
      case GgmlType::kMXFP4:
        p[0] = static_cast<std::byte>(exponent(rng));
        break;
      default:
        break;
    }
  }
  return w;
}

// Gaussian activations; row 0 has two special blocks: all zeros (d = 0) and a large outlier.
std::vector<float> RandomActivations(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  if (k >= 64) {
    std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // block 1
    x[k - 1] = 40.0f;                                 // the last block
  }
  return x;
}

struct Shape {
  int64_t m, k, n;
};

// M 1..130, K 256..1536 and 576 (SmolLM2's hidden size: 18 blocks of 32, not a multiple of 256), N
// 1..300, plus 32-block counts that leave a last group of 3 or 1 blocks (96, 800, 32). K of a
// K-quant type must be a multiple of 256: those shapes fall back to k 512.
const Shape kShapes[] = {{1, 256, 300}, {2, 512, 64}, {3, 1536, 7},  {4, 576, 64},  {5, 256, 1},
                         {8, 512, 40},  {17, 512, 7}, {64, 256, 20}, {130, 576, 3}, {70, 1536, 6},
                         {3, 96, 5},    {9, 800, 13}, {12, 32, 9}};

int64_t KFor(GgmlType type, int64_t k) { return k % Traits(type).block_size == 0 ? k : 512; }

std::vector<float> Run(CpuIsa isa, const std::vector<float>& x, int64_t m, int64_t k,
                       const std::vector<std::byte>& w, GgmlType type, int64_t n) {
  std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
  const absl::Status st = QuantLinear(isa, x.data(), m, k, w.data(), type, n, y.data());
  REQUIRE(st.ok());
  return y;
}

std::string Describe(GgmlType type, const Shape& s, int64_t k) {
  return std::string(Traits(type).name) + " m " + std::to_string(s.m) + " k " + std::to_string(k) +
         " n " + std::to_string(s.n);
}

bool HasIsa(CpuIsa isa) {
  const std::vector<CpuIsa> isas = SupportedCpuIsas();
  return std::find(isas.begin(), isas.end(), isa) != isas.end();
}

// The random problems every type is checked on (kShapes), with the portable kernel's result, made
// once for the tests below.
struct Case {
  GgmlType type;
  Shape s;  // s.k as used (KFor)
  std::vector<std::byte> w;
  std::vector<float> x, portable;
};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> all;
    std::mt19937 rng(21);
    for (GgmlType type : kTypes) {
      for (const Shape& shape : kShapes) {
        Case c{type, shape, {}, {}, {}};
        c.s.k = KFor(type, shape.k);
        c.w = RandomWeights(type, c.s.n, c.s.k, rng);
        c.x = RandomActivations(c.s.m, c.s.k, rng);
        c.portable = Run(CpuIsa::kPortable, c.x, c.s.m, c.s.k, c.w, type, c.s.n);
        all.push_back(std::move(c));
      }
    }
    return all;
  }();
  return cases;
}

// Every case at `isa` against the portable kernel, bit for bit.
void CheckSameBitsAsPortable(CpuIsa isa) {
  for (const Case& c : Cases()) {
    const std::vector<float> got = Run(isa, c.x, c.s.m, c.s.k, c.w, c.type, c.s.n);
    INFO(CpuIsaName(isa) << ": " << Describe(c.type, c.s, c.s.k));
    CHECK(std::memcmp(c.portable.data(), got.data(), got.size() * sizeof(float)) == 0);
  }
}

// The elements x is quantized in blocks of: 32, or a super-block of 256 for the K-quant types
// (as llama.cpp's q8_0 and q8_K).
int64_t ActivationBlock(GgmlType type) { return Traits(type).block_size == 256 ? 256 : 32; }

}  // namespace

// The error of y against x · Wᵀ in float64 (W decoded by DequantizeRow) is what replacing each
// x_e by d_b · q_e explains: |x_e - d_b · q_e| <= |d_b| / 2 (|d_b| = amax / 127 of x's block b of
// ActivationBlock elements), so
//   |y - ref| <= Σ_b (|d_b| / 2) Σ_{e in b} |W_e|
// plus float rounding (allowed: 1e-5 of Σ_e |x_e| (|W_e| + max|W|)), checked per element; and on
// Gaussian activations (every row but the special row 0) the relative RMS error (error RMS over
// the reference's RMS, over all shapes of a type) is ~0.6% for blocks of 32 (uniform rounding noise
// d / sqrt(12) with d ~ 2.5 / 127) and ~0.8% for 256 (d ~ 3.3 / 127): checked below 1%.
TEST_CASE("QuantLinear matches float64 within the int8 activation bound, every type") {
  for (GgmlType type : kTypes) {
    double err2 = 0, ref2 = 0;
    for (const Case& c : Cases()) {
      if (c.type != type) continue;
      const int64_t m = c.s.m, k = c.s.k, n = c.s.n;
      std::vector<float> wf(static_cast<size_t>(n * k));
      const int64_t row_bytes = k / Traits(type).block_size * Traits(type).type_size;
      for (int64_t j = 0; j < n; ++j) {
        REQUIRE(DequantizeRow(type, c.w.data() + j * row_bytes, k, wf.data() + j * k).ok());
      }
      const std::vector<float> y = Run(SelectedCpuIsa(), c.x, m, k, c.w, type, n);
      INFO(CpuIsaName(SelectedCpuIsa()) << ": " << Describe(type, c.s, k));
      int64_t over = 0;
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = c.x.data() + i * k;
        const int64_t xb = ActivationBlock(type);
        std::vector<double> half_d(static_cast<size_t>(k / xb));
        for (int64_t b = 0; b < k / xb; ++b) {
          float amax = 0;
          for (int64_t e = 0; e < xb; ++e) amax = std::max(amax, std::abs(xi[b * xb + e]));
          half_d[b] = amax / 127.0 / 2;
        }
        for (int64_t j = 0; j < n; ++j) {
          const float* wj = wf.data() + j * k;
          double ref = 0, bound = 0, mag = 0, wmax = 0;
          for (int64_t e = 0; e < k; ++e) wmax = std::max(wmax, std::abs(double(wj[e])));
          for (int64_t e = 0; e < k; ++e) {
            ref += double(xi[e]) * wj[e];
            bound += half_d[e / xb] * std::abs(wj[e]);
            mag += std::abs(double(xi[e])) * (std::abs(wj[e]) + wmax);
          }
          const double err = std::abs(y[i * n + j] - ref);
          if (!(err <= bound + 1e-5 * mag)) ++over;
          if (i > 0) {
            err2 += err * err;
            ref2 += ref * ref;
          }
        }
      }
      CHECK(over == 0);
    }
    INFO(Traits(type).name);
    CHECK(std::sqrt(err2 / ref2) < 0.01);
  }
}

TEST_CASE("QuantLinear AVX2 gives the portable kernel's bits, every type") {
  if (!HasIsa(CpuIsa::kAvx2)) {
    WARN("skipped: this CPU has no AVX2 + FMA + F16C");
    return;
  }
  CheckSameBitsAsPortable(CpuIsa::kAvx2);
}

TEST_CASE("QuantLinear AVX-512 gives the portable kernel's bits, every type") {
  if (!HasIsa(CpuIsa::kAvx512)) {
    WARN("skipped: this CPU has no AVX-512 F/BW/VL/DQ");
    return;
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vnni")) WARN("no AVX-512 VNNI: kAvx512 runs the AVX2 kernels");
  CheckSameBitsAsPortable(CpuIsa::kAvx512);
}

// A row's result must not depend on how many rows share the call (m 1 streams the weights, m > 8
// unpacks them in tiles), where it sits, or what the others hold; nor on the thread count.
TEST_CASE("QuantLinear: a row's bits do not depend on M, the other rows or the thread count") {
  std::mt19937 rng(23);
  const int max_threads = omp_get_max_threads();
  for (CpuIsa isa : SupportedCpuIsas()) {
    for (GgmlType type : kTypes) {
      const int64_t k = KFor(type, 576), n = 13;
      const std::vector<std::byte> w = RandomWeights(type, n, k, rng);
      const std::vector<float> probe = RandomActivations(1, k, rng);
      const std::vector<float> alone = Run(isa, probe, 1, k, w, type, n);
      for (int64_t m : {2, 9, 70}) {
        std::vector<float> x = RandomActivations(m, k, rng);
        const int64_t at = std::uniform_int_distribution<int64_t>(0, m - 1)(rng);
        std::copy(probe.begin(), probe.end(), x.begin() + at * k);
        const std::vector<float> y = Run(isa, x, m, k, w, type, n);
        INFO(CpuIsaName(isa) << " " << Traits(type).name << " m " << m << " row " << at);
        CHECK(std::memcmp(y.data() + at * n, alone.data(), n * sizeof(float)) == 0);
      }
      for (int64_t m : {1, 70}) {  // 4 tiles of weight rows; 2 tiles of rows
        const std::vector<float> x = RandomActivations(m, k, rng);
        omp_set_num_threads(1);
        const std::vector<float> one = Run(isa, x, m, k, w, type, n);
        omp_set_num_threads(2);
        const std::vector<float> two = Run(isa, x, m, k, w, type, n);
        omp_set_num_threads(max_threads);
        INFO(CpuIsaName(isa) << " " << Traits(type).name << " m " << m << ": 1 vs 2 threads");
        CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("QuantLinear refuses unsupported types and bad shapes, naming the type and the reason") {
  std::vector<float> x(512, 1.0f), y(64, 0.0f);
  std::vector<std::byte> w(1 << 16);
  auto refused = [&](GgmlType type, int64_t m, int64_t k, int64_t n, const std::string& what,
                     CpuIsa isa = CpuIsa::kPortable) {
    const absl::Status st = QuantLinear(isa, x.data(), m, k, w.data(), type, n, y.data());
    INFO(st);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(st.message()).find(what) != std::string::npos);
  };
  refused(GgmlType::kF32, 1, 64, 1, "ggml type F32 are not supported");
  refused(GgmlType::kQ2_K, 1, 256, 1, "ggml type Q2_K are not supported");
  refused(GgmlType::kBF16, 1, 64, 1, "BF16");
  refused(static_cast<GgmlType>(99), 1, 64, 1, "unknown (99)");
  refused(GgmlType::kQ4_K, 1, 576, 1, "k = 576 is not a multiple of the block size of Q4_K (256)");
  refused(GgmlType::kQ4_0, 1, 100, 1, "k = 100 is not a multiple of the block size of Q4_0 (32)");
  refused(GgmlType::kQ8_0, -1, 64, 1, "negative size");
  for (GgmlType type : kTypes) CHECK(QuantLinearSupports(type));
  CHECK(!QuantLinearSupports(GgmlType::kF16));
  CHECK(!QuantLinearSupports(GgmlType::kQ8_K));
  if (!HasIsa(CpuIsa::kAvx512)) {
    refused(GgmlType::kQ4_0, 1, 64, 1, "ISA level avx512", CpuIsa::kAvx512);
  }
}

TEST_CASE("QuantLinear: m or n 0 writes nothing, k 0 writes zeros") {
  std::vector<float> x(64, 1.0f), y(8, 5.0f);
  std::vector<std::byte> w(1024);
  REQUIRE(QuantLinear(x.data(), 0, 64, w.data(), GgmlType::kQ4_0, 8, y.data()).ok());
  REQUIRE(QuantLinear(x.data(), 1, 64, w.data(), GgmlType::kQ4_0, 0, y.data()).ok());
  CHECK(y[0] == 5.0f);
  REQUIRE(QuantLinear(x.data(), 2, 0, w.data(), GgmlType::kQ6_K, 4, y.data()).ok());
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.0f; }));
}
