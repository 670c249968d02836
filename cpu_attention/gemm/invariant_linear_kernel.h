// The tiles of InvariantLinear (invariant_linear.h), written once over a 16-lane vector type V and
// compiled per ISA: invariant_linear_{portable,avx2,avx512}.cc each define V and include this file
// inside their own namespace (MOEBATCH_INVARIANT_ISA), so code built with AVX-512 flags never
// stands in for the baseline build of the same function (no ODR clash between the copies).
//
// V must provide (16 f32 lanes): Zero(), LoadX(const float*), Store(float*, V), LoadW(const W*) for
// W = float (f32) and uint16_t (bf16 or f16 through the WForm template argument; kBF16Pairs loads
// as kBF16), Scale (a type), ScaleQ8_0(const uint8_t* block) = the Q8_0 block's f16 scale d
// widened, and LoadQ8_0(const uint8_t* block, int first, Scale d) = the block's elements
// first..first+15 (first 0 or 16) widened exactly (d·q), LoadOdd(const uint16_t* p) /
// LoadEven(const uint16_t* p) = the bf16 elements p[2j + 1] / p[2j] (j < 16) widened, Fma(a, b,
// acc) = one rounding of a·b + acc per lane, and Reduce(V) = step 2's tree (TreeSum's additions,
// pair for pair, in registers).
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

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "engine/model/dtype.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace MOEBATCH_INVARIANT_ISA {

// What a weight row is an array of: f32 or 16-bit values, or the bytes of Q8_0 blocks.
template <WForm WD>
using WElem = std::conditional_t<WD == WForm::kF32, float,
                                 std::conditional_t<WD == WForm::kQ8_0, uint8_t, uint16_t>>;

// WElem<WD>s from one weight row of k elements to the next.
template <WForm WD>
constexpr int64_t WRowStride(int64_t k) {
  return WD == WForm::kQ8_0 ? WRowBytes(WD, k) : k;
}

template <WForm WD>
inline float ScalarW(const WElem<WD>* p) {
  if constexpr (WD == WForm::kF32) {
    return *p;
  } else if constexpr (WD == WForm::kF16) {
    return F16ToF32(*p);
  } else {
    return BF16ToF32(*p);
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
// (A Q8_0 row has none: k is a multiple of 32.)
template <WForm WD>
inline float Finish(float acc, const float* x, const WElem<WD>* w, int64_t k16, int64_t k) {
  if constexpr (WD != WForm::kQ8_0) {
    for (int64_t t = k16; t < k; ++t) acc = std::fma(x[t], ScalarW<WD>(w + t), acc);
  }
  return acc;
}

// The weights `ahead` elements on from p (the next block's weight row, at the same offset) fetched
// into L1 while this block computes. The hardware prefetchers alone leave a call of few rows
// waiting on memory: Zen 3, 2 threads, Q8_0 [5632, 2048] at 1 row 0.72-0.75 ms without, 0.43-0.48
// with; [2048, 5632] 0.54-0.59 against 0.40-0.44; bf16 at 1-2 rows 5-30% faster with
// (bench_quant_linear, docs/performance.md). Past the last block it
// touches the next tile's rows or nothing (a prefetch never faults).
template <class T>
inline void PrefetchNextBlock(const T* p, int64_t ahead) {
  __builtin_prefetch(p + ahead, 0, 3);
}

// y[r, c] for r < MR rows of x (row stride k) and c < NR rows of w (row stride ldw >= k): step 1
// over t in [t0, t1) (t0 a multiple of 32, t1 one too or k16 = k - k % 16), the accumulators in
// registers. park == nullptr: the whole of K (t0 0, t1 k16), then steps 2-3 into y (row stride
// ldy). Otherwise park holds the MR x NR accumulators' 16 lanes ([r][c][16] f32) between slices:
// read unless t0 is 0; written unless t1 is k16, where steps 2-3 run instead. The lanes' FMAs come
// in the same order either way, so the bits do not depend on the slicing.
template <class V, WForm WD, int MR, int NR>
void Block(const float* x, int64_t k, const WElem<WD>* w, int64_t ldw, float* y, int64_t ldy,
           int64_t t0, int64_t t1, float* park) {
  const int64_t k16 = k - k % 16;
  V acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      acc[r][c] = park != nullptr && t0 > 0 ? V::LoadX(park + (r * NR + c) * 16) : V::Zero();
    }
  }
  // The pair order's whole 32-element chunks: steps t and t + 16 take the chunk's odd weights,
  // then its even ones; x comes permuted to match (PermutePairs32).
  const int64_t tp = WD == WForm::kBF16Pairs ? std::min(t1, k - k % 32) : t0;
  for (int64_t t = t0; t < tp; t += 32) {
    for (int half = 0; half < 2; ++half) {
      V wv[NR];
      for (int c = 0; c < NR; ++c) {
        if constexpr (WD == WForm::kBF16Pairs) {
          if (half == 0) PrefetchNextBlock(w + c * ldw + t, NR * ldw);
          wv[c] = half == 0 ? V::LoadOdd(w + c * ldw + t) : V::LoadEven(w + c * ldw + t);
        }
      }
      for (int r = 0; r < MR; ++r) {
        const V xv = V::LoadX(x + r * k + t + 16 * half);
        for (int c = 0; c < NR; ++c) acc[r][c] = V::Fma(xv, wv[c], acc[r][c]);
      }
    }
  }
  if constexpr (WD == WForm::kQ8_0) {
    // Whole blocks (k16 == k): each block's scale widened once for its two halves of 16.
    for (int64_t t = t0; t < t1; t += kQ8_0BlockElems) {
      const uint8_t* block[NR];
      typename V::Scale d[NR];
      for (int c = 0; c < NR; ++c) {
        block[c] = w + c * ldw + t / kQ8_0BlockElems * kQ8_0BlockBytes;
        d[c] = V::ScaleQ8_0(block[c]);
        PrefetchNextBlock(block[c], NR * ldw);
      }
      for (int half = 0; half < 2; ++half) {
        V wv[NR];
        for (int c = 0; c < NR; ++c) wv[c] = V::LoadQ8_0(block[c], 16 * half, d[c]);
        for (int r = 0; r < MR; ++r) {
          const V xv = V::LoadX(x + r * k + t + 16 * half);
          for (int c = 0; c < NR; ++c) acc[r][c] = V::Fma(xv, wv[c], acc[r][c]);
        }
      }
    }
  } else {
    for (int64_t t = std::max(t0, tp); t < t1; t += 16) {
      V wv[NR];
      for (int c = 0; c < NR; ++c) {
        PrefetchNextBlock(w + c * ldw + t, NR * ldw);
        wv[c] = V::template LoadW<WD>(w + c * ldw + t);
      }
      for (int r = 0; r < MR; ++r) {
        const V xv = V::LoadX(x + r * k + t);
        for (int c = 0; c < NR; ++c) acc[r][c] = V::Fma(xv, wv[c], acc[r][c]);
      }
    }
  }
  if (park != nullptr && t1 < k16) {
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NR; ++c) V::Store(park + (r * NR + c) * 16, acc[r][c]);
    }
    return;
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      y[r * ldy + c] = Finish<WD>(V::Reduce(acc[r][c]), x + r * k, w + c * ldw, k16, k);
    }
  }
}

