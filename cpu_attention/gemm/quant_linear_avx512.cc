// QuantLinear's kernels with AVX-512 F/BW/VL/DQ + VNNI (compiled with those flags only; run where
// CPUID has avx512vnni): two 32-blocks per zmm, which are the model's lanes 0-7 (even block) and
// 8-15 (odd block) of the 16 partial sums. The integer lanes are one vpdpbusd: unsigned u = w +
// bias (Q8_0: q + 128) times signed q, 4 elements per int32 lane, accumulated onto the activations'
// correction -bias·Σq. Bits equal to quant_linear_portable.cc's.
#define MOEBATCH_QUANT_ISA avx512
#include <immintrin.h>

#include "cpu_attention/gemm/quant_linear_internal.h"

namespace moebatch {
namespace quant_linear_internal {
namespace avx512 {
namespace {

constexpr int kPairs = kGroupBlocks / 2;

// --- Whole groups, two blocks per zmm ---------------------------------------------------------
// The shared 256-bit unpacking (quant_linear_internal.h) makes each block in a ymm and joins them
// with lane inserts, on port 5, which the 512-bit dot products also need (the 512-bit units are
// ports 0 and 5 only). A whole group (every group of a K-quant row, all but a row's last group of
// 32-blocks) is unpacked here instead with broadcast loads, masked merges and shifts, and mask
// registers.

// Two blocks of nibble pairs (16 bytes each) to 64 values: block 0's low nibbles, its high
// nibbles, block 1's low, its high (Nibbles twice, side by side).
inline __m512i NibblePair(const uint8_t* qs0, const uint8_t* qs1) {
  __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0)));
  z = _mm512_mask_broadcast_i32x4(z, 0xFF00,
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)));
  z = _mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4);  // 128-bit lanes 1 and 3: the high nibbles
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

// w + 16 on the elements whose bit is set in the 32 bits at qh0 (block 0) and qh1 (block 1).
inline __m512i AddFifthBits(__m512i w, const uint8_t* qh0, const uint8_t* qh1) {
  const uint64_t bits = LoadU32(qh0) | uint64_t{LoadU32(qh1)} << 32;
  return _mm512_mask_add_epi8(w, _cvtu64_mask64(bits), w, _mm512_set1_epi8(16));
}

// 32 bytes of nibble pairs (Q4_K / Q5_K) to 64 values: the low nibbles, then the high.
inline __m512i NibbleHalves(const uint8_t* qs) {
  __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)));
  z = _mm512_mask_srli_epi16(z, 0xFFFF0000u, z, 4);
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

// FullGroup<T>::Group(b, w, scales, c): the group at b: the 4 block pairs, the scales (per block in
// lanes 0-7, or, kPer16, per 16 elements in lanes 0-15) and c (types with c).
template <GgmlType T>
struct FullGroup;

template <int kBytes, int kQs, int kQh, GgmlType T>
struct NibbleGroup {  // Q4_0, Q4_1, Q5_0, Q5_1, MXFP4: nibbles at kQs, fifth bits at kQh (or -1)
  static void Pairs(const uint8_t* b, __m512i* w) {
    for (int p = 0; p < kPairs; ++p) {
      const uint8_t* b0 = b + 2 * p * kBytes;
      const uint8_t* b1 = b0 + kBytes;
      w[p] = NibblePair(b0 + kQs, b1 + kQs);
      if constexpr (kQh >= 0) w[p] = AddFifthBits(w[p], b0 + kQh, b1 + kQh);
      if constexpr (T == GgmlType::kMXFP4) {
        w[p] = _mm512_shuffle_epi8(_mm512_broadcast_i64x4(Mxfp4Table()), w[p]);
      }
    }
  }
};

template <>
struct FullGroup<GgmlType::kQ4_0> {
  static void Group(const uint8_t* b, __m512i* w, __m512* scales, __m256* c) {
    NibbleGroup<18, 2, -1, GgmlType::kQ4_0>::Pairs(b, w);
    *scales = _mm512_castps256_ps512(Halves8<18>(b, kGroupBlocks));
  }
};

template <>
struct FullGroup<GgmlType::kQ4_1> {
  static void Group(const uint8_t* b, __m512i* w, __m512* scales, __m256* c) {
    NibbleGroup<20, 4, -1, GgmlType::kQ4_1>::Pairs(b, w);
    *scales = _mm512_castps256_ps512(Halves8<20>(b, kGroupBlocks));
    *c = Halves8<20>(b + 2, kGroupBlocks);
  }
};

template <>
struct FullGroup<GgmlType::kQ5_0> {
  static void Group(const uint8_t* b, __m512i* w, __m512* scales, __m256* c) {
    NibbleGroup<22, 6, 2, GgmlType::kQ5_0>::Pairs(b, w);
    *scales = _mm512_castps256_ps512(Halves8<22>(b, kGroupBlocks));
  }
};

