// InvariantLinear's tiles with AVX2+FMA+F16C (compiled with those flags only; run where CPUID has
// them). Few rows (invariant_linear_kernel.h): the 16 lanes are two ymm registers; 2x2 blocks keep
// 8 accumulators + 4 weight vectors + 2 activation vectors in the 16 registers. Many rows
// (invariant_linear_lanes.h): a ymm holds one lane of 8 output columns, 6 x 16 blocks.
#define MOEBATCH_INVARIANT_ISA avx2
#include <immintrin.h>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/invariant_linear_kernel.h"
#include "cpu_attention/gemm/invariant_linear_lanes.h"

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

// r[i] lane j -> r[j] lane i: an 8 x 8 transpose in registers.
inline void Transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The lane tile's column vector (8 output columns) and its packing (invariant_linear_lanes.h):
// 8 rows' 16 lanes at a step go through two 8 x 8 transposes, so every store is a whole vector or
// MR floats of one lane.
struct CV {
  static constexpr int kWidth = 8;
  __m256 v;
  static CV Zero() { return {_mm256_setzero_ps()}; }
  static CV Load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static void Store(float* p, const CV& a) { _mm256_storeu_ps(p, a.v); }
  static CV Broadcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
  static CV Fma(const CV& a, const CV& b, const CV& acc) {
    return {_mm256_fmadd_ps(a.v, b.v, acc.v)};
  }
  static CV Add(const CV& a, const CV& b) { return {_mm256_add_ps(a.v, b.v)}; }

  template <int MR>
  static void PackRows(const float* x, int64_t rows, int64_t k, float* xp) {
    static_assert(MR <= 8);
    const int64_t steps = k / 16, blocks = (rows + MR - 1) / MR, lane = LaneStride(steps * MR);
    const __m256i keep =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(MR), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t rb = 0; rb < blocks; ++rb) {
      const int live = static_cast<int>(std::min<int64_t>(MR, rows - rb * MR));
      float* dst = xp + rb * 16 * lane;
      for (int64_t s = 0; s < steps; ++s) {
        __m256 lo[8], hi[8];
        for (int i = 0; i < 8; ++i) {
          const float* src = x + (rb * MR + i) * k + s * 16;
          lo[i] = i < live ? _mm256_loadu_ps(src) : _mm256_setzero_ps();
          hi[i] = i < live ? _mm256_loadu_ps(src + 8) : _mm256_setzero_ps();
        }
        Transpose8(lo);
        Transpose8(hi);
        for (int j = 0; j < 8; ++j) {
          _mm256_maskstore_ps(dst + j * lane + s * MR, keep, lo[j]);
          _mm256_maskstore_ps(dst + (j + 8) * lane + s * MR, keep, hi[j]);
        }
      }
    }
  }

  template <DType WD, int NR>
  static void PackWeights(const WElem<WD>* w, int64_t cols, int64_t k, float* wp) {
    static_assert(NR % 8 == 0);
    const int64_t steps = k / 16, lane = LaneStride(steps * NR);
    for (int64_t s = 0; s < steps; ++s) {
      for (int g = 0; g < NR; g += 8) {
        __m256 lo[8], hi[8];
        for (int i = 0; i < 8; ++i) {
          if (g + i < cols) {
            const V wv = V::LoadW<WD>(w + (g + i) * k + s * 16);
            lo[i] = wv.lo;
            hi[i] = wv.hi;
          } else {
            lo[i] = hi[i] = _mm256_setzero_ps();
          }
        }
        Transpose8(lo);
        Transpose8(hi);
        for (int j = 0; j < 8; ++j) {
          _mm256_storeu_ps(wp + j * lane + s * NR + g, lo[j]);
          _mm256_storeu_ps(wp + (j + 8) * lane + s * NR + g, hi[j]);
        }
      }
    }
  }
};

}  // namespace
}  // namespace avx2

TileFn Avx2Tile(DType w_dtype) { return avx2::TileFor<avx2::V, 2, 2>(w_dtype); }

// 6 rows x 16 columns: 12 accumulators, 2 weight vectors and a broadcast in the 16 registers; per
// step 2 loads and 6 broadcasts for 12 FMAs (Zen 3 and Haswell on: two FMAs and two loads a cycle).
LaneKernel Avx2LaneKernel(DType w_dtype) { return avx2::LaneKernelFor<avx2::CV, 6, 2>(w_dtype); }

}  // namespace invariant_linear_internal
}  // namespace moebatch
