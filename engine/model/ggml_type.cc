#include "engine/model/ggml_type.h"

#include <cstdlib>

namespace moebatch {
namespace {

constexpr GgmlTypeTraits kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},
    {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", 32, 2 + 16},
    {GgmlType::kQ4_1, "Q4_1", 32, 2 + 2 + 16},
    {GgmlType::kQ5_0, "Q5_0", 32, 2 + 4 + 16},
    {GgmlType::kQ5_1, "Q5_1", 32, 2 + 2 + 4 + 16},
    {GgmlType::kQ8_0, "Q8_0", 32, 2 + 32},
    {GgmlType::kQ8_1, "Q8_1", 32, 4 + 4 + 32},
    {GgmlType::kQ2_K, "Q2_K", 256, 2 + 2 + 256 / 16 + 256 / 4},
    {GgmlType::kQ3_K, "Q3_K", 256, 2 + 256 / 4 + 256 / 8 + 12},
    {GgmlType::kQ4_K, "Q4_K", 256, 2 + 2 + 256 / 2 + 12},
    {GgmlType::kQ5_K, "Q5_K", 256, 2 + 2 + 256 / 2 + 256 / 8 + 12},
    {GgmlType::kQ6_K, "Q6_K", 256, 2 + 256 / 2 + 256 / 4 + 256 / 16},
    {GgmlType::kQ8_K, "Q8_K", 256, 4 + 256 + 256 / 8},
    {GgmlType::kI8, "I8", 1, 1},
    {GgmlType::kI16, "I16", 1, 2},
    {GgmlType::kI32, "I32", 1, 4},
    {GgmlType::kI64, "I64", 1, 8},
    {GgmlType::kF64, "F64", 1, 8},
    {GgmlType::kBF16, "BF16", 1, 2},
    {GgmlType::kMXFP4, "MXFP4", 32, 1 + 16},
};

}  // namespace

std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type) {
  for (const GgmlTypeTraits& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == type) return t;
  }
  return std::nullopt;
}

bool IsComputedBlockType(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kMXFP4:
      return true;
    default:
      return false;
  }
}

GgmlTypeTraits GgmlTypeInfoOf(GgmlType type) {
  const std::optional<GgmlTypeTraits> t = GgmlTypeInfo(static_cast<uint32_t>(type));
  if (!t) std::abort();  // every enumerator is in kTypes
  return *t;
}

}  // namespace moebatch
