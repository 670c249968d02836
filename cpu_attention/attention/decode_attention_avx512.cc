// The AVX-512 (F/BW/VL/DQ) decode attention kernels, called only when the CPU has them
// (decode_attention.cc); compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq (CMakeLists.txt).
// The tiled kernel below (AttendTile, driven by decode_attention_tiled.h) serves every head_dim
// that is a multiple of 32; other head dims use decode_attention_internal.h's generic template with
// Avx512Ops. Also the KV append path's row conversion (ConvertRowAvx512).
//
// Instructions measured on the development host (Xeon Sapphire Rapids VM) and not used:
//  * AVX512-BF16 vdpbf16ps: 1.15 G instructions/s against 4.35 G/s for vfmadd231ps (a loop of
//    independent accumulators of each), and it would need the queries split into two bf16 parts.
//  * AMX (TDPBF16PS 16x16x32 with q and p split into bf16 hi + lo parts for fp32 accuracy): one
//    TDPBF16PS took 9.2 ns and one TILELOADD 5.4 ns; the skinny products of decode attention (G
//    query heads wide) use a quarter of a tile, and a complete AMX kernel (scores and p.V) ran at
//    37-63 ns per key row against 36-42 ns for this FMA kernel, so it was dropped for GQA. MLA's
//    latent cache, whose products fill whole tiles (16 query heads x 576 values), does use it
//    (mla_attention_amx.cc).
#include <immintrin.h>

#include "cpu_attention/attention/decode_attention_avx512_ops.h"
#include "cpu_attention/attention/decode_attention_tiled.h"

