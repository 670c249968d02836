// Between quant_linear.cc (checks, activation quantization, work split; compiled for baseline
// x86-64) and the per-ISA kernel files quant_linear_{portable,avx2,avx512}.cc: the quantized
// activations, the kernel table, and Tile, the loops every ISA shares, written once over a per-ISA,
// per-type policy K (quant_linear.h gives the arithmetic every policy follows).
//
// A policy K is a struct in an unnamed namespace of its ISA's file (so each file's instantiations
// of these templates are its own, compiled with its own flags) with:
//   DG      one group of 8 unpacked weight blocks (256 elements), in the ISA's registers' layout;
//   Acc     the partial sums of one output element (quant_linear.h steps 2-3);
//   kMR     rows of x one Micro call keeps in registers;
//   kBias   the Kernel's bias (the activations' correction: XRow::corr is null when 0);
//   kGroupBytes  packed bytes of a whole group (8 blocks);
//   static void Decode(const uint8_t* row, int64_t g, int nblk, DG*): unpacks blocks [8g, 8g+nblk)
//           of a weight row (nblk < 8 only in the last group of a row of 32-blocks); the blocks
//           of a group past nblk must get finite scales and c = 0 (their activations are zero);
//   static Acc Zero();
//   template <bool kFull> static void Accumulate(Acc*, const DG&, int nblk, const XRow&): steps
//           1-3 for the group's blocks into *Acc; kFull: nblk is 8;
//   static float Finish(const Acc&)  (step 4).
#pragma once

#if defined(MOEBATCH_QUANT_ISA)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/model/ggml_type.h"

