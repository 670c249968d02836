// InvariantLinearBf16's tiles on AVX512-BF16 (compiled with AVX-512 F/BW/DQ + BF16 flags; run only
// where CPUID has avx512_bf16, by default only where the instruction measures faster than the f32
// FMAs: AMD Zen 4, not the Sapphire Rapids VMs, runtime/cpu_isa.h CpuVdpbf16psPays()). One
// vdpbf16ps per 32 bf16 activations and weights is step 1 of the pair order (invariant_linear.h):
// lane j += x[2j+1]·w[2j+1], then += x[2j]·w[2j], products exact, each addition rounded to nearest
// even, denormal inputs and results flushed to zero (Intel SDM, VDPBF16PS; measured on Zen 4,
// docs/performance.md). Two products per f32 lane and instruction: twice the f32 FMA's
// multiply-adds. Both operands are read in place (no widening, no packing); 4 x 4 blocks keep 16
// accumulators + 4 weight vectors + 1 activation vector in the 32 registers, and every block runs
// its whole K (a 64-row by ~256 KiB tile stays in L2, invariant_linear.cc).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "engine/model/dtype.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace avx512bf16 {
namespace {

// 16 bf16 at p widened to f32 (exact).
inline __m512 Widen16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m512bh LoadPairs(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// Step 2, TreeSum's pairs (invariant_linear_kernel.h): i + (i+8), i + (i+4), i + (i+2), i + (i+1).
inline float Reduce(__m512 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// y[r, c] for r < MR rows of x (row stride k) and c < NR rows of w (row stride ldw), whole K:
// the whole chunks by vdpbf16ps, a half chunk (K % 32 >= 16) by one f32 FMA step, the tree, then
// the K % 16 tail fused in increasing t.
template <int MR, int NR>
void Block(const uint16_t* x, int64_t k, const uint16_t* w, int64_t ldw, float* y, int64_t ldy) {
  const int64_t k32 = k - k % 32, k16 = k - k % 16;
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < k32; t += 32) {
    __m512bh wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = LoadPairs(w + c * ldw + t);
    for (int r = 0; r < MR; ++r) {
      const __m512bh xv = LoadPairs(x + r * k + t);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  if (k16 > k32) {
    __m512 wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = Widen16(w + c * ldw + k32);
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = Widen16(x + r * k + k32);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      float sum = Reduce(acc[r][c]);
      for (int64_t t = k16; t < k; ++t) {
        sum = std::fma(BF16ToF32(x[r * k + t]), BF16ToF32(w[c * ldw + t]), sum);
      }
      y[r * ldy + c] = sum;
    }
  }
}

using BlockFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);

template <int MR>
constexpr BlockFn kRowBlocks[4] = {Block<MR, 1>, Block<MR, 2>, Block<MR, 3>, Block<MR, 4>};
constexpr const BlockFn* kBlocks[4] = {kRowBlocks<1>, kRowBlocks<2>, kRowBlocks<3>, kRowBlocks<4>};

// y[m0:m1, n0:n1] of y [*, ldy]: x rows m0.. and w rows n0.. (both row stride k), in 4 x 4
// blocks, each row block over every weight row of the tile (which stays in L2).
void Tile(const uint16_t* x, int64_t m0, int64_t m1, int64_t k, const uint16_t* w, int64_t n0,
          int64_t n1, float* y, int64_t ldy) {
  for (int64_t i = m0; i < m1; i += 4) {
    const int mr = static_cast<int>(std::min<int64_t>(4, m1 - i));
    for (int64_t j = n0; j < n1; j += 4) {
      const int nr = static_cast<int>(std::min<int64_t>(4, n1 - j));
      kBlocks[mr - 1][nr - 1](x + i * k, k, w + j * k, k, y + i * ldy + j, ldy);
    }
  }
}

}  // namespace
}  // namespace avx512bf16

Bf16TileFn Avx512Bf16Tile() { return avx512bf16::Tile; }

}  // namespace invariant_linear_internal
}  // namespace moebatch
