// The tiles of InvariantLinear (invariant_linear.h), written once over a 16-lane vector type V and
// compiled per ISA: invariant_linear_{portable,avx2,avx512}.cc each define V and include this file
// inside their own namespace (MOEBATCH_INVARIANT_ISA), so code built with AVX-512 flags never
// stands in for the baseline build of the same function (no ODR clash between the copies).
//
// V must provide (16 f32 lanes): Zero(), LoadX(const float*), LoadW(const W*) for W = float
// (f32) and uint16_t (bf16 or f16 through the DType template argument), Fma(a, b, acc) = one
// rounding of a·b + acc per lane, Store(V, float*), and Reduce(V) = step 2's tree (TreeSum's
// additions, pair for pair, in registers).
//
// Every output element goes through Block's sequence (invariant_linear.h, steps 1-3) whatever the
// block shape MR x NR it falls in, so edge blocks give the same bits as full ones.
#pragma once

#ifndef MOEBATCH_INVARIANT_ISA
#error "define MOEBATCH_INVARIANT_ISA (the per-ISA namespace) before including this file"
#endif

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "engine/dtype.h"
#include "engine/invariant_linear_internal.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace MOEBATCH_INVARIANT_ISA {

template <DType WD>
using WElem = std::conditional_t<WD == DType::kF32, float, uint16_t>;

template <DType WD>
inline float ScalarW(const WElem<WD>* p) {
  if constexpr (WD == DType::kF32) {
    return *p;
  } else if constexpr (WD == DType::kBF16) {
    return BF16ToF32(*p);
  } else {
    return F16ToF32(*p);
  }
}

// Step 2, the lane tree, on 16 lanes in memory (overwrites them): lane i += lane i+8 (i < 8), then
// lane i += lane i+4 (i < 4), i+2, i+1. The vector Reduce functions add the same pairs.
inline float TreeSum(float* lanes) {
  for (int s = 8; s >= 1; s >>= 1) {
    for (int i = 0; i < s; ++i) lanes[i] += lanes[i + s];
  }
  return lanes[0];
}

#if defined(__AVX__)
// TreeSum's last three levels on 8 lanes (after lane i += lane i+8): i + (i+4), i + (i+2),
// i + (i+1), in registers.
inline float TreeSum8(__m256 s8) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#endif

// Step 3: the K % 16 tail, fused into the tree's sum in increasing t.
template <DType WD>
inline float Finish(float acc, const float* x, const WElem<WD>* w, int64_t k16, int64_t k) {
  for (int64_t t = k16; t < k; ++t) acc = std::fma(x[t], ScalarW<WD>(w + t), acc);
  return acc;
}

// y[r, c] for r < MR rows of x (row stride k) and c < NR rows of w (row stride k); y row stride
// ldy.
template <class V, DType WD, int MR, int NR>
void Block(const float* x, int64_t k, const WElem<WD>* w, float* y, int64_t ldy) {
  const int64_t k16 = k - k % 16;
  V acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) acc[r][c] = V::Zero();
  }
  for (int64_t t = 0; t < k16; t += 16) {
    V wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = V::template LoadW<WD>(w + c * k + t);
    for (int r = 0; r < MR; ++r) {
      const V xv = V::LoadX(x + r * k + t);
      for (int c = 0; c < NR; ++c) acc[r][c] = V::Fma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      y[r * ldy + c] = Finish<WD>(V::Reduce(acc[r][c]), x + r * k, w + c * k, k16, k);
    }
  }
}

template <class V, DType WD, int MR, int NR_MAX>
inline void BlockNr(int nr, const float* x, int64_t k, const WElem<WD>* w, float* y, int64_t ldy) {
  if (nr >= NR_MAX) return Block<V, WD, MR, NR_MAX>(x, k, w, y, ldy);
  if constexpr (NR_MAX > 1) {
    if (nr == 1) return Block<V, WD, MR, 1>(x, k, w, y, ldy);
  }
  if constexpr (NR_MAX > 2) {
    if (nr == 2) return Block<V, WD, MR, 2>(x, k, w, y, ldy);
  }
  if constexpr (NR_MAX > 3) {
    if (nr == 3) return Block<V, WD, MR, 3>(x, k, w, y, ldy);
  }
}

// Tiles of at least this many rows widen bf16/f16 weights into a buffer first.
constexpr int64_t kWidenRows = 16;

// y[m0:m1, n0:n1] of y [*, ldy]: x rows m0.. (stride k), w rows n0.. (stride k). MR_MAX, NR_MAX
// <= 4.
template <class V, DType WD, int MR_MAX, int NR_MAX>
void Tile(const float* x, int64_t m0, int64_t m1, int64_t k, const void* w_void, int64_t n0,
          int64_t n1, float* y, int64_t ldy) {
  const auto* w = static_cast<const WElem<WD>*>(w_void);
  if constexpr (WD != DType::kF32) {
    // Many rows: widen the tile's weights to f32 once (exact) rather than in every block's inner
    // loop, where the conversions would compete with the FMAs for ports. Same bits either way.
    if (m1 - m0 >= kWidenRows) {
      thread_local std::vector<float> wide;
      wide.resize(static_cast<size_t>((n1 - n0) * k));
      const int64_t k16 = k - k % 16;
      for (int64_t j = n0; j < n1; ++j) {
        const WElem<WD>* src = w + j * k;
        float* dst = wide.data() + (j - n0) * k;
        for (int64_t t = 0; t < k16; t += 16) V::Store(V::template LoadW<WD>(src + t), dst + t);
        for (int64_t t = k16; t < k; ++t) dst[t] = ScalarW<WD>(src + t);
      }
      return Tile<V, DType::kF32, MR_MAX, NR_MAX>(x, m0, m1, k, wide.data() - n0 * k, n0, n1, y,
                                                  ldy);
    }
  }
  for (int64_t i = m0; i < m1; i += MR_MAX) {
    const int mr = static_cast<int>(std::min<int64_t>(MR_MAX, m1 - i));
    const float* xi = x + i * k;
    for (int64_t j = n0; j < n1; j += NR_MAX) {
      const int nr = static_cast<int>(std::min<int64_t>(NR_MAX, n1 - j));
      const WElem<WD>* wj = w + j * k;
      float* yij = y + i * ldy + j;
      if (mr >= MR_MAX) {
        BlockNr<V, WD, MR_MAX, NR_MAX>(nr, xi, k, wj, yij, ldy);
      } else if (mr == 1) {
        BlockNr<V, WD, 1, NR_MAX>(nr, xi, k, wj, yij, ldy);
      } else if (mr == 2) {
        if constexpr (MR_MAX > 2) BlockNr<V, WD, 2, NR_MAX>(nr, xi, k, wj, yij, ldy);
      } else {
        if constexpr (MR_MAX > 3) BlockNr<V, WD, 3, NR_MAX>(nr, xi, k, wj, yij, ldy);
      }
    }
  }
}

// The tile function of weight type w_dtype with MR_MAX x NR_MAX blocks.
template <class V, int MR_MAX, int NR_MAX>
TileFn TileFor(DType w_dtype) {
  switch (w_dtype) {
    case DType::kF32:
      return Tile<V, DType::kF32, MR_MAX, NR_MAX>;
    case DType::kBF16:
      return Tile<V, DType::kBF16, MR_MAX, NR_MAX>;
    case DType::kF16:
      return Tile<V, DType::kF16, MR_MAX, NR_MAX>;
  }
  return nullptr;
}

}  // namespace MOEBATCH_INVARIANT_ISA
}  // namespace invariant_linear_internal
}  // namespace moebatch