namespace moebatch {
namespace decode_attention_internal {
namespace {

// --- Tiled kernel for head_dim % 32 == 0 (every real model) ------------------------------------
//
// Faster than the generic template (docs/performance.md has the figures) in these ways:
//  * bf16 rows are widened without shuffles: a 64-byte load holds 32 bf16; `x << 16` gives the
//    even elements as f32 and `x & 0xffff0000` the odd ones. The query and the accumulators are
//    kept in the same (even, odd) order per 32 elements and put back in order at the end.
//  * q . K for R rows at once (R x G accumulators) so each query vector load serves R key rows.
//  * the 16 score vectors of a tile are reduced to one vector of 16 scores by a transpose-add
//    tree (45 instructions instead of 16 horizontal reductions of ~8 each), so the softmax runs on
//    registers.
// Prefetch and the heads-inner walk over the KV heads of a work item: decode_attention_tiled.h.

// r[i] = sum of the 16 lanes of v[i], i = 0..15.
inline __m512 TransposeReduce16(const __m512* v) {
  __m512 w[8];
  for (int i = 0; i < 8; ++i) {
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 x[4];
  for (int j = 0; j < 4; ++j) {
    x[j] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Dot products of R key rows with G queries (pair order), added into dots[g][t0 + r]; one
// prefetch step of pq per 32 elements.
template <DType T, int G, int R>
inline void ScoreRows(const std::byte* keys, size_t row_bytes, int64_t t0, int64_t d,
                      const float* qp, __m512 (*dots)[kTile], PrefetchQueue& pq) {
  constexpr size_t elem = DTypeSize(T);
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 32) {
    pq.Step();
    __m512 klo[R], khi[R];
    for (int r = 0; r < R; ++r) {
      LoadPair<T>(keys + static_cast<size_t>(t0 + r) * row_bytes + static_cast<size_t>(c) * elem,
                  klo[r], khi[r]);
    }
    for (int g = 0; g < G; ++g) {
      const __m512 qlo = _mm512_loadu_ps(qp + g * d + c);
      const __m512 qhi = _mm512_loadu_ps(qp + g * d + c + 16);
      for (int r = 0; r < R; ++r) {
        acc[r][g] = _mm512_fmadd_ps(qlo, klo[r], acc[r][g]);
        acc[r][g] = _mm512_fmadd_ps(qhi, khi[r], acc[r][g]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) dots[g][t0 + r] = acc[r][g];
}

// acc[g][c..c+32*CC) (pair order) = acc * corr[g] + sum_t p[g][t] V_t over the tile's n rows;
// one prefetch step of pq per row.
template <DType T, int G, int CC>
inline void AccumulateValues(const std::byte* values, size_t row_bytes, int64_t n, int64_t c,
                             const float (*p)[kTile], const float* corr, int64_t d, float* acc,
                             PrefetchQueue& pq) {
  constexpr size_t elem = DTypeSize(T);
  __m512 a[G][2 * CC];
  for (int g = 0; g < G; ++g) {
    const __m512 cg = _mm512_set1_ps(corr[g]);
    for (int k = 0; k < 2 * CC; ++k)
      a[g][k] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * d + c + 16 * k), cg);
  }
  for (int64_t t = 0; t < n; ++t) {
    pq.Step();
    __m512 v[2 * CC];
    const std::byte* row =
        values + static_cast<size_t>(t) * row_bytes + static_cast<size_t>(c) * elem;
    for (int k = 0; k < CC; ++k)
      LoadPair<T>(row + static_cast<size_t>(32 * k) * elem, v[2 * k], v[2 * k + 1]);
    for (int g = 0; g < G; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g][t]);
      for (int k = 0; k < 2 * CC; ++k) a[g][k] = _mm512_fmadd_ps(pg, v[k], a[g][k]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int k = 0; k < 2 * CC; ++k) _mm512_storeu_ps(acc + g * d + c + 16 * k, a[g][k]);
}

// One tile of n <= kTile keys of one KV head (keys: its first K row; the V rows value_offset
// bytes on), for the G query heads whose pair-order queries are qp[G][d]: updates the pair-order
// accumulators acc[G][d], the running max m[G] and the per-lane running sums l[G]; issues pq.
template <DType T, int G>
inline __attribute__((always_inline)) void AttendTile(const std::byte* keys, size_t value_offset,
                                                      int64_t n, size_t row_bytes, int64_t d,
                                                      PrefetchQueue& pq, const float* qp,
                                                      float* acc, float* m, __m512* l) {
  constexpr int R = G <= 4 ? 4 : 2;   // key rows per q . K step
  constexpr int CC = G <= 4 ? 2 : 1;  // 32-element chunks per V step
  alignas(64) __m512 dots[G][kTile];
  alignas(64) float p[G][kTile];
  alignas(64) float corr[16];
  const std::byte* values = keys + value_offset;

  // Scores.
  int64_t t = 0;
  for (; t + R <= n; t += R) ScoreRows<T, G, R>(keys, row_bytes, t, d, qp, dots, pq);
  for (; t < n; ++t) ScoreRows<T, G, 1>(keys, row_bytes, t, d, qp, dots, pq);
  for (int g = 0; g < G; ++g)
    for (int64_t u = n; u < kTile; ++u) dots[g][u] = _mm512_setzero_ps();
  const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1u);

  // Online softmax update: the tile's scores per head, the new running max, the rescale factors
  // exp(old max - new max) of every head in one vector exp (0 on the first tile, where the
  // accumulators are 0), then p = exp(s - max) and the per-lane running sums.
  __m512 s[G];
  alignas(64) float old_max[16] = {}, new_max[16] = {};
  for (int g = 0; g < G; ++g) {
    s[g] = _mm512_mask_mov_ps(_mm512_set1_ps(-__builtin_inff()), valid, TransposeReduce16(dots[g]));
    const float tile_max = _mm512_reduce_max_ps(s[g]);
    old_max[g] = m[g];
    new_max[g] = tile_max > m[g] ? tile_max : m[g];
    m[g] = new_max[g];
  }
  _mm512_store_ps(corr,
                  Avx512Ops::Exp(_mm512_sub_ps(_mm512_load_ps(old_max), _mm512_load_ps(new_max))));
  for (int g = 0; g < G; ++g) {
    const __m512 e = Avx512Ops::Exp(_mm512_sub_ps(s[g], _mm512_set1_ps(new_max[g])));
    _mm512_store_ps(p[g], e);
    l[g] = _mm512_fmadd_ps(l[g], _mm512_set1_ps(corr[g]), e);
  }

  // Values.
  for (int64_t c = 0; c < d; c += 32 * CC) {
    if (c + 32 * CC <= d) {
      AccumulateValues<T, G, CC>(values, row_bytes, n, c, p, corr, d, acc, pq);
    } else {
      AccumulateValues<T, G, 1>(values, row_bytes, n, c, p, corr, d, acc, pq);
    }
  }
  pq.IssueRest();
}

// The tile kernel of AttendHeadsTiled (decode_attention_tiled.h).
struct Avx512Tile {
  static constexpr int kLanes = 16;
  static constexpr int kPrefetchFirst = 2, kPrefetchSpan = 4;  // decode_attention_tiled.h
  using Sum = __m512;
  static Sum ZeroSum() { return _mm512_setzero_ps(); }
  static float ReduceSum(Sum l) { return _mm512_reduce_add_ps(l); }
  template <DType T, int G>
  static void Tile(const std::byte* keys, size_t value_offset, int64_t n, size_t row_bytes,
                   int64_t d, PrefetchQueue& pq, const float* qp, float* acc, float* m, Sum* l) {
    AttendTile<T, G>(keys, value_offset, n, row_bytes, d, pq, qp, acc, m, l);
  }
};

template <DType T>
void AttendGroupTiledG(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                       int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                       float* acc, float* m, float* l) {
  WithGroup(group, [&](auto tag) {
    AttendHeadsTiled<Avx512Tile, T, decltype(tag)::value>(kv, block_table, kv_head, num_kv_heads,
                                                          first, last, q, acc, m, l);
  });
}

}  // namespace

void AttendGroupAvx512(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                       int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                       float* acc, float* m, float* l) {
  if (kv.head_dim % 32 != 0 || kv.head_dim > kMaxTiledHeadDim || kv.value_dim > 0) {
    AttendGroupDispatch<Avx512Ops>(kv, block_table, kv_head, num_kv_heads, first, last, q, group,
                                   acc, m, l);
    return;
  }
  switch (kv.dtype) {
    case DType::kF32:
      return AttendGroupTiledG<DType::kF32>(kv, block_table, kv_head, num_kv_heads, first, last, q,
                                            group, acc, m, l);
    case DType::kBF16:
      return AttendGroupTiledG<DType::kBF16>(kv, block_table, kv_head, num_kv_heads, first, last, q,
                                             group, acc, m, l);
    case DType::kF16:
      return AttendGroupTiledG<DType::kF16>(kv, block_table, kv_head, num_kv_heads, first, last, q,
                                            group, acc, m, l);
  }
}

void ConvertRowAvx512(DType dtype, const float* src, std::byte* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask =
        n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(mask, src + i);
    if (dtype == DType::kF32) {
      _mm512_mask_storeu_ps(reinterpret_cast<float*>(dst) + i, mask, x);
      continue;
    }
    __m256i h;
    if (dtype == DType::kBF16) {
      // Round to nearest even on the upper 16 bits; NaN: keep it, set the quiet bit.
      const __m512i u = _mm512_castps_si512(x);
      const __m512i rounding =
          _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(
          _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
      const __m512i r = _mm512_mask_blend_epi32(nan, _mm512_add_epi32(u, rounding),
                                                _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
      h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
    } else {
      h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(dst) + i, mask, h);
  }
}

}  // namespace decode_attention_internal
}  // namespace moebatch
