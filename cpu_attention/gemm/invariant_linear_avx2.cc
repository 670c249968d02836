// InvariantLinear's tiles with AVX2+FMA+F16C (compiled with those flags only; run where CPUID has
// them). The 16 lanes are two ymm registers; 2x2 blocks keep 8 accumulators + 4 weight vectors +
// 2 activation vectors in the 16 registers.
#define MOEBATCH_INVARIANT_ISA avx2
#include <immintrin.h>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/invariant_linear_kernel.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace avx2 {
namespace {

struct V {
  __m256 lo, hi;
  static V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V LoadX(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static __m256 Widen8(const uint16_t* p, DType wd) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (wd == DType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
  }
  template <DType WD>
  static V LoadW(const WElem<WD>* p) {
    if constexpr (WD == DType::kF32) {
      return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    } else {
      return {Widen8(p, WD), Widen8(p + 8, WD)};
    }
  }
  static V Fma(const V& a, const V& b, const V& acc) {
    return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
  }
  static void Store(const V& a, float* p) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
  }
  // TreeSum's pairs: i + (i+8), then TreeSum8.
  static float Reduce(const V& a) { return TreeSum8(_mm256_add_ps(a.lo, a.hi)); }
};

}  // namespace
}  // namespace avx2

TileFn Avx2Tile(DType w_dtype) { return avx2::TileFor<avx2::V, 2, 2>(w_dtype); }

}  // namespace invariant_linear_internal
}  // namespace moebatch
