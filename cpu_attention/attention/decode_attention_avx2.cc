// The AVX2+FMA+F16C decode attention kernels: a tiled kernel for head_dim % 16 == 0 (below) and,
// for other head dims, decode_attention_internal.h's template with 8-lane f32 vector ops. Compiled
// with -mavx2 -mfma -mf16c (see CMakeLists.txt) and called only when the CPU has them
// (decode_attention.cc). bf16 K/V rows are widened to f32 by a 16-bit shift, f16 rows by vcvtph2ps.
#include <immintrin.h>

#include "cpu_attention/attention/decode_attention_internal.h"
#include "cpu_attention/attention/decode_attention_tiled.h"

namespace moebatch {
namespace decode_attention_internal {
namespace {

struct Avx2Ops {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V LoadF(const float* p) { return _mm256_loadu_ps(p); }
  static void StoreF(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float ReduceAdd(V v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static float ReduceMax(V v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }

  // exp on 8 lanes (Cephes expf polynomial, ~1 ulp); 0 below ln(2^-126), incl. -inf.
  static V Exp(V x) {
    const V lo = _mm256_set1_ps(-87.3365478515625f);
    const V keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3762626647949f));
    const V fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    V y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
  }

  template <DType T>
  static V LoadKv(const std::byte* p) {
    if constexpr (T == DType::kF32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    } else if constexpr (T == DType::kBF16) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    }
  }
};

// --- Tiled kernel for head_dim % 16 == 0 (every real model) ------------------------------------
//
// The AVX-512 kernel's design (decode_attention_avx512.cc) on 8 lanes and 16 registers: bf16 rows
// widened by a shift and a mask into "pair order" (per 16 elements the even ones, then the odd
// ones; the queries and accumulators are kept in that order), q . K for R key rows at once, the
// 8 partial-sum vectors of 8 key rows reduced to one vector of 8 scores by a hadd tree, the online
// softmax on registers (every head's running max in one vector, one vector exp for every head's
// rescale factor), p.V over two query heads x 32 floats at a time (8 accumulators of 16
// registers), and the heads-inner walk with the paced prefetch of decode_attention_tiled.h.
// What limits it is the core, not memory: a key row of Mixtral's 4 heads x 128 is 128 FMAs, 64
// cycles at two FMAs per cycle (AMD Zen 3, Intel alike), plus the loads and widening around
// them. On Zen 3 the two vector load ports and the broadcasts of p are the next limits, hence
// the queries held in registers, each row loaded once, and p.V two heads x 32 floats at a time
// (cycles per key row in docs/performance.md, "AVX2 decode attention on an AMD EPYC").

// 16 elements of type T at p -> two f32 vectors in pair order: for bf16 the even elements then the
// odd ones; for f16 and f32 the first 8 then the next 8. The bf16 row is loaded once: the empty asm
// keeps the compiler from folding a second load of it into the AND (free on Intel, but AMD's two
// vector load ports are what the q . K and p.V loops run short of).
template <DType T>
inline void LoadPair8(const std::byte* p, __m256& lo, __m256& hi) {
  if constexpr (T == DType::kBF16) {
    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    __asm__("" : "+x"(x));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  } else if constexpr (T == DType::kF16) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  } else {
    lo = _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    hi = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8);
  }
}

// r[i] = sum of the 8 lanes of v[i], i = 0..7.
inline __m256 TransposeReduce8(const __m256* v) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 a3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0 = _mm256_hadd_ps(a0, a1);  // [v0..v3 low halves | v0..v3 high halves]
  const __m256 b1 = _mm256_hadd_ps(a2, a3);
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

// r[g] = max of the 8 lanes of v[g] for g < G <= 8 (exact: any order gives the same value);
// lanes >= G: pad's.
template <int G>
inline __m256 TransposeReduceMax(const __m256* v, __m256 pad) {
  // Lane pairs (0, 2) and (1, 3) of each 128-bit half, then the 4 lanes, then the two halves.
  auto pair = [&](int a, int b) {
    const __m256 x = a < G ? v[a] : pad;
    const __m256 y = b < G ? v[b] : pad;
    return _mm256_max_ps(_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y));
  };
  auto quad = [&](int a) {  // heads a..a+3, per half: [a, a+1, a+2, a+3]
    const __m256 x01 = pair(a, a + 1);
    const __m256 x23 = pair(a + 2, a + 3);
    return _mm256_max_ps(_mm256_shuffle_ps(x01, x23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(x01, x23, _MM_SHUFFLE(3, 2, 3, 2)));
  };
  const __m256 q0 = quad(0);
  if constexpr (G <= 4) {
    const __m256 r = _mm256_max_ps(q0, _mm256_permute2f128_ps(q0, q0, 0x01));
    return _mm256_blend_ps(r, pad, 0xf0);
  } else {
    const __m256 q1 = quad(4);
    return _mm256_max_ps(_mm256_permute2f128_ps(q0, q1, 0x20),
                         _mm256_permute2f128_ps(q0, q1, 0x31));
  }
}

