// What the cpu op files share (cpu_attention/ops/ops_task_a.cc, ops_task_b.cc): argument checks
// that answer absl::Status, dtype dispatch to a compile-time element type (so inner loops carry no
// branch) and element loads and stores. Internal to cpu_attention/ops/; internal linkage.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/dtype.h"

namespace moebatch::cpu_ops {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

template <typename... Args>
absl::Status Invalid(const char* fn, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(fn, ": ", args...));
}

[[maybe_unused]] absl::Status CheckDType(const char* fn, const char* what, DType t) {
  if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) return absl::OkStatus();
  return Invalid(fn, what, " has an unknown DType (", static_cast<int>(t), ")");
}

// Element types: f32 is float; f16 and bf16 are uint16_t bit patterns, told apart by the tag.
struct F32 {
  using Storage = float;
  static float Load(float v) { return v; }
  static float Store(float v) { return v; }
};
struct BF16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return BF16ToF32(v); }
  static uint16_t Store(float v) { return F32ToBF16(v); }
};
struct F16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return F16ToF32(v); }
  static uint16_t Store(float v) { return F32ToF16(v); }
};

// Calls f(Tag{}) with Tag the element type of `t` (validated by the caller).
template <typename F>
auto Dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kBF16:
      return f(BF16{});
    case DType::kF16:
      return f(F16{});
    case DType::kF32:
      break;
  }
  return f(F32{});
}

}  // namespace
}  // namespace moebatch::cpu_ops
