// InvariantLinear's tiles with AVX2+FMA+F16C (compiled with those flags only; run where CPUID has
// them). Few rows (invariant_linear_kernel.h): the 16 lanes are two ymm registers; 2x2 blocks keep
// 8 accumulators + 4 weight vectors + 2 activation vectors in the 16 registers. Many rows
// (invariant_linear_lanes.h): a ymm holds one lane of 8 output columns, 6 x 16 blocks.
#define MOEBATCH_INVARIANT_ISA avx2
#include <immintrin.h>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/invariant_linear_kernel.h"
#include "cpu_attention/gemm/invariant_linear_lane_pack.h"
#include "cpu_attention/gemm/invariant_linear_lanes.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace avx2 {
namespace {

struct V {
  __m256 lo, hi;
  static V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V LoadX(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static __m256 Widen8(const uint16_t* p, WForm wd) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (wd == WForm::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
  }
  static void Store(float* p, const V& a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
  }
  template <WForm WD>
  static V LoadW(const WElem<WD>* p) {
    if constexpr (WD == WForm::kF32) {
      return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    } else {
      return {Widen8(p, WD), Widen8(p + 8, WD)};
    }
  }
  // The Q8_0 block at p: its scale d widened, and its elements first..first+15 as d·q (exact; 8
  // bytes a vpmovsxbd load).
  using Scale = __m256;
  static Scale ScaleQ8_0(const uint8_t* p) { return Q8_0Scale8(p); }
  static V LoadQ8_0(const uint8_t* p, int first, Scale d) {
    const auto* q = reinterpret_cast<const __m128i*>(p + 2 + first);
    const auto* q8 = reinterpret_cast<const __m128i*>(p + 10 + first);
    return {_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q)))),
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q8))))};
  }
  // The 32-bit word j of 32 bf16 holds elements 2j (low half) and 2j + 1 (high half).
  static __m256i Words8(const uint16_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static V LoadOdd(const uint16_t* p) {
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    return {_mm256_castsi256_ps(_mm256_and_si256(Words8(p), high)),
            _mm256_castsi256_ps(_mm256_and_si256(Words8(p + 16), high))};
  }
  static V LoadEven(const uint16_t* p) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(Words8(p), 16)),
            _mm256_castsi256_ps(_mm256_slli_epi32(Words8(p + 16), 16))};
  }
  static V Fma(const V& a, const V& b, const V& acc) {
    return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
  }
  // TreeSum's pairs: i + (i+8), then TreeSum8.
  static float Reduce(const V& a) { return TreeSum8(_mm256_add_ps(a.lo, a.hi)); }
};

// The lane tile's column vector (8 output columns); the packing is invariant_linear_lane_pack.h's.
struct CV : LanePacking {
  static constexpr int kWidth = 8;
  __m256 v;
  CV() = default;
  CV(__m256 x) : v(x) {}  // NOLINT(google-explicit-constructor): `return {intrinsic}` below
  static CV Zero() { return {_mm256_setzero_ps()}; }
  static CV Load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static void Store(float* p, const CV& a) { _mm256_storeu_ps(p, a.v); }
  static CV Broadcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
  static CV Fma(const CV& a, const CV& b, const CV& acc) {
    return {_mm256_fmadd_ps(a.v, b.v, acc.v)};
  }
  static CV Add(const CV& a, const CV& b) { return {_mm256_add_ps(a.v, b.v)}; }
};

}  // namespace
}  // namespace avx2

// Q8_0: 4 x 1 blocks (TileTall), its weights' widening (a conversion and a multiply per 8) shared
// by 4 rows of x.
TileFn Avx2Tile(WForm w_form) {
  if (w_form == WForm::kQ8_0) return avx2::TileTall<avx2::V, WForm::kQ8_0>;
  return avx2::TileFor<avx2::V, 2, 2>(w_form);
}

// 6 rows x 16 columns: 12 accumulators, 2 weight vectors and a broadcast in the 16 registers; per
// step 2 loads and 6 broadcasts for 12 FMAs (Zen 3 and Haswell on: two FMAs and two loads a cycle).
// From 10 rows (Zen 3, [14336, 4096] bf16: 8 rows 13.4 ms by dot products vs 16.1 ms lane by lane,
// 12 rows 20.5 vs 15.9 ms); Q8_0 from 21, where widening its weights into the panels costs more
// than the 4 x 1 blocks' widening in registers (Zen 3, 2 threads, [5632, 2048] and [2048, 5632],
// best of three alternated runs: 10-20 rows 1.05-1.41x faster by dot products, 24 and 32 rows
// 0.89-0.98x).
LaneKernel Avx2LaneKernel(WForm w_form) {
  return avx2::LaneKernelFor<avx2::CV, 6, 2>(w_form, w_form == WForm::kQ8_0 ? 21 : 10);
}

}  // namespace invariant_linear_internal
}  // namespace moebatch