// Dot products of R key rows with G queries (pair order), into dots[g][t0 + r]; one prefetch step
// of pq per 32 elements.
template <DType T, int G, int R>
inline void ScoreRows8(const std::byte* keys, size_t row_bytes, int64_t t0, int64_t d,
                       const float* qp, __m256 (*dots)[kTile], PrefetchQueue& pq) {
  constexpr size_t elem = DTypeSize(T);
  __m256 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 16) {
    if ((c & 31) == 0) pq.Step();
    __m256 klo[R], khi[R];
    for (int r = 0; r < R; ++r) {
      LoadPair8<T>(keys + static_cast<size_t>(t0 + r) * row_bytes + static_cast<size_t>(c) * elem,
                   klo[r], khi[r]);
    }
    for (int g = 0; g < G; ++g) {
      // Loaded once for the R rows (the asm keeps them out of the FMAs' memory operands, which
      // would load each R times).
      __m256 qlo = _mm256_loadu_ps(qp + g * d + c);
      __m256 qhi = _mm256_loadu_ps(qp + g * d + c + 8);
      if constexpr (R > 1) __asm__("" : "+x"(qlo), "+x"(qhi));
      for (int r = 0; r < R; ++r) {
        acc[r][g] = _mm256_fmadd_ps(qlo, klo[r], acc[r][g]);
        acc[r][g] = _mm256_fmadd_ps(qhi, khi[r], acc[r][g]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) dots[g][t0 + r] = acc[r][g];
}

// acc[g][c..c+16W) (pair order) = acc * corr[g] + sum_t p[g][t] V_t over the tile's n rows, for
// GH query heads and W/2 pairs of 8-float vectors per head (GH * W <= 8 accumulators); one
// prefetch step of pq per row when Issue. With W = 4 a broadcast of p feeds 4 FMAs (2 with
// W = 2): broadcasts share the load ports with the V rows. Each accumulator sums its terms in the
// same order whatever GH and W are, so every choice gives the same bits.
template <DType T, int GH, int W, bool Issue>
inline void AccumulateValues8(const std::byte* values, size_t row_bytes, int64_t n, int64_t c,
                              const float (*p)[kTile], const float* corr, int64_t d, float* acc,
                              PrefetchQueue& pq) {
  static_assert(W == 2 || W == 4, "W: 16 or 32 floats per head");
  constexpr size_t elem = DTypeSize(T);
  __m256 a[GH][W];
  for (int g = 0; g < GH; ++g) {
    const __m256 cg = _mm256_set1_ps(corr[g]);
    for (int w = 0; w < W; ++w)
      a[g][w] = _mm256_mul_ps(_mm256_loadu_ps(acc + g * d + c + 8 * w), cg);
  }
  for (int64_t t = 0; t < n; ++t) {
    if constexpr (Issue) pq.Step();
    const std::byte* row =
        values + static_cast<size_t>(t) * row_bytes + static_cast<size_t>(c) * elem;
    __m256 v[W];
    LoadPair8<T>(row, v[0], v[1]);
    if constexpr (W == 4) LoadPair8<T>(row + 16 * elem, v[2], v[3]);
    for (int g = 0; g < GH; ++g) {
      const __m256 pg = _mm256_set1_ps(p[g][t]);
      for (int w = 0; w < W; ++w) a[g][w] = _mm256_fmadd_ps(pg, v[w], a[g][w]);
    }
  }
  for (int g = 0; g < GH; ++g) {
    for (int w = 0; w < W; ++w) _mm256_storeu_ps(acc + g * d + c + 8 * w, a[g][w]);
  }
}

// p.V of one tile for G query heads: pairs of heads over 32 floats at a time where the head dim
// allows (a last odd head alone), else up to 4 heads over 16 floats; one prefetch step per row of
// each 32 floats' first pass.
template <DType T, int G>
inline void AccumulateTileValues8(const std::byte* values, size_t row_bytes, int64_t n,
                                  const float (*p)[kTile], const float* corr, int64_t d, float* acc,
                                  PrefetchQueue& pq) {
  if (d % 32 == 0) {
    constexpr int first = G >= 2 ? 2 : 1;  // heads of the pass that issues the prefetch steps
    for (int64_t c = 0; c < d; c += 32) {
      AccumulateValues8<T, first, 4, true>(values, row_bytes, n, c, p, corr, d, acc, pq);
      for (int g = first; g + 2 <= G; g += 2) {
        AccumulateValues8<T, 2, 4, false>(values, row_bytes, n, c, p + g, corr + g, d, acc + g * d,
                                          pq);
      }
      if constexpr (G >= 2 && G % 2 == 1) {
        AccumulateValues8<T, 1, 4, false>(values, row_bytes, n, c, p + G - 1, corr + G - 1, d,
                                          acc + (G - 1) * d, pq);
      }
    }
    return;
  }
  for (int64_t c = 0; c < d; c += 16) {
    const bool issue = (c & 31) == 0;
    constexpr int first = G < 4 ? G : 4;
    if (issue) {
      AccumulateValues8<T, first, 2, true>(values, row_bytes, n, c, p, corr, d, acc, pq);
    } else {
      AccumulateValues8<T, first, 2, false>(values, row_bytes, n, c, p, corr, d, acc, pq);
    }
    if constexpr (G > 4) {
      AccumulateValues8<T, G - 4, 2, false>(values, row_bytes, n, c, p + 4, corr + 4, d,
                                            acc + 4 * d, pq);
    }
  }
}

// The tile kernel of AttendHeadsTiled (decode_attention_tiled.h).
struct Avx2Tile {
  static constexpr int kLanes = 8;
  // The whole next head-tile (decode_attention_tiled.h). Zen 3, 1 thread, 256x512 from memory,
  // alternated runs: 9.3-13.9 GB/s (13.6-13.9 in quiet rounds) against 7.7-12.2 (11.7-12.1) with
  // (2, 4): its 32 KiB L1d holds the current and the next head-tile (16 KiB) but not the five
  // head-tiles in flight of (2, 4), which evict each other's prefetched lines before use
  // (docs/performance.md).
  static constexpr int kPrefetchFirst = 1, kPrefetchSpan = 1;
  using Sum = __m256;
  static Sum ZeroSum() { return _mm256_setzero_ps(); }
  static float ReduceSum(Sum l) { return Avx2Ops::ReduceAdd(l); }
  // One tile of n <= kTile keys of one KV head for G query heads (see decode_attention_tiled.h).
  template <DType T, int G>
  static void Tile(const std::byte* keys, size_t value_offset, int64_t n, size_t row_bytes,
                   int64_t d, PrefetchQueue& pq, const float* qp, float* acc, float* m, Sum* l) {
    constexpr int R = G == 1 ? 4 : (G <= 4 ? 2 : 1);  // key rows per q . K step (16 registers)
    alignas(32) __m256 dots[G][kTile];
    alignas(32) float p[G][kTile];
    alignas(32) float corr[8];
    const std::byte* values = keys + value_offset;

    // Scores.
    int64_t t = 0;
    for (; t + R <= n; t += R) ScoreRows8<T, G, R>(keys, row_bytes, t, d, qp, dots, pq);
    for (; t < n; ++t) ScoreRows8<T, G, 1>(keys, row_bytes, t, d, qp, dots, pq);
    for (int g = 0; g < G; ++g)
      for (int64_t u = n; u < kTile; ++u) dots[g][u] = _mm256_setzero_ps();
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 valid_lo =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane));
    const __m256 valid_hi =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n) - 8), lane));
    const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());

    // Online softmax update (as in the AVX-512 kernel), every head's running max in one vector
    // (lane g: head g), so that no value makes a trip through memory between the scores and the
    // exps.
    __m256 s_lo[G], s_hi[G], tile_max[G];
    for (int g = 0; g < G; ++g) {
      s_lo[g] = _mm256_blendv_ps(neg_inf, TransposeReduce8(dots[g]), valid_lo);
      s_hi[g] = _mm256_blendv_ps(neg_inf, TransposeReduce8(dots[g] + 8), valid_hi);
      tile_max[g] = _mm256_max_ps(s_lo[g], s_hi[g]);
    }
    const __m256i heads = _mm256_cmpgt_epi32(_mm256_set1_epi32(G), lane);
    const __m256 old_max = _mm256_maskload_ps(m, heads);  // lanes >= G: 0
    // new = tile > old ? tile : old per head; lanes >= G: max(-inf, 0) = 0, so their corr is 1.
    const __m256 new_max = _mm256_max_ps(TransposeReduceMax<G>(tile_max, neg_inf), old_max);
    _mm256_maskstore_ps(m, heads, new_max);
    const __m256 corr_v = Avx2Ops::Exp(_mm256_sub_ps(old_max, new_max));
    _mm256_store_ps(corr, corr_v);
    for (int g = 0; g < G; ++g) {
      const __m256i at = _mm256_set1_epi32(g);
      const __m256 mx = _mm256_permutevar8x32_ps(new_max, at);
      const __m256 e_lo = Avx2Ops::Exp(_mm256_sub_ps(s_lo[g], mx));
      const __m256 e_hi = Avx2Ops::Exp(_mm256_sub_ps(s_hi[g], mx));
      _mm256_store_ps(p[g], e_lo);
      _mm256_store_ps(p[g] + 8, e_hi);
      l[g] = _mm256_add_ps(_mm256_fmadd_ps(l[g], _mm256_permutevar8x32_ps(corr_v, at), e_lo), e_hi);
    }

    // Values.
    AccumulateTileValues8<T, G>(values, row_bytes, n, p, corr, d, acc, pq);
    pq.IssueRest();
  }
};