namespace moebatch {
namespace quant_linear_internal {

constexpr int64_t kBlock = 32;       // elements per block of the unified view (and of x's int8)
constexpr int64_t kGroupBlocks = 8;  // blocks per group: a K-quant super-block
constexpr int64_t kGroup = kBlock * kGroupBlocks;

// One group (256 elements) of one activation row quantized to int8 in blocks of 32
// (quant_linear.cc's QuantizeRows), block i of the group:
struct alignas(64) XGroup {
  int8_t q[kGroup];            // the int8 values
  float d8[kGroupBlocks * 8];  // d_i, 8 copies at [8i, 8i + 8)
  // At [8i + l]: -bias · Σ of q over elements 4l..4l+3 of block i (Kernel::bias).
  int32_t corr[kGroupBlocks * 8];
  float s[kGroupBlocks];  // s_i = d_i · float(Σ q) (step 3)
  char pad[32];           // to whole 64-byte lines
};
static_assert(sizeof(XGroup) % 64 == 0, "XGroup fills whole cache lines");

// The activations, group-major: the record of row r, group g is x[g · stride + r], so the rows a
// kernel runs together lie in consecutive lines (row-major arrays put rows a multiple of 4 KiB
// apart for K a multiple of 1024: the same L1 sets, which they would evict from each other), and
// stride >= m is chosen so that the groups of a K slice do not start on the same L1 sets either
// (GroupStride). Each row is padded with zero blocks to `groups` whole groups.
struct QuantizedRows {
  int64_t blocks = 0;  // k / 32
  int64_t groups = 0;  // ceil(blocks / 8)
  int64_t stride = 0;  // records from one group of a row to the next
  const XGroup* x = nullptr;
};

// The least stride >= rows whose records do not start within 8 lines of a multiple of 4 KiB
// (64 lines) from each other: 64 rows of 13-line records would be exactly 13 pages apart, and the
// 4 groups of a K slice would evict each other from L1 (20% slower at m 64).
inline constexpr int64_t GroupStride(int64_t rows) {
  constexpr int64_t kLines = sizeof(XGroup) / 64;
  int64_t stride = rows;
  while ((stride * kLines) % 64 < 8 || (stride * kLines) % 64 > 56) ++stride;
  return stride;
}

// One row's arrays at group g. (RowAt and BlocksInGroup are templates over the policy so that each
// ISA's file gets its own copy, compiled with its flags: an inline function the linker could take
// from the AVX-512 file would run in the portable path.)
struct XRow {
  const int8_t* q;
  const float* d8;
  const float* s;
  const int32_t* corr;  // null when the policy's bias is 0
};

template <class K>
XRow RowAt(const QuantizedRows& xq, int64_t r, int64_t g) {
  const XGroup& x = xq.x[g * xq.stride + r];
  return XRow{x.q, x.d8, x.s, K::kBias != 0 ? x.corr : nullptr};
}

// y[m0:m1, n0:n1] of y [*, ldy] from x's rows m0..m1 and W's rows n0..n1 (row_bytes apart).
using TileFn = void (*)(const QuantizedRows& xq, int64_t m0, int64_t m1, const std::byte* w,
                        int64_t row_bytes, int64_t n0, int64_t n1, float* y, int64_t ldy);

// An ISA's kernel for one type.
struct Kernel {
  TileFn tile = nullptr;
  // The vector kernels multiply unsigned weights u = w + bias with signed q and add
  // corr = -bias · Σ q per lane (exact integers either way); 0: no correction.
  int bias = 0;
  int64_t decoded_group_bytes = 0;  // sizeof(DG): sizes the tiles of unpacked weights
};

// nullptr tile for a type the ISA has no kernel for (never for QuantLinearSupports' types).
Kernel PortableKernel(GgmlType type);
Kernel Avx2Kernel(GgmlType type);        // quant_linear_avx2.cc: AVX2 + FMA + F16C
Kernel Avx512VnniKernel(GgmlType type);  // quant_linear_avx512.cc: AVX-512 F/BW/VL + VNNI

// Tiles with at most this many rows of x stream their weights: each weight row is read and
// unpacked group by group while every row of x uses the group.
constexpr int64_t kStreamRows = 8;
// Streaming, the weights are prefetched this many groups ahead (1.7-3.3 KiB). The hardware
// prefetchers alone leave a decode-sized call latency-bound: one core streamed Q4_0 from memory
// at 6.5 GB/s without, 11 GB/s with (its speed on weights in cache).
constexpr int64_t kPrefetchGroups = 12;
// Groups per K slice of the unpacked path: a slice of kMR rows of x (4 XGroups, 3.25 KiB a row;
// 26 KiB for 8 rows) stays in L1 while every unpacked weight row of the tile passes over it.
constexpr int64_t kSliceGroups = 4;

template <class K>
int BlocksInGroup(const QuantizedRows& xq, int64_t g) {
  return static_cast<int>(std::min<int64_t>(kGroupBlocks, xq.blocks - g * kGroupBlocks));
}

// Steps 1-3 for MR rows of x (from row r0) and one weight row over groups [g0, g1): the weight row
// packed at wrow (kPacked: unpacked here, group by group) or unpacked at drow (indexed by group).
// The partial sums start at zero (first, or no park) or from park[0..MR) and end in park (!last)
// or, finished, in y[r · ldy], r < MR. Parking is exact, so a K-sliced element gets the bits of a
// whole one.
template <class K, int MR, bool kPacked>
void Micro(const QuantizedRows& xq, int64_t r0, const uint8_t* wrow, const typename K::DG* drow,
           int64_t g0, int64_t g1, typename K::Acc* park, bool first, bool last, float* y,
           int64_t ldy) {
  // The loops over r are unrolled so that acc stays in registers (a loop would keep it in memory).
  typename K::Acc acc[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r] = first || park == nullptr ? K::Zero() : park[r];
  for (int64_t g = g0; g < g1; ++g) {
    const int nblk = BlocksInGroup<K>(xq, g);
    const typename K::DG* dg;
    typename K::DG local;
    if constexpr (kPacked) {
      // Past the row's end this touches the next rows of the tile (or nothing: prefetches never
      // fault).
      const uint8_t* ahead = wrow + (g + kPrefetchGroups) * K::kGroupBytes;
      for (int64_t line = 0; line < K::kGroupBytes; line += 64) __builtin_prefetch(ahead + line);
      K::Decode(wrow, g, nblk, &local);
      dg = &local;
    } else {
      dg = drow + g;
    }
    if (nblk == kGroupBlocks) {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        K::template Accumulate<true>(&acc[r], *dg, nblk, RowAt<K>(xq, r0 + r, g));
      }
    } else {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        K::template Accumulate<false>(&acc[r], *dg, nblk, RowAt<K>(xq, r0 + r, g));
      }
    }
  }
  if (!last && park != nullptr) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) park[r] = acc[r];
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) y[r * ldy] = K::Finish(acc[r]);
}

