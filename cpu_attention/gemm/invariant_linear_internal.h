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

// The same elements lane by lane, for calls of many rows (invariant_linear_lanes.h; same bits):
// pack_rows writes the blocks of the packed activations xp for rows [0, rows) of x
// (16·LaneStride((k/16)·mr) floats a block of mr rows, zero rows padding the last), then tile
// computes y[m0:m1, n0:n1] from x and xp (m0 a multiple of mr). Floats from one lane to the next in
// a packed block (xp, wp, acc of invariant_linear_lanes.h): the lane's `len` floats and 16 more, so
// that the 16 lanes, written together by the packing and read together by the tree, do not map to
// the same L1 sets when `len` floats are a multiple of 4 KiB.
inline int64_t LaneStride(int64_t len) { return len + 16; }

struct LaneKernel {
  int mr = 0;
  // Calls of at least this many rows go lane by lane: below it the weight packing costs more than
  // the register blocking gains (measured per ISA, invariant_linear_{avx2,avx512}.cc).
  int64_t min_rows = 0;
  void (*pack_rows)(const float* x, int64_t rows, int64_t k, float* xp) = nullptr;
  void (*tile)(const float* x, const float* xp, int64_t m0, int64_t m1, int64_t k, const void* w,
               int64_t n0, int64_t n1, float* y, int64_t ldy) = nullptr;
};
LaneKernel Avx2LaneKernel(DType w_dtype);
LaneKernel Avx512LaneKernel(DType w_dtype);

}  // namespace invariant_linear_internal
}  // namespace moebatch