template <>
struct FullGroup<GgmlType::kQ5_1> {
  static void Group(const uint8_t* b, __m512i* w, __m512* scales, __m256* c) {
    NibbleGroup<24, 8, 4, GgmlType::kQ5_1>::Pairs(b, w);
    *scales = _mm512_castps256_ps512(Halves8<24>(b, kGroupBlocks));
    *c = Halves8<24>(b + 2, kGroupBlocks);
  }
};

template <>
struct FullGroup<GgmlType::kMXFP4> {
  static void Group(const uint8_t* b, __m512i* w, __m512* scales, __m256* c) {
    NibbleGroup<17, 1, -1, GgmlType::kMXFP4>::Pairs(b, w);
    *scales = _mm512_castps256_ps512(E8M0Half8<17>(b, kGroupBlocks));
  }
};

template <>
struct FullGroup<GgmlType::kQ8_0> {
  static void Group(const uint8_t* b, __m512i* w, __m512* scales, __m256* c) {
    for (int p = 0; p < kPairs; ++p) {
      const uint8_t* b0 = b + 2 * p * 34;
      const __m512i q = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 34 + 2)), 1);
      w[p] = _mm512_xor_si512(q, _mm512_set1_epi8(static_cast<char>(0x80)));  // q + 128
    }
    *scales = _mm512_castps256_ps512(Halves8<34>(b, kGroupBlocks));
  }
};

struct Acc {
  __m512 a;  // step 2's 16 lanes
  // Step 3 in the low 8 lanes. A zmm so that parking an Acc (Micro) copies two registers: with a
  // ymm, the struct copy went through the stack as a ymm store and a zmm load, which cannot be
  // forwarded (a ~15-cycle stall per row and K slice: it halved the speed at m 64).
  __m512 e;
};

template <GgmlType T>
struct Policy {
  using U = Unpack<T, false>;
  static constexpr int kBias = U::kBias;
  static constexpr int64_t kGroupBytes = U::kGroupBytes;
  static constexpr bool kHasC = U::kHasC;
  static constexpr int kMR = 8;

  struct DG {
    __m512i w[kPairs];     // blocks 2p (low half) and 2p + 1: u = w + bias
    __m512 scale[kPairs];  // lane l: the scale of the elements of int32 lane l
    __m256 c;
  };
  using Acc = avx512::Acc;

  __attribute__((always_inline)) static void Decode(const uint8_t* row, int64_t g, int nblk,
                                                    DG* dg) {
    __m512 scales;
    if (nblk == kGroupBlocks) {
      FullGroup<T>::Group(row + g * U::kGroupBytes, dg->w, &scales, &dg->c);
    } else {  // the last group of a row of 32-blocks (K-quant rows have whole groups only)
      Unpacked u;
      UnpackGroup<U>(row, g, nblk, &u);
      scales = _mm512_castps256_ps512(u.scale);
      for (int p = 0; p < kPairs; ++p) {
        dg->w[p] = _mm512_inserti64x4(_mm512_castsi256_si512(u.w[2 * p]), u.w[2 * p + 1], 1);
      }
      if constexpr (kHasC) dg->c = u.c;
    }
    for (int p = 0; p < kPairs; ++p) {
      // Lane l takes block 2p + l / 8's scale.
      const __m512i index =
          _mm512_add_epi32(_mm512_set1_epi32(2 * p),
                           _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
      dg->scale[p] = _mm512_permutexvar_ps(index, scales);
    }
  }

  static Acc Zero() { return Acc{_mm512_setzero_ps(), _mm512_setzero_ps()}; }

  // Steps 1-2 for blocks 2p and 2p + 1. For an odd count the second is padding: weights, scale,
  // activations and d all 0, so its lanes get fma(0, 0, a) = a.
  __attribute__((always_inline)) static void Pair(__m512* a, const DG& dg, int p, const XRow& x) {
    const __m512i q = _mm512_loadu_si512(x.q + p * 2 * kBlock);
    __m512i sum = kBias != 0 ? _mm512_loadu_si512(x.corr + p * 16) : _mm512_setzero_si512();
    sum = _mm512_dpbusd_epi32(sum, dg.w[p], q);
    const __m512 s = _mm512_mul_ps(dg.scale[p], _mm512_loadu_ps(x.d8 + p * 16));
    *a = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(sum), *a);
  }

  template <bool kFull, int MR>
  __attribute__((always_inline)) static void Accumulate(Acc* acc, const DG& dg, int nblk,
                                                        const XRow* x) {
    RowAfterRow<Policy, kFull, MR>(acc, dg, nblk, x);
  }