// Micro<K, mr, kPacked> for 1 <= mr <= K::kMR.
template <class K, bool kPacked, int MR = K::kMR, class... Args>
inline void MicroRows(int mr, Args... args) {
  if constexpr (MR > 1) {
    if (mr < MR) return MicroRows<K, kPacked, MR - 1>(mr, args...);
  }
  Micro<K, MR, kPacked>(args...);
}

// The TileFn of policy K.
template <class K>
void Tile(const QuantizedRows& xq, int64_t m0, int64_t m1, const std::byte* w, int64_t row_bytes,
          int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const int64_t groups = xq.groups;
  if (m1 - m0 <= kStreamRows) {
    // Decode-sized: each weight row streams once per kMR rows of x (once for m <= kMR; again from
    // L1/L2, a few KiB later, for the next kMR rows).
    for (int64_t c = n0; c < n1; ++c) {
      for (int64_t r = m0; r < m1; r += K::kMR) {
        const int mr = static_cast<int>(std::min<int64_t>(K::kMR, m1 - r));
        MicroRows<K, true>(
            mr, xq, r, wb + c * row_bytes, static_cast<const typename K::DG*>(nullptr), int64_t{0},
            groups, static_cast<typename K::Acc*>(nullptr), true, true, y + r * ldy + c, ldy);
      }
    }
    return;
  }
  // Prefill-sized: unpack the tile's weight rows once (the dispatcher sizes the tile for L2), then
  // for each kMR rows of x, K slice by K slice, run every weight row over the slice.
  const int64_t cols = n1 - n0;
  thread_local std::vector<typename K::DG> unpacked;
  thread_local std::vector<typename K::Acc> park;
  unpacked.resize(static_cast<size_t>(cols * groups));
  park.resize(static_cast<size_t>(cols * K::kMR));
  for (int64_t c = 0; c < cols; ++c) {
    const uint8_t* row = wb + (n0 + c) * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      K::Decode(row, g, BlocksInGroup<K>(xq, g), &unpacked[static_cast<size_t>(c * groups + g)]);
    }
  }
  for (int64_t r = m0; r < m1; r += K::kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(K::kMR, m1 - r));
    for (int64_t s0 = 0; s0 < groups; s0 += kSliceGroups) {
      const int64_t s1 = std::min(groups, s0 + kSliceGroups);
      for (int64_t c = 0; c < cols; ++c) {
        MicroRows<K, false>(mr, xq, r, static_cast<const uint8_t*>(nullptr),
                            unpacked.data() + c * groups, s0, s1, park.data() + c * K::kMR, s0 == 0,
                            s1 == groups, y + r * ldy + n0 + c, ldy);
      }
    }
  }
}

