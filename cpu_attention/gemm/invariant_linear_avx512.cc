// InvariantLinear's tiles with AVX-512 F/BW (compiled with those flags only; run where CPUID has
// them). One zmm holds the 16 lanes; 4x4 blocks keep 16 accumulators + 4 weight vectors + 1
// activation vector in the 32 registers.
#define MOEBATCH_INVARIANT_ISA avx512
#include <immintrin.h>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/invariant_linear_kernel.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace avx512 {
namespace {

struct V {
  __m512 v;
  static V Zero() { return {_mm512_setzero_ps()}; }
  static V LoadX(const float* p) { return {_mm512_loadu_ps(p)}; }
  template <DType WD>
  static V LoadW(const WElem<WD>* p) {
    if constexpr (WD == DType::kF32) {
      return {_mm512_loadu_ps(p)};
    } else {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      if constexpr (WD == DType::kF16) return {_mm512_cvtph_ps(h)};
      return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};  // bf16
    }
  }
  static V Fma(const V& a, const V& b, const V& acc) { return {_mm512_fmadd_ps(a.v, b.v, acc.v)}; }
  static void Store(const V& a, float* p) { _mm512_storeu_ps(p, a.v); }
  // TreeSum's pairs: i + (i+8), then TreeSum8.
  static float Reduce(const V& a) {
    return TreeSum8(_mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1)));
  }
};

}  // namespace
}  // namespace avx512

TileFn Avx512Tile(DType w_dtype) { return avx512::TileFor<avx512::V, 4, 4>(w_dtype); }

}  // namespace invariant_linear_internal
}  // namespace moebatch