  template <bool kFull>
  __attribute__((always_inline)) static void AccumulateRow(Acc* acc, const DG& dg, int nblk,
                                                           const XRow& x) {
    const int pairs = kFull ? kPairs : (nblk + 1) / 2;
    for (int p = 0; p < pairs; ++p) Pair(&acc->a, dg, p, x);
    // The missing blocks of a short group have c = 0 and s = 0: adding 0 · 0 changes nothing.
    if constexpr (kHasC) {
      acc->e = _mm512_castps256_ps512(
          _mm256_fmadd_ps(dg.c, _mm256_loadu_ps(x.s), _mm512_castps512_ps256(acc->e)));
    }
  }

  static float Finish(const Acc& acc) {
    const float a =
        TreeSum8(_mm256_add_ps(_mm512_castps512_ps256(acc.a), _mm512_extractf32x8_ps(acc.a, 1)));
    if constexpr (kHasC) return a + TreeSum8(_mm512_castps512_ps256(acc.e));
    return a;
  }
};

// The K-quant types (quant_linear.h, "K-quants"): two blocks per zmm, in slot order (Q4_K / Q5_K:
// a 64-byte load of nibbles is blocks 4j, 4j + 2 (low nibbles) and 4j + 1, 4j + 3 (high); Q6_K:
// natural). vpmaddubsw (u times q, pairs to int16), plus Q6_K's correction -32·(q + q') per pair,
// then vpdpwssd with the int16 scale of those elements into int32 lanes of 4 elements, two chains;
// the two blocks' lanes are added, so lane l sums elements 4l..4l+3 of every block.
template <GgmlType T>
struct PolicyK {
  static constexpr bool kSuperblock = true;
  using Q = KQuant<T>;
  static constexpr int kBias = Q::kBias;
  static constexpr int64_t kGroupBytes = Q::kGroupBytes;
  static constexpr bool kHasC = Q::kHasC;
  static constexpr bool kPaired = T != GgmlType::kQ6_K;
  static constexpr int kMR = 8;

  struct DG {
    __m512i w[kPairs];   // slots 2p (low 256 bits) and 2p + 1: u
    __m512i sc[kPairs];  // int16 t: the scale of the elements 2t, 2t + 1 of the zmm
    __m128i mins;        // Q4_K / Q5_K: int16 m_b, natural order
    __m128 dmin;         // d, dmin
  };
  using Acc = KAcc;