// --- The vector files' unpacking (compiled only in them) ---------------------------------------
// quant_linear_{avx2,avx512}.cc define MOEBATCH_QUANT_ISA (their namespace) before including this
// file, so each gets its own copy of these inline functions, built with its own flags.
#if defined(MOEBATCH_QUANT_ISA)
namespace MOEBATCH_QUANT_ISA {

// One group of weights unpacked into 256-bit vectors, the vector files' common form.
struct Unpacked {
  // Block i's 32 weights u = w + bias as unsigned bytes (signed w with kSigned8 for Q8_0); zero for
  // i >= nblk.
  __m256i w[kGroupBlocks];
  // kPer16 (Q6_K): lane j of scale[j / 8] is the scale of elements [16j, 16j + 16). Otherwise lane
  // i of scale[0] is block i's scale (and scale[1] is unused). Finite for i >= nblk.
  __m256 scale[2];
  __m256 c;  // lane i: block i's c (types with c), zero for i >= nblk
};

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 32-bit words at p + i·kStride, i < 8 (one gather; each read stays inside block i).
template <int kStride>
inline __m256i Words8(const uint8_t* p) {
  const __m256i index = _mm256_setr_epi32(0, kStride, 2 * kStride, 3 * kStride, 4 * kStride,
                                          5 * kStride, 6 * kStride, 7 * kStride);
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), index, 1);
}

// The low 16 bits of each 32-bit lane, packed into 8 words.
inline __m128i LowWords(__m256i v) {
  const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0,
                                        1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08));
}

// The n <= 8 f16 values at p, p + kStride, ... widened to f32, zeros after them.
template <int kStride>
inline __m256 Halves8(const uint8_t* p, int n) {
  if (n == kGroupBlocks) return _mm256_cvtph_ps(LowWords(Words8<kStride>(p)));
  alignas(16) uint16_t v[kGroupBlocks] = {};
  for (int i = 0; i < n; ++i) v[i] = LoadU16(p + i * kStride);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(v)));
}

// 16 bytes of nibble pairs (ggml's Q4_0 / Q4_1 / Q5 / MXFP4 order) to 32 values: the low nibbles
// are elements 0..15, the high nibbles elements 16..31.
inline __m256i Nibbles(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

// The 32 bits at p (little-endian; Q5_0 / Q5_1 qh) to 32 bytes: 16 where bit e is set, else 0.
inline __m256i FifthBits(const uint8_t* p) {
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(LoadU32(p))),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(16));
}

// Bit `b` of every byte of v moved to bit 4 (other bits cleared); b a constant.
template <int b>
inline __m256i BitTo4(__m256i v) {
  if constexpr (b <= 4) {
    return _mm256_and_si256(_mm256_slli_epi16(v, 4 - b), _mm256_set1_epi8(16));
  } else {
    return _mm256_and_si256(_mm256_srli_epi16(v, b - 4), _mm256_set1_epi8(16));
  }
}

// The 8 6-bit scales and mins of a Q4_K / Q5_K super-block (scales[12], ggml's get_scale_min_k4)
// as 32-bit lanes.
inline void ScalesMinsK4(const uint8_t* s, __m256i* sc, __m256i* mn) {
  const uint32_t u0 = LoadU32(s), u1 = LoadU32(s + 4), u2 = LoadU32(s + 8);
  const uint32_t sc_lo = u0 & 0x3F3F3F3Fu, mn_lo = u1 & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4);
  *sc =
      _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc_lo | uint64_t{sc_hi} << 32)));
  *mn =
      _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn_lo | uint64_t{mn_hi} << 32)));
}

// 2^(e - 128) for 8 E8M0 exponents in 32-bit lanes (ggml's GGML_E8M0_TO_FP32_HALF: a subnormal
// for e < 2).
inline __m256 E8M0Half(__m256i e) {
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  const __m256i is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny));
}

// E8M0Half of the n <= 8 bytes at p, p + kStride, ..., then 2^-128 for the missing ones.
template <int kStride>
inline __m256 E8M0Half8(const uint8_t* p, int n) {
  if (n == kGroupBlocks) {
    return E8M0Half(_mm256_and_si256(Words8<kStride>(p), _mm256_set1_epi32(0xFF)));
  }
  alignas(32) int32_t v[kGroupBlocks] = {};
  for (int i = 0; i < n; ++i) v[i] = p[i * kStride];
  return E8M0Half(_mm256_load_si256(reinterpret_cast<const __m256i*>(v)));
}

