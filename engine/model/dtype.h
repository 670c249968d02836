// Element types of checkpoint tensors, KV cache and activations, and exact conversions between
// them.
//
// bf16 -> f32 and f16 -> f32 are exact. f32 -> bf16 and f32 -> f16 round to nearest even, as
// torch's `Tensor.to(torch.bfloat16)` / `.to(torch.float16)` do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moebatch {

enum class DType : uint8_t { kF32, kF16, kBF16 };

// Bytes per element.
constexpr size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// The safetensors spelling: "F32", "F16", "BF16".
std::string_view DTypeName(DType t);

// Parses a safetensors dtype string; nullopt for types moebatch does not compute with (I64,
// F64...).
std::optional<DType> DTypeFromSafetensors(std::string_view name);

// Parses a user-facing spelling: "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16"
// (also the config.json `torch_dtype` values). nullopt when unknown.
std::optional<DType> DTypeFromString(std::string_view name);

inline float BF16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// Converts n elements of `src` (type `type`) to f32. Multithreaded (OpenMP) for large n.
void ConvertToF32(DType type, const void* src, float* dst, size_t n);
// Converts n f32 elements to `type` with round-to-nearest-even.
void ConvertFromF32(DType type, const float* src, void* dst, size_t n);

}  // namespace moebatch