  __attribute__((always_inline)) static void Decode(const uint8_t* row, int64_t g, int /*nblk*/,
                                                    DG* dg) {
    const uint8_t* b = row + g * kGroupBytes;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    if constexpr (T == GgmlType::kQ6_K) {
      const __m512i top2 = _mm512_set1_epi8(0x30);
      // Per 16-bit lane of the low / high 256 bits: qh's bits 0-1 / 2-3 to bits 4-5 (blocks 4h,
      // 4h + 1), then bits 4-5 / 6-7 (blocks 4h + 2, 4h + 3).
      const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
      const __m512i down = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
      for (int h = 0; h < 2; ++h) {  // 128 elements: ql[64h, 64h + 64), qh[32h, 32h + 32)
        const __m512i ql = _mm512_loadu_si512(b + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
        dg->w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                       _mm512_and_si512(_mm512_sllv_epi16(qh, up), top2));
        dg->w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                           _mm512_and_si512(_mm512_srlv_epi16(qh, down), top2));
      }
      // zmm p holds blocks 2p, 2p + 1: its 128-bit lane k takes scale 4p + k.
      const __m512i sc = _mm512_castsi256_si512(ScalesQ6K(b));
      for (int p = 0; p < kPairs; ++p) {
        const __m512i index = _mm512_add_epi16(
            _mm512_set1_epi16(static_cast<int16_t>(4 * p)),
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_inserti128_si256(
                                   _mm256_setzero_si256(), _mm_set1_epi16(1), 1)),
                               _mm256_inserti128_si256(_mm256_set1_epi16(2), _mm_set1_epi16(3), 1),
                               1));
        dg->sc[p] = _mm512_permutexvar_epi16(index, sc);
      }
      dg->mins = _mm_setzero_si128();
    } else {
      const int qs = T == GgmlType::kQ4_K ? 16 : 48;
      for (int j = 0; j < 2; ++j) {  // 64 bytes: blocks 4j, 4j + 2 (low nibbles), 4j + 1, 4j + 3
        const __m512i z = _mm512_loadu_si512(b + qs + 64 * j);
        dg->w[2 * j] = _mm512_and_si512(z, low4);
        dg->w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
      }
      if constexpr (T == GgmlType::kQ5_K) {
        // Element e of block k takes bit k of qh[e].
        const __m512i qh =
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
        for (int p = 0; p < kPairs; ++p) {
          const int b0 = KSlot(true, 2 * p), b1 = KSlot(true, 2 * p + 1);
          const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << b0)),
                                                 _mm256_set1_epi8(static_cast<char>(1 << b1)), 1);
          dg->w[p] = _mm512_mask_add_epi8(dg->w[p], _mm512_test_epi8_mask(qh, bit), dg->w[p],
                                          _mm512_set1_epi8(16));
        }
      }
      // The 8 int16 scales in every 128-bit lane; zmm p holds the blocks at slots 2p (low 256
      // bits) and 2p + 1: vpshufb picks scale b0 for the low half and b1 for the high.
      const __m512i sc = _mm512_broadcast_i32x4(ScalesK4(b, &dg->mins));
      for (int p = 0; p < kPairs; ++p) {
        const int b0 = KSlot(true, 2 * p), b1 = KSlot(true, 2 * p + 1);
        const __m512i pick = _mm512_inserti64x4(
            _mm512_set1_epi16(static_cast<int16_t>(2 * b0 | (2 * b0 + 1) << 8)),
            _mm256_set1_epi16(static_cast<int16_t>(2 * b1 | (2 * b1 + 1) << 8)), 1);
        dg->sc[p] = _mm512_shuffle_epi8(sc, pick);
      }
    }
    dg->dmin = Q::DMin(b);
  }

  static Acc Zero() { return Acc{_mm256_setzero_ps(), _mm256_setzero_ps()}; }

  __attribute__((always_inline)) static __m512i Pair(__m512i sum, const DG& dg, int p,
                                                     const XRow& x) {
    __m512i p16 = _mm512_maddubs_epi16(dg.w[p], _mm512_loadu_si512(x.q + p * 2 * kBlock));
    if constexpr (kBias != 0)
      p16 = _mm512_add_epi16(p16, _mm512_loadu_si512(x.corr16 + p * kBlock));
    return _mm512_dpwssd_epi32(sum, p16, dg.sc[p]);
  }

  template <bool kFull, int MR>
  __attribute__((always_inline)) static void Accumulate(Acc* acc, const DG& dg, int nblk,
                                                        const XRow* x) {
    RowAfterRow<PolicyK, kFull, MR>(acc, dg, nblk, x);
  }

  template <bool kFull>
  __attribute__((always_inline)) static void AccumulateRow(Acc* acc, const DG& dg, int /*nblk*/,
                                                           const XRow& x) {
    __m512i s0 = Pair(_mm512_setzero_si512(), dg, 0, x);
    __m512i s1 = Pair(_mm512_setzero_si512(), dg, 1, x);
    s0 = Pair(s0, dg, 2, x);
    s1 = Pair(s1, dg, 3, x);
    const __m512i s = _mm512_add_epi32(s0, s1);
    const __m256i lanes =
        _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    KStep<kHasC>(acc, lanes, dg.dmin, dg.mins, x);
  }

  static float Finish(const Acc& acc) { return KFinish<kHasC>(acc); }
};

template <GgmlType T>
Kernel KernelOf() {
  if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K || T == GgmlType::kQ6_K) {
    Kernel k{Tile<PolicyK<T>>, PolicyK<T>::kBias,
             static_cast<int64_t>(sizeof(typename PolicyK<T>::DG))};
    k.superblock = true;
    k.paired_slots = PolicyK<T>::kPaired;
    return k;
  } else {
    return Kernel{Tile<Policy<T>>, Policy<T>::kBias,
                  static_cast<int64_t>(sizeof(typename Policy<T>::DG))};
  }
}

}  // namespace
}  // namespace avx512

Kernel Avx512VnniKernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return avx512::KernelOf<GgmlType::kQ4_0>();
    case GgmlType::kQ4_1:
      return avx512::KernelOf<GgmlType::kQ4_1>();
    case GgmlType::kQ5_0:
      return avx512::KernelOf<GgmlType::kQ5_0>();
    case GgmlType::kQ5_1:
      return avx512::KernelOf<GgmlType::kQ5_1>();
    case GgmlType::kQ8_0:
      return avx512::KernelOf<GgmlType::kQ8_0>();
    case GgmlType::kQ4_K:
      return avx512::KernelOf<GgmlType::kQ4_K>();
    case GgmlType::kQ5_K:
      return avx512::KernelOf<GgmlType::kQ5_K>();
    case GgmlType::kQ6_K:
      return avx512::KernelOf<GgmlType::kQ6_K>();
    case GgmlType::kMXFP4:
      return avx512::KernelOf<GgmlType::kMXFP4>();
    default:
      return Kernel{};
  }
}

}  // namespace quant_linear_internal
}  // namespace moebatch