template <DType T>
void AttendGroupTiled8(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                       int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                       float* acc, float* m, float* l) {
  WithGroup(group, [&](auto tag) {
    AttendHeadsTiled<Avx2Tile, T, decltype(tag)::value>(kv, block_table, kv_head, num_kv_heads,
                                                        first, last, q, acc, m, l);
  });
}

}  // namespace

void AttendGroupAvx2(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                     int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                     float* acc, float* m, float* l) {
  if (kv.head_dim % 16 != 0 || kv.head_dim > kMaxTiledHeadDim || kv.value_dim > 0) {
    AttendGroupDispatch<Avx2Ops>(kv, block_table, kv_head, num_kv_heads, first, last, q, group, acc,
                                 m, l);
    return;
  }
  switch (kv.dtype) {
    case DType::kF32:
      return AttendGroupTiled8<DType::kF32>(kv, block_table, kv_head, num_kv_heads, first, last, q,
                                            group, acc, m, l);
    case DType::kBF16:
      return AttendGroupTiled8<DType::kBF16>(kv, block_table, kv_head, num_kv_heads, first, last, q,
                                             group, acc, m, l);
    case DType::kF16:
      return AttendGroupTiled8<DType::kF16>(kv, block_table, kv_head, num_kv_heads, first, last, q,
                                            group, acc, m, l);
  }
}