// Blocks [8g, 8g + nblk) of a row of 32-element blocks of kBytes bytes: u->w[i] = block(b_i) with
// b_i the block's first byte; zeros for the missing blocks.
template <int kBytes, class F>
__attribute__((always_inline)) inline void Blocks32(const uint8_t* row, int64_t g, int nblk,
                                                    Unpacked* u, F block) {
  const uint8_t* b = row + g * kGroupBlocks * kBytes;
  if (nblk == kGroupBlocks) {
    for (int i = 0; i < kGroupBlocks; ++i) u->w[i] = block(b + i * kBytes);
    return;
  }
  for (int i = 0; i < kGroupBlocks; ++i) {
    u->w[i] = i < nblk ? block(b + i * kBytes) : _mm256_setzero_si256();
  }
}

// ggml's kvalues_mxfp4 (E2M1 values doubled) plus 12, so that they are unsigned, twice (vpshufb
// looks up within each 128-bit lane).
inline __m256i Mxfp4Table() {
  return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15,
                          16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}

// Unpack<T, kSigned8>: kGroupBytes (packed bytes of 8 blocks), kBias (u = w + kBias), kHasC, kPer16
// and Group(row, g, nblk, Unpacked*). kSigned8: Q8_0 keeps its signed bytes (bias 0; the AVX2
// kernel uses vpsignb) instead of u = q + 128 (bias 128; VNNI).
template <GgmlType T, bool kSigned8>
struct Unpack;

template <bool kSigned8>
struct Unpack<GgmlType::kQ4_0, kSigned8> {  // {f16 d; u8 qs[16]}
  static constexpr int64_t kGroupBytes = kGroupBlocks * 18;
  static constexpr int kBias = 8;
  static constexpr bool kHasC = false, kPer16 = false;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int nblk,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    u->scale[0] = Halves8<18>(b, nblk);
    Blocks32<18>(row, g, nblk, u, [](const uint8_t* p) { return Nibbles(p + 2); });
  }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ4_1, kSigned8> {  // {f16 d, m; u8 qs[16]}
  static constexpr int64_t kGroupBytes = kGroupBlocks * 20;
  static constexpr int kBias = 0;
  static constexpr bool kHasC = true, kPer16 = false;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int nblk,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    u->scale[0] = Halves8<20>(b, nblk);
    u->c = Halves8<20>(b + 2, nblk);
    Blocks32<20>(row, g, nblk, u, [](const uint8_t* p) { return Nibbles(p + 4); });
  }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ5_0, kSigned8> {  // {f16 d; u8 qh[4]; u8 qs[16]}
  static constexpr int64_t kGroupBytes = kGroupBlocks * 22;
  static constexpr int kBias = 16;
  static constexpr bool kHasC = false, kPer16 = false;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int nblk,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    u->scale[0] = Halves8<22>(b, nblk);
    Blocks32<22>(row, g, nblk, u, [](const uint8_t* p) {
      return _mm256_or_si256(Nibbles(p + 6), FifthBits(p + 2));
    });
  }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ5_1, kSigned8> {  // {f16 d, m; u8 qh[4]; u8 qs[16]}
  static constexpr int64_t kGroupBytes = kGroupBlocks * 24;
  static constexpr int kBias = 0;
  static constexpr bool kHasC = true, kPer16 = false;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int nblk,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    u->scale[0] = Halves8<24>(b, nblk);
    u->c = Halves8<24>(b + 2, nblk);
    Blocks32<24>(row, g, nblk, u, [](const uint8_t* p) {
      return _mm256_or_si256(Nibbles(p + 8), FifthBits(p + 4));
    });
  }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ8_0, kSigned8> {  // {f16 d; i8 qs[32]}
  static constexpr int64_t kGroupBytes = kGroupBlocks * 34;
  static constexpr int kBias = kSigned8 ? 0 : 128;
  static constexpr bool kHasC = false, kPer16 = false;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int nblk,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    u->scale[0] = Halves8<34>(b, nblk);
    Blocks32<34>(row, g, nblk, u, [](const uint8_t* p) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
      // q + 128 as an unsigned byte is q with its top bit flipped.
      return kSigned8 ? q : _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));
    });
  }
};

