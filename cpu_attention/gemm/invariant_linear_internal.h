// Between invariant_linear.cc (dispatch, compiled for baseline x86-64) and the per-ISA tile files.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/dtype.h"

namespace moebatch {
namespace invariant_linear_internal {

// How the tiles read the weights: f32, f16 or bf16 in K order, or bf16 in the pair order of
// InvariantLinearBf16 (invariant_linear.h): within each whole 32-element chunk of K, the tiles see
// the 16 odd-indexed elements, then the 16 even-indexed ones (Pairs32 below), so that
// InvariantLinear's lane j takes element 2j+1 and then 2j of each chunk, as vdpbf16ps does. The
// activations come permuted the same way (PermutePairs32), and the same f32 steps 1-3 then give
// the pair order's bits. kQ8_0: ggml's Q8_0 blocks (a row of k / 32 blocks of 34 bytes: an f16
// scale d, then 32 int8 values q; element d·q), each element widened exactly to f32 (q has 8
// significant bits and d 11: the product fits f32's 24), so the tiles compute InvariantLinear over
// the dequantized weights; k a multiple of 32.
enum class WForm : uint8_t { kF32, kF16, kBF16, kBF16Pairs, kQ8_0 };

// Bytes of one ggml Q8_0 block (f16 scale, then 32 int8) and its elements.
constexpr int64_t kQ8_0BlockBytes = 34;
constexpr int64_t kQ8_0BlockElems = 32;

// Bytes of one weight row of k elements read as w_form.
constexpr int64_t WRowBytes(WForm w_form, int64_t k) {
  return w_form == WForm::kF32    ? 4 * k
         : w_form == WForm::kQ8_0 ? k / kQ8_0BlockElems * kQ8_0BlockBytes
                                  : 2 * k;
}

constexpr WForm WFormOf(DType d) {
  return d == DType::kF32 ? WForm::kF32 : d == DType::kF16 ? WForm::kF16 : WForm::kBF16;
}

// y[m0:m1, n0:n1] = x[m0:m1, :k] · w[n0:n1, :k]ᵀ, y row stride ldy (invariant_linear.h's order).
using TileFn = void (*)(const float* x, int64_t m0, int64_t m1, int64_t k, const void* w,
                        int64_t n0, int64_t n1, float* y, int64_t ldy);

TileFn PortableTile(WForm w_form);
TileFn Avx2Tile(WForm w_form);    // invariant_linear_avx2.cc: AVX2+FMA+F16C
TileFn Avx512Tile(WForm w_form);  // invariant_linear_avx512.cc: AVX-512 F/BW

// The same elements lane by lane, for calls of many rows (invariant_linear_lanes.h; same bits):
// pack_rows writes the blocks of the packed activations xp for rows [0, rows) of x
// (16·LaneStride((k/16)·mr) floats a block of mr rows, zero rows padding the last), then tile
// computes y[m0:m1, n0:n1] from x and xp (m0 a multiple of mr). Floats from one lane to the next in
// a packed block (xp, wp, acc of invariant_linear_lanes.h): the lane's `len` floats and 16 more, so
// that the 16 lanes, written together by the packing and read together by the tree, do not map to
// the same L1 sets when `len` floats are a multiple of 4 KiB.
inline int64_t LaneStride(int64_t len) { return len + 16; }

// The first 64-byte aligned float of `buffer` after it is resized to hold that and `floats` more.
inline float* Aligned64(std::vector<float>& buffer, int64_t floats) {
  buffer.resize(static_cast<size_t>(floats) + 16);
  const auto p = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
}

struct LaneKernel {
  int mr = 0;
  // Calls of at least this many rows go lane by lane: below it the weight packing costs more than
  // the register blocking gains (measured per ISA, invariant_linear_{avx2,avx512}.cc).
  int64_t min_rows = 0;
  void (*pack_rows)(const float* x, int64_t rows, int64_t k, float* xp) = nullptr;
  void (*tile)(const float* x, const float* xp, int64_t m0, int64_t m1, int64_t k, const void* w,
               int64_t n0, int64_t n1, float* y, int64_t ldy) = nullptr;
};
LaneKernel Avx2LaneKernel(WForm w_form);
LaneKernel Avx512LaneKernel(WForm w_form);

// InvariantLinearBf16's tiles on vdpbf16ps (invariant_linear_avx512bf16.cc, AVX-512 F/BW +
// AVX512-BF16; run only where CPUID has avx512_bf16): x [*, k] and w [*, k] bf16 in K order, read
// in place; the same bits as the pair-order tiles above over the permuted, widened activations.
using Bf16TileFn = void (*)(const uint16_t* x, int64_t m0, int64_t m1, int64_t k, const uint16_t* w,
                            int64_t n0, int64_t n1, float* y, int64_t ldy);
Bf16TileFn Avx512Bf16Tile();

// dst[0:k] = x[0:k] widened to f32 and, within each whole 32-element chunk, permuted: dst[32c + j]
// = x[32c + 2j + 1], dst[32c + 16 + j] = x[32c + 2j] (j < 16); the K % 32 tail in place.
void PermutePairs32(const uint16_t* x, int64_t k, float* dst);

// The calling thread's MXCSR with DAZ and FTZ set (denormal inputs read as zero, denormal results
// flushed to zero) for the object's lifetime: vdpbf16ps's fixed behaviour, which the pair order's
// every path follows. Restores the previous MXCSR.
class ScopedDenormalsFlushed {
 public:
  ScopedDenormalsFlushed();
  ~ScopedDenormalsFlushed();
  ScopedDenormalsFlushed(const ScopedDenormalsFlushed&) = delete;
  ScopedDenormalsFlushed& operator=(const ScopedDenormalsFlushed&) = delete;

 private:
  unsigned saved_;
};

}  // namespace invariant_linear_internal
}  // namespace moebatch