void ConvertRowAvx2(DType dtype, const float* src, std::byte* dst, int64_t n) {
  const size_t elem = DTypeSize(dtype);
  for (int64_t i = 0; i < n; i += 8) {
    // The last partial vector goes through zero-padded buffers.
    alignas(32) float in[8] = {};
    alignas(32) uint16_t out[8];
    const int64_t count = n - i >= 8 ? 8 : n - i;
    const float* x_src = src + i;
    if (count < 8) {
      __builtin_memcpy(in, src + i, static_cast<size_t>(count) * sizeof(float));
      x_src = in;
    }
    const __m256 x = _mm256_loadu_ps(x_src);
    std::byte* d = dst + static_cast<size_t>(i) * elem;
    if (dtype == DType::kF32) {
      __builtin_memcpy(d, x_src, static_cast<size_t>(count) * sizeof(float));
      continue;
    }
    __m128i h;
    if (dtype == DType::kBF16) {
      // Round to nearest even on the upper 16 bits; NaN: keep it, set the quiet bit.
      const __m256i u = _mm256_castps_si256(x);
      const __m256i rounding =
          _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                           _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                             _mm256_set1_epi32(0x7f800000));
      const __m256i r = _mm256_srli_epi32(
          _mm256_blendv_epi8(_mm256_add_epi32(u, rounding),
                             _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan),
          16);
      h = _mm256_castsi256_si128(
          _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), _MM_SHUFFLE(2, 0, 2, 0)));
    } else {
      h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    if (count == 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d), h);
    } else {
      _mm_store_si128(reinterpret_cast<__m128i*>(out), h);
      __builtin_memcpy(d, out, static_cast<size_t>(count) * sizeof(uint16_t));
    }
  }
}

}  // namespace decode_attention_internal
}  // namespace moebatch
