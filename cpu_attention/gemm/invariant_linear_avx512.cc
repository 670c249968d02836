// InvariantLinear's tiles with AVX-512 F/BW (compiled with those flags only; run where CPUID has
// them). Few rows (invariant_linear_kernel.h): one zmm holds the 16 lanes; 4x4 blocks keep 16
// accumulators + 4 weight vectors + 1 activation vector in the 32 registers. Many rows
// (invariant_linear_lanes.h): a zmm holds one lane of 16 output columns, 12 x 32 blocks.
#define MOEBATCH_INVARIANT_ISA avx512
#include <immintrin.h>

#include <cstring>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/invariant_linear_kernel.h"
#include "cpu_attention/gemm/invariant_linear_lane_pack.h"
#include "cpu_attention/gemm/invariant_linear_lanes.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace avx512 {
namespace {

struct V {
  __m512 v;
  static V Zero() { return {_mm512_setzero_ps()}; }
  static V LoadX(const float* p) { return {_mm512_loadu_ps(p)}; }
  static void Store(float* p, const V& a) { _mm512_storeu_ps(p, a.v); }
  template <WForm WD>
  static V LoadW(const WElem<WD>* p) {
    if constexpr (WD == WForm::kF32) {
      return {_mm512_loadu_ps(p)};
    } else {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      if constexpr (WD == WForm::kF16) return {_mm512_cvtph_ps(h)};
      return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};  // bf16
    }
  }
  // The Q8_0 block at p: its scale d widened, and its elements first..first+15 as d·q (exact).
  using Scale = __m512;
  static Scale ScaleQ8_0(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<int16_t>(h)));
  }
  static V LoadQ8_0(const uint8_t* p, int first, Scale d) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 + first));
    return {_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)))};
  }
  // The 32-bit word j of 32 bf16 holds elements 2j (low half) and 2j + 1 (high half).
  static V LoadOdd(const uint16_t* p) {
    return {_mm512_castsi512_ps(
        _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))))};
  }
  static V LoadEven(const uint16_t* p) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16))};
  }
  static V Fma(const V& a, const V& b, const V& acc) { return {_mm512_fmadd_ps(a.v, b.v, acc.v)}; }
  // TreeSum's pairs: i + (i+8), then TreeSum8.
  static float Reduce(const V& a) {
    return TreeSum8(_mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1)));
  }
};

// The lane tile's column vector (16 output columns); the packing is invariant_linear_lane_pack.h's
// (ymm transposes: packing is a small share of the time).
struct CV : LanePacking {
  static constexpr int kWidth = 16;
  __m512 v;
  CV() = default;
  CV(__m512 x) : v(x) {}  // NOLINT(google-explicit-constructor): `return {intrinsic}` below
  static CV Zero() { return {_mm512_setzero_ps()}; }
  static CV Load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static void Store(float* p, const CV& a) { _mm512_storeu_ps(p, a.v); }
  static CV Broadcast(const float* p) { return {_mm512_set1_ps(*p)}; }
  static CV Fma(const CV& a, const CV& b, const CV& acc) {
    return {_mm512_fmadd_ps(a.v, b.v, acc.v)};
  }
  static CV Add(const CV& a, const CV& b) { return {_mm512_add_ps(a.v, b.v)}; }
};

}  // namespace
}  // namespace avx512

TileFn Avx512Tile(WForm w_form) { return avx512::TileFor<avx512::V, 4, 4>(w_form); }

// 8 rows x 32 columns: 16 accumulators, 2 weight vectors and a broadcast; per step 2 loads and 8
// broadcasts for 16 FMAs. From 32 rows. Zen 4 (2 cores, [14336, 4096] bf16, f32 FMA peak 233
// GFLOP/s), against 6 x 64, 12 x 32, 14 x 32 and 8 x 48 blocks: 8 x 32 was the fastest at every M
// from 16 to 512 (M = 512: 202 GFLOP/s; 12 x 32 193, 6 x 64 198). The dot-product tiles win below
// 32 rows: on a Sapphire Rapids VM (same shape, the two paths interleaved in one process, best of
// 5) 17.7 against 23.2 ms at 16 rows, 29.4 against 31.9 at 24, even at 32 (34.1 / 31.1 f32, 33.2 /
// 35.6 bf16 pairs), 48.7 against 38.5 at 48.
LaneKernel Avx512LaneKernel(WForm w_form) {
  return avx512::LaneKernelFor<avx512::CV, 8, 2>(w_form, 32);
}

}  // namespace invariant_linear_internal
}  // namespace moebatch
