// bf16 / f16 <-> f32 conversions (engine/model/dtype.h): exactness of the widening conversions and
// IEEE 754 round-to-nearest-even of the narrowing ones, checked against an independent reference
// computed in double precision.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/model/dtype.h"

namespace moebatch {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

bool IsF16NaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

// The value of binary16 `h` from its definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
double F16Reference(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// `f` rounded to nearest even in a binary format with `mant_bits` stored mantissa bits, minimum
// normal exponent `emin` and overflow threshold 2^(emax+1): the reference for F32ToBF16 (7, -126,
// 127) and F32ToF16 (10, -14, 15). Scales to an integer significand and lets nearbyint (default
// rounding mode: to nearest even) round; finite `f` only.
float RoundReference(float f, int mant_bits, int emin, int emax) {
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0) return f;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int quantum_exp = std::max(e - 1, emin) - mant_bits;
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -quantum_exp)), quantum_exp);
  const double result = r >= std::ldexp(1.0, emax + 1) ? INFINITY : r;
  return static_cast<float>(std::signbit(f) ? -result : result);
}

}  // namespace

TEST_CASE("f16 -> f32 is exact and f32 -> f16 round-trips all 65536 bit patterns", "[dtype]") {
  int mismatches = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = F16ToF32(h);
    const uint16_t back = F32ToF16(f);
    bool ok;
    if (IsF16NaN(h)) {
      ok = std::isnan(f) && IsF16NaN(back) && (back & 0x8000) == (h & 0x8000);
    } else {
      ok = static_cast<double>(f) == F16Reference(h) && std::signbit(f) == ((h & 0x8000) != 0) &&
           back == h;
    }
    if (!ok && ++mismatches <= 5) {
      FAIL_CHECK("f16 0x" << std::hex << i << " -> f32 " << f << " -> f16 0x" << back);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("f32 -> bf16 rounds to nearest even", "[dtype]") {
  SECTION("halfway cases go to the even neighbour") {
    CHECK(F32ToBF16(FromBits(0x3f808000)) == 0x3f80);  // 1 + 2^-8: between 0x3f80 and 0x3f81
    CHECK(F32ToBF16(FromBits(0x3f818000)) == 0x3f82);  // between 0x3f81 and 0x3f82
    CHECK(F32ToBF16(FromBits(0x3f808001)) == 0x3f81);  // just above halfway
    CHECK(F32ToBF16(FromBits(0x3f807fff)) == 0x3f80);  // just below halfway
    CHECK(F32ToBF16(FromBits(0xbf818000)) == 0xbf82);  // negative, symmetric
  }
  SECTION("subnormals") {
    CHECK(F32ToBF16(FromBits(0x00008000)) == 0x0000);  // halfway between 0 and the smallest
    CHECK(F32ToBF16(FromBits(0x00018000)) == 0x0002);
    CHECK(F32ToBF16(FromBits(0x00010000)) == 0x0001);
    CHECK(F32ToBF16(FromBits(0x007fffff)) == 0x0080);  // largest subnormal rounds to min normal
  }
  SECTION("overflow, infinities, zeros and NaN") {
    CHECK(F32ToBF16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to inf
    CHECK(F32ToBF16(FromBits(0x7f7f7fff)) == 0x7f7f);               // largest finite bf16
    CHECK(F32ToBF16(FromBits(0x7f7f8000)) == 0x7f80);               // halfway, odd -> inf
    CHECK(F32ToBF16(-INFINITY) == 0xff80);
    CHECK(F32ToBF16(-0.0f) == 0x8000);
    CHECK(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(std::isnan(BF16ToF32(F32ToBF16(FromBits(0x7f800001)))));  // payload only in low bits
    CHECK(std::isnan(BF16ToF32(F32ToBF16(FromBits(0xff800001)))));
  }
  SECTION("a sweep of f32 bit patterns matches the reference") {
    int mismatches = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 257) {
      const float f = FromBits(static_cast<uint32_t>(bits));
      if (std::isnan(f)) continue;
      const float expected = RoundReference(f, 7, -126, 127);
      if (ToBits(BF16ToF32(F32ToBF16(f))) != ToBits(expected) && ++mismatches <= 5) {
        FAIL_CHECK("f32 0x" << std::hex << bits << " -> bf16 0x" << F32ToBF16(f));
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("f32 -> f16 rounds to nearest even", "[dtype]") {
  SECTION("halfway cases go to the even neighbour") {
    CHECK(F32ToF16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // between 0x3c00 and 0x3c01
    CHECK(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // between 0x3c01 and 0x3c02
    CHECK(F32ToF16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)) == 0x3c01);
    CHECK(F32ToF16(-(1.0f + 3 * std::ldexp(1.0f, -11))) == 0xbc02);
  }
  SECTION("subnormals") {
    CHECK(F32ToF16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
    CHECK(F32ToF16(std::ldexp(1.0f, -25)) == 0x0000);  // halfway between 0 and it
    CHECK(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
    CHECK(F32ToF16(1.5f * std::ldexp(1.0f, -24)) == 0x0002);     // halfway between 1 and 2 units
    CHECK(F32ToF16(2.5f * std::ldexp(1.0f, -24)) == 0x0002);     // halfway between 2 and 3 units
    CHECK(F32ToF16(1023.5f * std::ldexp(1.0f, -24)) == 0x0400);  // up into the normal range
    CHECK(F32ToF16(std::ldexp(1.0f, -14)) == 0x0400);            // smallest normal
    CHECK(F32ToF16(-std::ldexp(1.0f, -26)) == 0x8000);           // underflow keeps the sign
  }
  SECTION("overflow, infinities and NaN") {
    CHECK(F32ToF16(65504.0f) == 0x7bff);                        // largest finite f16
    CHECK(F32ToF16(std::nextafter(65520.0f, 0.0f)) == 0x7bff);  // below halfway to 2^16
    CHECK(F32ToF16(65520.0f) == 0x7c00);                        // halfway, odd -> inf
    CHECK(F32ToF16(-1e10f) == 0xfc00);
    CHECK(F32ToF16(INFINITY) == 0x7c00);
    CHECK(IsF16NaN(F32ToF16(std::numeric_limits<float>::quiet_NaN())));
    CHECK(IsF16NaN(F32ToF16(FromBits(0x7f800001))));  // payload only in bits f16 drops
  }
  SECTION("a sweep of f32 bit patterns matches the reference") {
    int mismatches = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 257) {
      const float f = FromBits(static_cast<uint32_t>(bits));
      if (std::isnan(f)) continue;
      const float expected = RoundReference(f, 10, -14, 15);
      if (ToBits(F16ToF32(F32ToF16(f))) != ToBits(expected) && ++mismatches <= 5) {
        FAIL_CHECK("f32 0x" << std::hex << bits << " -> f16 0x" << F32ToF16(f));
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("ConvertToF32 / ConvertFromF32 match the scalar conversions", "[dtype]") {
  // Large enough for the OpenMP path (> 2^16 elements); values span the f16 and bf16 ranges.
  const size_t n = (1 << 17) + 3;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) {
    src[i] = std::ldexp(static_cast<float>(i % 2000) - 1000.5f, static_cast<int>(i % 40) - 30);
  }
  src[0] = 0.0f;
  src[1] = -INFINITY;

  for (DType type : {DType::kBF16, DType::kF16, DType::kF32}) {
    INFO("dtype " << DTypeName(type));
    std::vector<uint8_t> packed(n * DTypeSize(type));
    ConvertFromF32(type, src.data(), packed.data(), n);
    std::vector<float> back(n);
    ConvertToF32(type, packed.data(), back.data(), n);
    int mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      float expected = src[i];
      if (type == DType::kBF16) expected = BF16ToF32(F32ToBF16(src[i]));
      if (type == DType::kF16) expected = F16ToF32(F32ToF16(src[i]));
      if (ToBits(back[i]) != ToBits(expected) && ++mismatches <= 5) {
        FAIL_CHECK("element " << i << ": " << src[i] << " -> " << back[i] << ", expected "
                              << expected);
      }
    }
    CHECK(mismatches == 0);
  }
}

// Fuzz regression (fuzz_gguf, regress-misaligned-f16): a GGUF file with general.alignment 1 puts
// f16 / bf16 rows at odd addresses; ConvertToF32 reads them byte-wise (UBSan: no misaligned load).
TEST_CASE("ConvertToF32 reads f16 and bf16 at an odd address", "[dtype]") {
  const std::vector<float> values = {1.0f, -2.5f, 0.15625f, 65504.0f, -0.0f};
  for (DType type : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> halves(values.size());
    ConvertFromF32(type, values.data(), halves.data(), values.size());
    std::vector<unsigned char> bytes(1 + 2 * values.size());
    std::memcpy(bytes.data() + 1, halves.data(), 2 * halves.size());
    std::vector<float> out(values.size());
    ConvertToF32(type, bytes.data() + 1, out.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      INFO("type " << static_cast<int>(type) << " element " << i);
      CHECK(out[i] == Approx(values[i]).epsilon(1e-2));
    }
  }
}

TEST_CASE("dtype names parse in safetensors and torch spellings", "[dtype]") {
  CHECK(DTypeFromSafetensors("BF16") == DType::kBF16);
  CHECK(DTypeFromSafetensors("F16") == DType::kF16);
  CHECK(DTypeFromSafetensors("F32") == DType::kF32);
  CHECK(!DTypeFromSafetensors("I64").has_value());
  CHECK(DTypeFromString("bfloat16") == DType::kBF16);
  CHECK(DTypeFromString("float16") == DType::kF16);
  CHECK(DTypeFromString("float32") == DType::kF32);
  CHECK(!DTypeFromString("int8").has_value());
}

}  // namespace moebatch
