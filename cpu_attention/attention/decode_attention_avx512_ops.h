// AVX-512 vector primitives of decode_attention_avx512.cc. Include only from files compiled with
// the AVX-512 flags (see CMakeLists.txt). Everything here has internal linkage (anonymous
// namespace), so no AVX-512 code can be picked by the linker for a file that runs on an AVX2-only
// host.
#pragma once

#include <immintrin.h>

#include "cpu_attention/attention/decode_attention_internal.h"

namespace moebatch {
namespace decode_attention_internal {
namespace {

struct Avx512Ops {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V LoadF(const float* p) { return _mm512_loadu_ps(p); }
  static void StoreF(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }

  // exp on 16 lanes (Cephes expf polynomial, ~1 ulp); 0 below ln(2^-126), incl. -inf.
  static V Exp(V x) {
    const V lo = _mm512_set1_ps(-87.3365478515625f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3762626647949f));
    const V fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    V y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(e));
  }

  template <DType T>
  static V LoadKv(const std::byte* p) {
    if constexpr (T == DType::kF32) {
      return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    } else if constexpr (T == DType::kBF16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    }
  }
};

// 32 elements of type T at p -> two f32 vectors in "pair order": for bf16 the even elements then
// the odd ones; for f16 and f32 the first 16 then the next 16.
template <DType T>
inline void LoadPair(const std::byte* p, __m512& lo, __m512& hi) {
  if constexpr (T == DType::kBF16) {
    const __m512i x = _mm512_loadu_si512(p);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else if constexpr (T == DType::kF16) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  } else {
    lo = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    hi = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + 16);
  }
}

}  // namespace
}  // namespace decode_attention_internal
}  // namespace moebatch