template <class V, WForm WD, int MR, int NR_MAX, class... Args>
inline void BlockNr(int nr, Args... args) {
  if (nr >= NR_MAX) return Block<V, WD, MR, NR_MAX>(args...);
  if constexpr (NR_MAX > 1) {
    if (nr == 1) return Block<V, WD, MR, 1>(args...);
  }
  if constexpr (NR_MAX > 2) {
    if (nr == 2) return Block<V, WD, MR, 2>(args...);
  }
  if constexpr (NR_MAX > 3) {
    if (nr == 3) return Block<V, WD, MR, 3>(args...);
  }
}

// Block<mr, nr> for 1 <= mr <= MR_MAX, 1 <= nr <= NR_MAX.
template <class V, WForm WD, int MR_MAX, int NR_MAX, class... Args>
inline void BlockMrNr(int mr, int nr, Args... args) {
  if (mr >= MR_MAX) return BlockNr<V, WD, MR_MAX, NR_MAX>(nr, args...);
  if constexpr (MR_MAX > 1) {
    if (mr == 1) return BlockNr<V, WD, 1, NR_MAX>(nr, args...);
  }
  if constexpr (MR_MAX > 2) {
    if (mr == 2) return BlockNr<V, WD, 2, NR_MAX>(nr, args...);
  }
  if constexpr (MR_MAX > 3) {
    if (mr == 3) return BlockNr<V, WD, 3, NR_MAX>(nr, args...);
  }
}

