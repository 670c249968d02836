// engine/matmul.h: y = x Wᵀ through oneDNN against a float64 loop, for every weight dtype and both
// compute modes, M from 1 to 300 (the run-time dimension), with the widened-weight cache on and
// off.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "engine/matmul.h"

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

}  // namespace

TEST_CASE("Matmul::Linear matches a float64 reference") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t k = 96, n = 40;
  for (DType compute : {DType::kF32, DType::kBF16}) {
    for (int64_t budget : {int64_t{0}, int64_t{1} << 20}) {
      for (DType wtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        // A fresh Matmul per weight: its widened copies are keyed by the weight's address.
        auto mm = Matmul::Create(compute, budget);
        if (compute == DType::kBF16 && mm.status().code() == absl::StatusCode::kFailedPrecondition) {
          WARN("bf16 matmul unavailable on this CPU: " << mm.status());
          continue;
        }
        REQUIRE(mm.ok());
        std::vector<float> w32(n * k);
        for (float& v : w32) v = normal(rng);
        std::vector<uint16_t> w16(n * k);
        const void* w = w32.data();
        if (wtype != DType::kF32) {
          ConvertFromF32(wtype, w32.data(), w16.data(), w16.size());
          ConvertToF32(wtype, w16.data(), w32.data(), w32.size());  // the exact stored values
          w = w16.data();
        }
        for (int64_t m : {1, 7, 64, 300}) {
          std::vector<float> x(m * k), y(m * n, std::nanf(""));
          for (float& v : x) v = normal(rng);
          for (int rep = 0; rep < 2; ++rep) {  // the second call may use the cached copy
            REQUIRE((*mm)->Linear(x.data(), m, k, w, wtype, n, y.data()).ok());
            std::vector<double> want(m * n);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (int64_t t = 0; t < k; ++t) acc += double(x[i * k + t]) * w32[j * k + t];
                want[i * n + j] = acc;
              }
            }
            // bf16 compute rounds x to 8 mantissa bits: ~2^-9 relative per product.
            const double tol = compute == DType::kF32 || wtype != DType::kBF16 ? 1e-5 : 2e-2;
            INFO("compute " << DTypeName(compute) << " weights " << DTypeName(wtype) << " m " << m);
            REQUIRE(MaxRelError(y, want) < tol);
          }
        }
      }
    }
  }
}

TEST_CASE("Matmul::Create refuses a compute dtype it does not have") {
  auto mm = Matmul::Create(DType::kF16);
  REQUIRE(mm.status().code() == absl::StatusCode::kInvalidArgument);
}
