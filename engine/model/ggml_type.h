// ggml's tensor types (ggml.h's enum ggml_type, gguf-py's GGMLQuantizationType): the number a GGUF
// file gives each tensor, and the block each type stores its elements in. A tensor of a block type
// keeps `block_size` consecutive elements of a row in `type_size` bytes (engine/model/ggml_quants.h
// lists the layouts).
#pragma once

#include <cstdint>
#include <optional>

namespace moebatch {

// ggml's enum ggml_type: the tensor types a GGUF file names by number (ggml.h; gguf-py's
// GGMLQuantizationType). Only the values moebatch knows the block layout of are listed.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  kMXFP4 = 39,
};

// A type's block: `block_size` elements stored in `type_size` bytes (ggml's ggml_type_traits,
// gguf-py's GGML_QUANT_SIZES), and its name as ggml prints it ("Q4_K").
struct GgmlTypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_size;
  int64_t type_size;
};
// The traits of type number `type`; nullopt for a number moebatch does not know.
std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type);

// The traits of `type` (one moebatch lists).
GgmlTypeTraits GgmlTypeInfoOf(GgmlType type);

// Whether `type` is one of the block types moebatch keeps weights in and computes with
// (engine/model/ggml_quants.h decodes them, cpu_attention/gemm/quant_linear.h multiplies with
// them): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4.
bool IsComputedBlockType(GgmlType type);

// Bytes of a row of `n` elements of `type`; n a multiple of its block size.
inline int64_t GgmlRowBytes(const GgmlTypeTraits& t, int64_t n) {
  return n / t.block_size * t.type_size;
}

}  // namespace moebatch
