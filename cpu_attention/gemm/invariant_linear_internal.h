// Between invariant_linear.cc (dispatch, compiled for baseline x86-64) and the per-ISA tile files.
#pragma once

#include <cstdint>

#include "engine/model/dtype.h"

namespace moebatch {
namespace invariant_linear_internal {

// y[m0:m1, n0:n1] = x[m0:m1, :k] · w[n0:n1, :k]ᵀ, y row stride ldy (invariant_linear.h's order).
using TileFn = void (*)(const float* x, int64_t m0, int64_t m1, int64_t k, const void* w,
                        int64_t n0, int64_t n1, float* y, int64_t ldy);

TileFn PortableTile(DType w_dtype);
TileFn Avx2Tile(DType w_dtype);    // invariant_linear_avx2.cc: AVX2+FMA+F16C
TileFn Avx512Tile(DType w_dtype);  // invariant_linear_avx512.cc: AVX-512 F/BW

}  // namespace invariant_linear_internal
}  // namespace moebatch