// y[m0:m1, n0:n1] of y [*, ldy]: x rows m0.. (stride k), w rows n0.. (stride k), MR_MAX x NR_MAX
// blocks (<= 4 x 4), each over the whole of K with the weights read in place and widened in
// registers. The caller's tiles keep a tile's weight rows within L2 (invariant_linear.cc), so a
// block of rows reads them from memory once and the next blocks from L2. (An f32 copy of a tile's
// widened weights with K sliced through L1 measured 1.3-1.4x slower at 16-48 rows on a Sapphire
// Rapids VM; a copy per K slice streamed with prefetches gained nothing consistent there:
// docs/performance.md.)
// kBF16Pairs: x permuted (PermutePairs32), w bf16 in K order.
template <class V, WForm WD, int MR_MAX, int NR_MAX>
void Tile(const float* x, int64_t m0, int64_t m1, int64_t k, const void* w_void, int64_t n0,
          int64_t n1, float* y, int64_t ldy) {
  const int64_t ldw = WRowStride<WD>(k);
  const WElem<WD>* w = static_cast<const WElem<WD>*>(w_void) + n0 * ldw;
  x += m0 * k;
  y += m0 * ldy + n0;
  const int64_t rows = m1 - m0, cols = n1 - n0, k16 = k - k % 16;
  // K slices of kSliceXBytes of a block's rows of x, so that those stay in L1 while the slice
  // passes over the tile's weight rows (Zen 3, 2 threads, Q8_0 [2048, 5632] at 4-8 rows: 1.3x
  // faster). One slice when the rows fit kWholeXBytes, or for fewer than 4 rows, which wait on
  // the weights' stream whatever x does, and which the slices only break up (2 rows: 5-9% slower).
  constexpr int64_t kSliceXBytes = 16 << 10, kWholeXBytes = 32 << 10;
  const int64_t x_bytes =
      std::min<int64_t>(MR_MAX, rows) * k16 * static_cast<int64_t>(sizeof(float));
  const int64_t slice = x_bytes <= kWholeXBytes || rows < 4
                            ? k16
                            : std::max<int64_t>(32, kSliceXBytes / (MR_MAX * 4) / 32 * 32);
  float* park = nullptr;
  if (slice < k16) {
    thread_local std::vector<float> park_buffer;
    park = Aligned64(park_buffer, (cols + NR_MAX - 1) / NR_MAX * MR_MAX * NR_MAX * 16);
  }
  for (int64_t i = 0; i < rows; i += MR_MAX) {
    const int mr = static_cast<int>(std::min<int64_t>(MR_MAX, rows - i));
    for (int64_t t0 = 0;; t0 += slice) {  // once when k16 is 0
      const int64_t t1 = std::min(k16, t0 + slice);
      for (int64_t j = 0; j < cols; j += NR_MAX) {
        const int nr = static_cast<int>(std::min<int64_t>(NR_MAX, cols - j));
        float* block_park = park != nullptr ? park + j * MR_MAX * 16 : nullptr;
        BlockMrNr<V, WD, MR_MAX, NR_MAX>(mr, nr, x + i * k, k, w + j * ldw, ldw, y + i * ldy + j,
                                         ldy, t0, t1, block_park);
      }
      if (t1 >= k16) break;
    }
  }
}

// Tile for weights that cost more to widen than to multiply (Q8_0 on AVX2): blocks of 4 rows x 1
// weight row, so each weight vector is widened once for 4 rows of x, and the rows left (< 4) in
// blocks of up to 2 x 2 (two weight rows: four independent FMA chains at one row of x). Same
// elements, same bits as Tile.
template <class V, WForm WD>
void TileTall(const float* x, int64_t m0, int64_t m1, int64_t k, const void* w_void, int64_t n0,
              int64_t n1, float* y, int64_t ldy) {
  const int64_t rows4 = (m1 - m0) / 4 * 4;
  if (rows4 > 0) Tile<V, WD, 4, 1>(x, m0, m0 + rows4, k, w_void, n0, n1, y, ldy);
  if (m0 + rows4 < m1) Tile<V, WD, 2, 2>(x, m0 + rows4, m1, k, w_void, n0, n1, y, ldy);
}

// The tile function of weight form w_form with MR_MAX x NR_MAX blocks.
template <class V, int MR_MAX, int NR_MAX>
TileFn TileFor(WForm w_form) {
  switch (w_form) {
    case WForm::kF32:
      return Tile<V, WForm::kF32, MR_MAX, NR_MAX>;
    case WForm::kBF16:
      return Tile<V, WForm::kBF16, MR_MAX, NR_MAX>;
    case WForm::kF16:
      return Tile<V, WForm::kF16, MR_MAX, NR_MAX>;
    case WForm::kBF16Pairs:
      return Tile<V, WForm::kBF16Pairs, MR_MAX, NR_MAX>;
    case WForm::kQ8_0:
      return Tile<V, WForm::kQ8_0, MR_MAX, NR_MAX>;
  }
  return nullptr;
}

}  // namespace MOEBATCH_INVARIANT_ISA
}  // namespace invariant_linear_internal
}  // namespace moebatch
