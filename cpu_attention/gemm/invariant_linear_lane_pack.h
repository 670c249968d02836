// The lane path's packing (invariant_linear_lanes.h) with AVX2 registers, shared by the AVX2 and
// AVX-512 levels (each includes it inside its own namespace, MOEBATCH_INVARIANT_ISA, compiled with
// its own flags). 8 rows' (or weight rows') 16 lanes at a step go through two 8 x 8 register
// transposes, so every store is a whole vector or the live floats of one lane. Exact copies: the
// packed floats are x's and the widened weights' own values.
#pragma once

#ifndef MOEBATCH_INVARIANT_ISA
#error "define MOEBATCH_INVARIANT_ISA (the per-ISA namespace) before including this file"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/invariant_linear_kernel.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace MOEBATCH_INVARIANT_ISA {

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

// The f16 scale of the Q8_0 block at p, widened (F16C) into 8 lanes.
inline __m256 Q8_0Scale8(const uint8_t* p) {
  uint16_t d;
  std::memcpy(&d, p, sizeof d);
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(d)));
}

// 8 weights at p widened to f32 (bf16: the bits shifted up; f16: F16C).
template <WForm WD>
inline __m256 LoadWeights8(const WElem<WD>* p) {
  if constexpr (WD == WForm::kF32) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (WD == WForm::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
  }
}

// invariant_linear_lanes.h's PackRows: the blocks of xp for rows [0, rows) of x (row stride k),
// MR rows a block in groups of 8, zero rows padding the last block.
template <int MR>
inline void PackRowsByTranspose(const float* x, int64_t rows, int64_t k, float* xp) {
  const int64_t steps = k / 16, blocks = (rows + MR - 1) / MR, lane = LaneStride(steps * MR);
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t rb = 0; rb < blocks; ++rb) {
    const int live = static_cast<int>(std::min<int64_t>(MR, rows - rb * MR));
    float* dst = xp + rb * 16 * lane;
    for (int g = 0; g < MR; g += 8) {
      // The group's floats per lane and step: min(8, MR - g), of which live - g hold rows.
      const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(std::min(8, MR - g)), index);
      for (int64_t s = 0; s < steps; ++s) {
        __m256 lo[8], hi[8];
        for (int i = 0; i < 8; ++i) {
          const float* src = x + (rb * MR + g + i) * k + s * 16;
          const bool row = g + i < live;
          lo[i] = row ? _mm256_loadu_ps(src) : _mm256_setzero_ps();
          hi[i] = row ? _mm256_loadu_ps(src + 8) : _mm256_setzero_ps();
        }
        Transpose8(lo);
        Transpose8(hi);
        for (int j = 0; j < 8; ++j) {
          _mm256_maskstore_ps(dst + j * lane + s * MR + g, keep, lo[j]);
          _mm256_maskstore_ps(dst + (j + 8) * lane + s * MR + g, keep, hi[j]);
        }
      }
    }
  }
}

// Lanes 0-7 (*lo) and 8-15 (*hi) of step s (K elements 16s..16s+15 in f32 order) of a weight row,
// widened. kBF16Pairs, within the whole 32-element chunks (16s < k32): step 2c takes chunk c's odd
// elements (lane j: element 32c + 2j + 1, the high half of the chunk's 32-bit word j), step 2c + 1
// its even ones (the low halves, shifted up); beyond them, K order.
// kQ8_0: half s % 2 of block s / 2, each q widened and multiplied by the block's d (exact).
template <WForm WD>
inline void LoadWeightStep(const WElem<WD>* row, int64_t s, int64_t k32, __m256* lo, __m256* hi) {
  if constexpr (WD == WForm::kQ8_0) {
    const uint8_t* block = row + s / 2 * kQ8_0BlockBytes;
    const __m256 d = Q8_0Scale8(block);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 + s % 2 * 16));
    *lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    *hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))));
    return;
  }
  if constexpr (WD == WForm::kBF16Pairs) {
    if (s * 16 < k32) {
      const uint16_t* chunk = row + s / 2 * 32;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 16));
      if (s % 2 == 0) {
        const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
        *lo = _mm256_castsi256_ps(_mm256_and_si256(a, high));
        *hi = _mm256_castsi256_ps(_mm256_and_si256(b, high));
      } else {
        *lo = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
        *hi = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
      }
      return;
    }
  }
  *lo = LoadWeights8<WD>(row + s * 16);
  *hi = LoadWeights8<WD>(row + s * 16 + 8);
}

// invariant_linear_lanes.h's PackWeights: wp from weight rows [0, cols) of w (row stride
// WRowStride<WD>(k), cols <= NR), zero columns after them.
template <WForm WD, int NR>
inline void PackWeightsByTranspose(const WElem<WD>* w, int64_t cols, int64_t k, float* wp) {
  static_assert(NR % 8 == 0);
  const int64_t steps = k / 16, lane = LaneStride(steps * NR), k32 = k - k % 32;
  for (int64_t s = 0; s < steps; ++s) {
    for (int g = 0; g < NR; g += 8) {
      __m256 lo[8], hi[8];
      for (int i = 0; i < 8; ++i) {
        if (g + i < cols) {
          LoadWeightStep<WD>(w + (g + i) * WRowStride<WD>(k), s, k32, &lo[i], &hi[i]);
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

// The packing a column vector type of invariant_linear_lanes.h provides, for CV types to inherit.
struct LanePacking {
  template <int MR>
  static void PackRows(const float* x, int64_t rows, int64_t k, float* xp) {
    PackRowsByTranspose<MR>(x, rows, k, xp);
  }
  template <WForm WD, int NR>
  static void PackWeights(const WElem<WD>* w, int64_t cols, int64_t k, float* wp) {
    PackWeightsByTranspose<WD, NR>(w, cols, k, wp);
  }
};

}  // namespace MOEBATCH_INVARIANT_ISA
}  // namespace invariant_linear_internal
}  // namespace moebatch
