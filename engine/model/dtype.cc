#include "engine/model/dtype.h"

#include <cmath>

namespace moebatch {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

std::optional<DType> DTypeFromSafetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

std::optional<DType> DTypeFromString(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "float" || name == "F32") return DType::kF32;
  if (name == "f16" || name == "float16" || name == "half" || name == "F16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::kBF16;
  return std::nullopt;
}

// IEEE binary16 <-> binary32, bit exact (subnormals, infinities and NaN included).
float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (incl. rounding up) -> inf
  if (abs < 0x38800000u) {                        // result is subnormal or zero
    if (abs < 0x33000000u) return sign;           // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1 ... aligns to 2^-24 units
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t r = abs - (112u << 23);  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);   // round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

void ConvertToF32(DType type, const void* src, float* dst, size_t n) {
  const auto count = static_cast<int64_t>(n);
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    // `src` may be only byte-aligned (a GGUF file with general.alignment 1): each element is read
    // with memcpy, which compiles to a plain 16-bit load.
    case DType::kBF16: {
      const auto* s = static_cast<const unsigned char*>(src);
#pragma omp parallel for schedule(static) if (count > (1 << 16))
      for (int64_t i = 0; i < count; ++i) {
        uint16_t v;
        std::memcpy(&v, s + 2 * i, sizeof(v));
        dst[i] = BF16ToF32(v);
      }
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const unsigned char*>(src);
#pragma omp parallel for schedule(static) if (count > (1 << 16))
      for (int64_t i = 0; i < count; ++i) {
        uint16_t v;
        std::memcpy(&v, s + 2 * i, sizeof(v));
        dst[i] = F16ToF32(v);
      }
      return;
    }
  }
}

void ConvertFromF32(DType type, const float* src, void* dst, size_t n) {
  const auto count = static_cast<int64_t>(n);
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static) if (count > (1 << 16))
      for (int64_t i = 0; i < count; ++i) d[i] = F32ToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static) if (count > (1 << 16))
      for (int64_t i = 0; i < count; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
  }
}

}  // namespace moebatch
