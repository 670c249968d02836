// The AVX2+FMA+F16C decode attention kernel: decode_attention_internal.h's template with 8-lane
// f32 vector ops. Compiled with -mavx2 -mfma -mf16c (see CMakeLists.txt) and called only when the
// CPU has them (decode_attention.cc). bf16 K/V rows are widened to f32 by a 16-bit shift, f16 rows
// by vcvtph2ps.
#include <immintrin.h>

#include "cpu_attention/decode_attention_internal.h"

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

}  // namespace

void AttendGroupAvx2(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                     int num_kv_heads, int64_t first, int64_t last, const float* q, int group,
                     float* acc, float* m, float* l) {
  AttendGroupDispatch<Avx2Ops>(kv, block_table, kv_head, num_kv_heads, first, last, q, group, acc,
                               m, l);
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