template <bool kSigned8>
struct Unpack<GgmlType::kMXFP4, kSigned8> {  // {u8 e; u8 qs[16]}
  static constexpr int64_t kGroupBytes = kGroupBlocks * 17;
  static constexpr int kBias = 12;
  static constexpr bool kHasC = false, kPer16 = false;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int nblk,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    u->scale[0] = E8M0Half8<17>(b, nblk);
    const __m256i table = Mxfp4Table();
    Blocks32<17>(row, g, nblk, u,
                 [table](const uint8_t* p) { return _mm256_shuffle_epi8(table, Nibbles(p + 1)); });
  }
};

// Q4_K / Q5_K: scale d·sc_j and c = -(dmin·m_j) per 32 (the products rounded as
// dequantize_row_q4_K rounds them).
inline void ScalesK4(const uint8_t* b, Unpacked* u) {
  __m256i sc, mn;
  ScalesMinsK4(b + 4, &sc, &mn);
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(LoadU16(b)));
  const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(LoadU16(b + 2)));
  u->scale[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
  u->c = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)), _mm256_set1_ps(-0.0f));
}

template <bool kSigned8>
struct Unpack<GgmlType::kQ4_K, kSigned8> {  // {f16 d, dmin; u8 scales[12]; u8 qs[128]}
  static constexpr int64_t kGroupBytes = 144;
  static constexpr int kBias = 0;
  static constexpr bool kHasC = true, kPer16 = false;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int /*nblk*/,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    ScalesK4(b, u);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {  // 32 bytes: the low nibbles are block 2j, the high 2j + 1
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * j));
      u->w[2 * j] = _mm256_and_si256(q, low4);
      u->w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    }
  }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ5_K, kSigned8> {  // {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
  static constexpr int64_t kGroupBytes = 176;
  static constexpr int kBias = 0;
  static constexpr bool kHasC = true, kPer16 = false;
  template <int j>
  static void Pair(const uint8_t* b, __m256i qh, Unpacked* u) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * j));
    u->w[2 * j] = _mm256_or_si256(_mm256_and_si256(q, low4), BitTo4<2 * j>(qh));
    u->w[2 * j + 1] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), BitTo4<2 * j + 1>(qh));
  }
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int /*nblk*/,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    ScalesK4(b, u);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    Pair<0>(b, qh, u);
    Pair<1>(b, qh, u);
    Pair<2>(b, qh, u);
    Pair<3>(b, qh, u);
  }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ6_K, kSigned8> {  // {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
  static constexpr int64_t kGroupBytes = 210;
  static constexpr int kBias = 32;
  static constexpr bool kHasC = false, kPer16 = true;
  __attribute__((always_inline)) static void Group(const uint8_t* row, int64_t g, int /*nblk*/,
                                                   Unpacked* u) {
    const uint8_t* b = row + g * kGroupBytes;
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(LoadU16(b + 208)));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    u->scale[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    u->scale[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {  // 128 elements: ql[64h, 64h + 64), qh[32h, 32h + 32)
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      u->w[4 * h] = _mm256_or_si256(_mm256_and_si256(a, low4),
                                    _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2));
      u->w[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(c, low4),
                                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2));
      u->w[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4),
                                        _mm256_and_si256(qh, top2));
      u->w[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2));
    }
  }
};

// TreeSum's last three levels on 8 lanes in registers: i + (i+4), then i + (i+2), i + (i+1).
inline float TreeSum8(__m256 s8) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

}  // namespace MOEBATCH_QUANT_ISA
#endif  // MOEBATCH_QUANT_ISA

}  // namespace quant_linear_internal
}  // namespace moebatch
