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
//   template <bool kFull, int MR> static void Accumulate(Acc* acc, const DG&, int nblk,
//           const XRow* x): steps 1-3 for the group's blocks, row x[r] into acc[r], r < MR (the
//           policy picks the order: block by block over the rows reuses the weights in registers);
//           kFull: nblk is 8;
//   static float Finish(const Acc&)  (step 4).
// and optionally:
//   kSuperblock  true for the K-quant policies (their activations are per super-block: XGroup);
// and optionally, for the streamed path (m <= kStreamRows):
//   kStreamedRows  the number of rows of x (1: decode at batch 1) for which Micro's streamed path
//           calls Stream instead of Decode and Accumulate;
//   static void Stream(Acc* acc, const uint8_t* row, int64_t g, int nblk, const XRow* x): Decode
//           then Accumulate's arithmetic (the same operations per output, so the same bits) for
//           rows x[0..kStreamedRows), each block unpacked where it is used (no DG in memory).
#pragma once

#if defined(MOEBATCH_QUANT_ISA)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/model/ggml_type.h"

namespace moebatch {
namespace quant_linear_internal {

constexpr int64_t kBlock = 32;       // elements per block of the unified view (and of x's int8)
constexpr int64_t kGroupBlocks = 8;  // blocks per group: a K-quant super-block
constexpr int64_t kGroup = kBlock * kGroupBlocks;

// One group (256 elements) of one activation row quantized to int8 (quant_linear.cc's
// QuantizeRows). For the types of 32-blocks, in blocks of 32, block i of the group:
//   q, d8, corr (int32) and s.
// For the K-quant types (Kernel::superblock), once per group as ggml's quantize_row_q8_K:
//   q (block b at slot KSlot(b); as q + 128 in unsigned bytes where QuantizedRows::unsigned_q),
//   dx, bsum and, with a bias and signed q, corr16; d8 and s unused.
struct alignas(64) XGroup {
  int8_t q[kGroup];            // the int8 values
  float d8[kGroupBlocks * 8];  // d_i, 8 copies at [8i, 8i + 8)
  union {
    // At [8i + l]: -bias · Σ of q over elements 4l..4l+3 of block i (Kernel::bias).
    int32_t corr[kGroupBlocks * 8];
    // K-quants: at [t]: -bias · (q[2t] + q[2t + 1]), q in slot order (Kernel::bias).
    int16_t corr16[kGroup / 2];
  };
  float s[kGroupBlocks];       // s_i = d_i · float(Σ q) (step 3)
  float dx;                    // K-quants: the group's scale (q8_K's d = 1 / iscale)
  int16_t bsum[kGroupBlocks];  // K-quants: Σ q over block b (natural order)
  char pad[12];                // to whole 64-byte lines
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
  // Kernel::unsigned_prefill in force for this call: q holds q + 128 as unsigned bytes (bsum and
  // dx as always, no corr16).
  bool unsigned_q = false;
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
  const int16_t* corr16;
  const int16_t* bsum;
  float dx;
};

template <class K>
XRow RowAt(const QuantizedRows& xq, int64_t r, int64_t g) {
  const XGroup& x = xq.x[g * xq.stride + r];
  return XRow{x.q, x.d8, x.s, K::kBias != 0 ? x.corr : nullptr, x.corr16, x.bsum, x.dx};
}

// K-quant activations (Kernel::superblock): the slot of block b's 32 values within the group's q.
// paired: b with bits 0 and 1 swapped (0, 2, 1, 3, 4, 6, 5, 7: the AVX-512 kernels' order, where
// a 64-byte load of Q4_K / Q5_K nibbles holds blocks 4j and 4j + 2); else b.
constexpr int KSlot(bool paired, int b) {
  return paired ? (b & ~3) | ((b & 1) << 1) | ((b >> 1) & 1) : b;
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
  // K-quant kernels (Q4_K, Q5_K, Q6_K): activations quantized per super-block (XGroup), blocks at
  // KSlot(paired_slots, b); bias fills corr16 instead of corr.
  bool superblock = false;
  bool paired_slots = false;
  // K-quant kernels: calls with m > kStreamRows get their activations as q + 128 (unsigned bytes,
  // QuantizedRows::unsigned_q), and the tile function takes every tile of such a call, however
  // few its rows, through its prefill path.
  bool unsigned_prefill = false;
};

// nullptr tile for a type the ISA has no kernel for (never for QuantLinearSupports' types).
Kernel PortableKernel(GgmlType type);
Kernel Avx2Kernel(GgmlType type);        // quant_linear_avx2.cc: AVX2 + FMA + F16C
Kernel Avx512VnniKernel(GgmlType type);  // quant_linear_avx512.cc: AVX-512 F/BW/VL + VNNI

// dst [k] f32 = the k / 32 MXFP4 blocks at row, each element kvalues[q] · 2^(e - 128) exactly
// (engine/model/ggml_quants.h's DequantizeRow, the same values); k a multiple of 32. For
// InvariantLinearMxfp4 (invariant_linear.h).
void PortableWidenMxfp4Row(const std::byte* row, int64_t k, float* dst);
void Avx2WidenMxfp4Row(const std::byte* row, int64_t k, float* dst);  // quant_linear_avx2.cc
// InvariantLinearMxfp4 for few rows of x (AVX2 + FMA): y[r, j] (row stride ldy) for r < m and
// weight rows j in [n0, n1) (MXFP4 rows of k / 32 blocks at w), each block widened in registers
// where it is used, with InvariantLinear's operations (invariant_linear.h steps 1-2: 16 lanes of
// FMAs in increasing t, the lane tree; k a multiple of 32 has no step 3), so the bits of
// InvariantLinear over the widened weights. Rows of x 4 at a time against each weight row.
void Avx2Mxfp4Rows(const float* x, int64_t m, int64_t k, const std::byte* w, int64_t n0, int64_t n1,
                   float* y, int64_t ldy);

// Tiles with at most this many rows of x stream their weights: each weight row is read and
// unpacked group by group while every row of x uses the group.
constexpr int64_t kStreamRows = 8;
// Streaming, the weights are prefetched this many bytes ahead. The hardware prefetchers alone
// leave a decode-sized call latency-bound: one core streamed Q4_0 from memory at 6.5 GB/s without,
// 11 GB/s with 12 groups (1.7 KiB) ahead; 4-6 KiB ahead held 2 threads nearer the triad than 1-2
// KiB for every type (bench/quant_linear.cc).
constexpr int64_t kPrefetchBytes = 6144;
// Groups per K slice of the unpacked path: a slice of kMR rows of x (4 XGroups, 3.25 KiB a row;
// 26 KiB for 8 rows) stays in L1 while every unpacked weight row of the tile passes over it.
constexpr int64_t kSliceGroups = 4;

template <class K>
int BlocksInGroup(const QuantizedRows& xq, int64_t g) {
  return static_cast<int>(std::min<int64_t>(kGroupBlocks, xq.blocks - g * kGroupBlocks));
}

// A policy's Accumulate<kFull, MR> as its AccumulateRow<kFull>(Acc*, const DG&, int nblk, const
// XRow&) row after row (for policies whose registers cannot hold a block's weights for all rows).
template <class K, bool kFull, int MR>
__attribute__((always_inline)) inline void RowAfterRow(typename K::Acc* acc,
                                                       const typename K::DG& dg, int nblk,
                                                       const XRow* x) {
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) K::template AccumulateRow<kFull>(&acc[r], dg, nblk, x[r]);
}

// K::kStreamedRows, or 0 for a policy without Stream.
template <class K, class = void>
struct StreamedRows : std::integral_constant<int, 0> {};
template <class K>
struct StreamedRows<K, std::void_t<decltype(K::kStreamedRows)>>
    : std::integral_constant<int, K::kStreamedRows> {};

// K::kSuperblock, or false for a policy without it.
template <class K, class = void>
struct SuperblockPolicy : std::false_type {};
template <class K>
struct SuperblockPolicy<K, std::void_t<decltype(K::kSuperblock)>>
    : std::integral_constant<bool, K::kSuperblock> {};

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
    XRow x[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) x[r] = RowAt<K>(xq, r0 + r, g);
    const typename K::DG* dg;
    typename K::DG local;
    if constexpr (kPacked) {
      // Past the row's end this touches the next rows of the tile (or nothing: prefetches never
      // fault).
      const uint8_t* ahead = wrow + g * K::kGroupBytes + kPrefetchBytes;
      for (int64_t line = 0; line < K::kGroupBytes; line += 64) __builtin_prefetch(ahead + line);
      if constexpr (MR == StreamedRows<K>::value) {
        K::Stream(acc, wrow, g, nblk, x);
        continue;
      }
      K::Decode(wrow, g, nblk, &local);
      dg = &local;
    } else {
      dg = drow + g;
    }
    if (nblk == kGroupBlocks) {
      K::template Accumulate<true, MR>(acc, *dg, nblk, x);
    } else {
      K::template Accumulate<false, MR>(acc, *dg, nblk, x);
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

// The decode-sized half of Tile (m1 - m0 <= kStreamRows): each weight row streams once per kMR rows
// of x (once for m <= kMR; again from L1/L2, a few KiB later, for the next kMR rows).
template <class K>
void StreamedTile(const QuantizedRows& xq, int64_t m0, int64_t m1, const uint8_t* wb,
                  int64_t row_bytes, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  for (int64_t c = n0; c < n1; ++c) {
    for (int64_t r = m0; r < m1; r += K::kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(K::kMR, m1 - r));
      MicroRows<K, true>(mr, xq, r, wb + c * row_bytes, static_cast<const typename K::DG*>(nullptr),
                         int64_t{0}, xq.groups, static_cast<typename K::Acc*>(nullptr), true, true,
                         y + r * ldy + c, ldy);
    }
  }
}

// Weight rows [n0, n1) unpacked, row c - n0's group g at [(c - n0) · xq.groups + g], into the
// calling thread's buffer of policy K (reused by the next call on the thread: valid until then).
template <class K>
const typename K::DG* UnpackRows(const QuantizedRows& xq, const uint8_t* wb, int64_t row_bytes,
                                 int64_t n0, int64_t n1) {
  thread_local std::vector<typename K::DG> unpacked;
  const int64_t groups = xq.groups;
  unpacked.resize(static_cast<size_t>((n1 - n0) * groups));
  for (int64_t c = 0; c < n1 - n0; ++c) {
    const uint8_t* row = wb + (n0 + c) * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      K::Decode(row, g, BlocksInGroup<K>(xq, g), &unpacked[static_cast<size_t>(c * groups + g)]);
    }
  }
  return unpacked.data();
}

// Prefill-sized tiles walk x in slices (kMR rows by kSliceGroups groups) that each pass once over
// the tile's unpacked weight rows. At large m, x outgrows the caches (m 1024, k 5632: 18 MiB of
// records) and each slice's first touch waited on memory: one thread's Q4_K GEMM at m 2048, k 5632
// ran at about half its m-256 speed on Zen 3. So while a slice runs, the next one's records (the
// same rows' next groups, or the next rows' first ones) are prefetched into L1, spread over the
// slice's column steps; only the lines the kernels read: q, then d8 or, for the K-quants, the line
// of dx and bsum, the correction (corr or corr16) with a bias, and s with a c term.
template <bool kSuperblock, bool kCorr, bool kS>
class SlicePrefetcher {
 public:
  // The slice after rows [r, r + rows) x groups [s0, s1) of the tile's rows [.., m1), to be
  // fetched over `steps` calls of Step().
  SlicePrefetcher(const QuantizedRows& xq, int64_t r, int64_t rows, int64_t s1, int64_t m1,
                  int64_t steps)
      : xq_(xq) {
    row0_ = r;
    group0_ = s1;
    if (group0_ >= xq.groups) {
      row0_ = r + rows;
      group0_ = 0;
    }
    rows_ = std::max<int64_t>(0, std::min(rows, m1 - row0_));
    records_ = rows_ * (std::min(xq.groups, group0_ + kSliceGroups) - group0_);
    per_step_ = (records_ + steps - 1) / std::max<int64_t>(1, steps);
  }

  void Step() {
    for (int64_t e = 0; e < per_step_ && next_ < records_; ++e, ++next_) {
      Record(&xq_.x[(group0_ + next_ / rows_) * xq_.stride + row0_ + next_ % rows_]);
    }
  }

 private:
  static void Record(const XGroup* rec) {
    for (int line = 0; line < 4; ++line) __builtin_prefetch(rec->q + 64 * line);
    if constexpr (kSuperblock) {
      __builtin_prefetch(&rec->dx);
      if constexpr (kCorr) {
        for (int line = 0; line < 4; ++line) {
          __builtin_prefetch(reinterpret_cast<const char*>(rec->corr16) + 64 * line);
        }
      }
    } else {
      for (int line = 0; line < 2; ++line) {
        __builtin_prefetch(reinterpret_cast<const char*>(rec->d8) + 64 * line);
      }
      if constexpr (kCorr) {
        for (int line = 0; line < 4; ++line) {
          __builtin_prefetch(reinterpret_cast<const char*>(rec->corr) + 64 * line);
        }
      }
      if constexpr (kS) __builtin_prefetch(rec->s);
    }
  }

  const QuantizedRows& xq_;
  int64_t row0_ = 0, group0_ = 0, rows_ = 0, records_ = 0, per_step_ = 0, next_ = 0;
};

// The TileFn of policy K.
template <class K>
void Tile(const QuantizedRows& xq, int64_t m0, int64_t m1, const std::byte* w, int64_t row_bytes,
          int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  if (m1 - m0 <= kStreamRows) return StreamedTile<K>(xq, m0, m1, wb, row_bytes, n0, n1, y, ldy);
  // Prefill-sized: unpack the tile's weight rows once (the dispatcher sizes the tile for L2), then
  // for each kMR rows of x, K slice by K slice, run every weight row over the slice.
  const int64_t groups = xq.groups;
  const int64_t cols = n1 - n0;
  const typename K::DG* unpacked = UnpackRows<K>(xq, wb, row_bytes, n0, n1);
  thread_local std::vector<typename K::Acc> park;
  park.resize(static_cast<size_t>(cols * K::kMR));
  for (int64_t r = m0; r < m1; r += K::kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(K::kMR, m1 - r));
    for (int64_t s0 = 0; s0 < groups; s0 += kSliceGroups) {
      const int64_t s1 = std::min(groups, s0 + kSliceGroups);
      constexpr bool kSuper = SuperblockPolicy<K>::value;
      SlicePrefetcher<kSuper, K::kBias != 0, K::kHasC && !kSuper> prefetch(xq, r, K::kMR, s1, m1,
                                                                           cols);
      for (int64_t c = 0; c < cols; ++c) {
        prefetch.Step();
        MicroRows<K, false>(mr, xq, r, static_cast<const uint8_t*>(nullptr), unpacked + c * groups,
                            s0, s1, park.data() + c * K::kMR, s0 == 0, s1 == groups,
                            y + r * ldy + n0 + c, ldy);
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
  // Lane i: block i's scale, finite for i >= nblk.
  __m256 scale;
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

// The 16-bit words at p + i·kStride, i < n <= 8, as 8 words (word i at bits 16i..16i+15, zeros
// from n): packed in general-purpose registers (loads, shifts and ors on the integer ports) and
// moved over once. A vpgatherdd of the same words cost ~0.6 ns more per block of 32 at M = 1 on
// Zen 3 (its latency heads every scale's dependency chain), and words stored to the stack and
// loaded back as one vector stall on the failed store forwarding (SmolLM2's rows of 576 end in a
// group of 2 blocks).
template <int kStride>
inline __m128i Words8(const uint8_t* p, int n) {
  uint64_t lo = 0, hi = 0;
  if (n == kGroupBlocks) {
    for (int i = 0; i < 4; ++i) {
      lo |= uint64_t{LoadU16(p + i * kStride)} << (16 * i);
      hi |= uint64_t{LoadU16(p + (i + 4) * kStride)} << (16 * i);
    }
  } else {
    for (int i = 0; i < n; ++i) {
      const uint64_t w = LoadU16(p + i * kStride);
      if (i < 4) {
        lo |= w << (16 * i);
      } else {
        hi |= w << (16 * (i - 4));
      }
    }
  }
  return _mm_set_epi64x(static_cast<int64_t>(hi), static_cast<int64_t>(lo));
}

// The bytes at p + i·kStride, i < n <= 8, as 8 bytes (byte i at bits 8i..8i+7, zeros from n),
// likewise.
template <int kStride>
inline uint64_t Bytes8(const uint8_t* p, int n) {
  uint64_t v = 0;
  if (n == kGroupBlocks) {
    for (int i = 0; i < kGroupBlocks; ++i) v |= uint64_t{p[i * kStride]} << (8 * i);
  } else {
    for (int i = 0; i < n; ++i) v |= uint64_t{p[i * kStride]} << (8 * i);
  }
  return v;
}

// The n <= 8 f16 values at p, p + kStride, ... widened to f32, zeros after them.
template <int kStride>
inline __m256 Halves8(const uint8_t* p, int n) {
  return _mm256_cvtph_ps(Words8<kStride>(p, n));
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

// The 8 6-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K / Q5_K super-block (scales[12],
// ggml's get_scale_min_k4).
inline __m128i ScalesMinsK4(const uint8_t* s) {
  const uint32_t u0 = LoadU32(s), u1 = LoadU32(s + 4), u2 = LoadU32(s + 8);
  const uint32_t sc_lo = u0 & 0x3F3F3F3Fu, mn_lo = u1 & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (u2 & 0x0F0F0F0Fu) | (((u0 >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((u2 >> 4) & 0x0F0F0F0Fu) | (((u1 >> 6) & 0x03030303u) << 4);
  return _mm_set_epi64x(static_cast<int64_t>(mn_lo | uint64_t{mn_hi} << 32),
                        static_cast<int64_t>(sc_lo | uint64_t{sc_hi} << 32));
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
  return E8M0Half(
      _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(Bytes8<kStride>(p, n)))));
}

// ggml's kvalues_mxfp4 (E2M1 values doubled) plus 12, so that they are unsigned, twice (vpshufb
// looks up within each 128-bit lane).
inline __m256i Mxfp4Table() {
  return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15,
                          16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}

// Unpack<T, kSigned8> for the types of 32-blocks, each block kBytes bytes:
//   kGroupBytes (packed bytes of 8 blocks), kBias (u = w + kBias), kHasC;
//   Weights(p): the 32 u of the block whose first byte is p;
//   Scales(b, n): lane i the scale of block i of the group at b, i < n <= 8; finite after n;
//   C(b, n) (kHasC): lane i the c of block i, i < n; zero after n.
// kSigned8: Q8_0 keeps its signed bytes (bias 0; the AVX2 kernel uses vpsignb) instead of
// u = q + 128 (bias 128; VNNI).
template <GgmlType T, bool kSigned8>
struct Unpack;

template <bool kSigned8>
struct Unpack<GgmlType::kQ4_0, kSigned8> {  // {f16 d; u8 qs[16]}
  static constexpr int kBytes = 18;
  static constexpr int64_t kGroupBytes = kGroupBlocks * kBytes;
  static constexpr int kBias = 8;
  static constexpr bool kHasC = false;
  static __m256i Weights(const uint8_t* p) { return Nibbles(p + 2); }
  static __m256 Scales(const uint8_t* b, int n) { return Halves8<kBytes>(b, n); }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ4_1, kSigned8> {  // {f16 d, m; u8 qs[16]}
  static constexpr int kBytes = 20;
  static constexpr int64_t kGroupBytes = kGroupBlocks * kBytes;
  static constexpr int kBias = 0;
  static constexpr bool kHasC = true;
  static __m256i Weights(const uint8_t* p) { return Nibbles(p + 4); }
  static __m256 Scales(const uint8_t* b, int n) { return Halves8<kBytes>(b, n); }
  static __m256 C(const uint8_t* b, int n) { return Halves8<kBytes>(b + 2, n); }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ5_0, kSigned8> {  // {f16 d; u8 qh[4]; u8 qs[16]}
  static constexpr int kBytes = 22;
  static constexpr int64_t kGroupBytes = kGroupBlocks * kBytes;
  static constexpr int kBias = 16;
  static constexpr bool kHasC = false;
  static __m256i Weights(const uint8_t* p) {
    return _mm256_or_si256(Nibbles(p + 6), FifthBits(p + 2));
  }
  static __m256 Scales(const uint8_t* b, int n) { return Halves8<kBytes>(b, n); }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ5_1, kSigned8> {  // {f16 d, m; u8 qh[4]; u8 qs[16]}
  static constexpr int kBytes = 24;
  static constexpr int64_t kGroupBytes = kGroupBlocks * kBytes;
  static constexpr int kBias = 0;
  static constexpr bool kHasC = true;
  static __m256i Weights(const uint8_t* p) {
    return _mm256_or_si256(Nibbles(p + 8), FifthBits(p + 4));
  }
  static __m256 Scales(const uint8_t* b, int n) { return Halves8<kBytes>(b, n); }
  static __m256 C(const uint8_t* b, int n) { return Halves8<kBytes>(b + 2, n); }
};

template <bool kSigned8>
struct Unpack<GgmlType::kQ8_0, kSigned8> {  // {f16 d; i8 qs[32]}
  static constexpr int kBytes = 34;
  static constexpr int64_t kGroupBytes = kGroupBlocks * kBytes;
  static constexpr int kBias = kSigned8 ? 0 : 128;
  static constexpr bool kHasC = false;
  static __m256i Weights(const uint8_t* p) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    // q + 128 as an unsigned byte is q with its top bit flipped.
    return kSigned8 ? q : _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static __m256 Scales(const uint8_t* b, int n) { return Halves8<kBytes>(b, n); }
};

template <bool kSigned8>
struct Unpack<GgmlType::kMXFP4, kSigned8> {  // {u8 e; u8 qs[16]}
  static constexpr int kBytes = 17;
  static constexpr int64_t kGroupBytes = kGroupBlocks * kBytes;
  static constexpr int kBias = 12;
  static constexpr bool kHasC = false;
  static __m256i Weights(const uint8_t* p) {
    return _mm256_shuffle_epi8(Mxfp4Table(), Nibbles(p + 1));
  }
  static __m256 Scales(const uint8_t* b, int n) { return E8M0Half8<kBytes>(b, n); }
};

// Blocks [8g, 8g + nblk) of a row of U's blocks unpacked: u->w[i] (zero for i >= nblk), the
// scales and, for types with c, the c's.
template <class U>
__attribute__((always_inline)) inline void UnpackGroup(const uint8_t* row, int64_t g, int nblk,
                                                       Unpacked* u) {
  const uint8_t* b = row + g * U::kGroupBytes;
  u->scale = U::Scales(b, nblk);
  if constexpr (U::kHasC) u->c = U::C(b, nblk);
  if (nblk == kGroupBlocks) {
    for (int i = 0; i < kGroupBlocks; ++i) u->w[i] = U::Weights(b + i * U::kBytes);
    return;
  }
  for (int i = 0; i < kGroupBlocks; ++i) {
    u->w[i] = i < nblk ? U::Weights(b + i * U::kBytes) : _mm256_setzero_si256();
  }
}

// The K-quant types' weights as unsigned integers u (Q4_K, Q5_K: u = q; Q6_K: u = q + 32, the
// stored 6 bits), one block of 32 per ymm, blocks in natural order. Quad<T, h>(b, w) writes blocks
// 4h..4h+3 of the super-block at b into w[4h..4h+3]; Weights<T> all 8.
template <int j>
inline void PairQ4K(const uint8_t* b, __m256i* w) {  // {f16 d, dmin; u8 scales[12]; u8 qs[128]}
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // 32 bytes: the low nibbles are block 2j, the high 2j + 1.
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * j));
  w[2 * j] = _mm256_and_si256(q, low4);
  w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
}

template <int j>
inline void PairQ5K(const uint8_t* b, __m256i qh, __m256i* w) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 48 + 32 * j));
  w[2 * j] = _mm256_or_si256(_mm256_and_si256(q, low4), BitTo4<2 * j>(qh));
  w[2 * j + 1] =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), BitTo4<2 * j + 1>(qh));
}

// {u8 ql[128]; u8 qh[64]; i8 sc[16]; f16 d}: 128 elements from ql[64h, 64h + 64), qh[32h, 32h +
// 32).
template <int h>
inline void QuadQ6K(const uint8_t* b, __m256i* w) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
  w[4 * h] =
      _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), top2));
  w[4 * h + 1] =
      _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), top2));
  w[4 * h + 2] =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(qh, top2));
  w[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4),
                                 _mm256_and_si256(_mm256_srli_epi16(qh, 2), top2));
}

template <GgmlType T, int h>
inline void Quad(const uint8_t* b, __m256i* w) {
  if constexpr (T == GgmlType::kQ4_K) {
    PairQ4K<2 * h>(b, w);
    PairQ4K<2 * h + 1>(b, w);
  } else if constexpr (T ==
                       GgmlType::kQ5_K) {  // {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    PairQ5K<2 * h>(b, qh, w);
    PairQ5K<2 * h + 1>(b, qh, w);
  } else {
    static_assert(T == GgmlType::kQ6_K, "a K-quant type");
    QuadQ6K<h>(b, w);
  }
}

template <GgmlType T>
inline void Weights(const uint8_t* b, __m256i* w) {
  Quad<T, 0>(b, w);
  Quad<T, 1>(b, w);
}

// A Q4_K / Q5_K super-block's scales as 8 int16 (block b at b) and its mins (*mins, likewise).
inline __m128i ScalesK4(const uint8_t* b, __m128i* mins) {
  const __m128i sm = ScalesMinsK4(b + 4);
  *mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
  return _mm_cvtepu8_epi16(sm);
}

// A Q6_K super-block's scales as 16 int16 (the scale of elements [16t, 16t + 16) at t).
inline __m256i ScalesQ6K(const uint8_t* b) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
}

// K-quant super-block geometry and factors.
template <GgmlType T>
struct KQuant;
// DMin: lane 0 d, lane 1 dmin (0 for Q6_K), as floats.
template <>
struct KQuant<GgmlType::kQ4_K> {
  static constexpr int64_t kGroupBytes = 144;
  static constexpr bool kHasC = true;
  static constexpr int kBias = 0;
  static __m128 DMin(const uint8_t* b) { return _mm_cvtph_ps(_mm_cvtsi32_si128(LoadU32(b))); }
};
template <>
struct KQuant<GgmlType::kQ5_K> {
  static constexpr int64_t kGroupBytes = 176;
  static constexpr bool kHasC = true;
  static constexpr int kBias = 0;
  static __m128 DMin(const uint8_t* b) { return _mm_cvtph_ps(_mm_cvtsi32_si128(LoadU32(b))); }
};
template <>
struct KQuant<GgmlType::kQ6_K> {
  static constexpr int64_t kGroupBytes = 210;
  static constexpr bool kHasC = false;
  static constexpr int kBias = 32;  // u = w + 32
  static __m128 DMin(const uint8_t* b) { return _mm_cvtph_ps(_mm_cvtsi32_si128(LoadU16(b + 208))); }
};

// (d · dx, dmin · dx) of a super-block's factors and a row's dx, each product rounded to float.
inline __m128 TimesDx(__m128 dmin, float dx) { return _mm_mul_ps(dmin, _mm_set1_ps(dx)); }

// TreeSum's last three levels on 8 lanes in registers: i + (i+4), then i + (i+2), i + (i+1).
inline float TreeSum8(__m256 s8) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The sum of the 4 lanes of v: i + (i+2), then i + (i+1) (the portable Tree of 4).
inline float TreeSum4(__m128 s4) {
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The K-quants' float partial sums (quant_linear.h, K-quants, steps 2-3) in both vector files.
struct KAcc {
  __m256 a;  // lanes 0-7
  __m256 e;  // the mins in lanes 0-3
};

// Step 2 for one super-block: its integer lanes L, the weights' (d, dmin) and int16 mins, and the
// row's dx and bsum.
template <bool kHasC>
__attribute__((always_inline)) inline void KStep(KAcc* acc, __m256i lanes, __m128 dmin,
                                                 __m128i mins, const XRow& x) {
  const __m128 f = TimesDx(dmin, x.dx);
  acc->a = _mm256_fmadd_ps(_mm256_broadcastss_ps(f), _mm256_cvtepi32_ps(lanes), acc->a);
  if constexpr (kHasC) {
    const __m128i e =
        _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsum)));
    acc->e = _mm256_castps128_ps256(_mm_fmadd_ps(_mm_shuffle_ps(f, f, 0x55), _mm_cvtepi32_ps(e),
                                                 _mm256_castps256_ps128(acc->e)));
  }
}

template <bool kHasC>
float KFinish(const KAcc& acc) {
  const float a = TreeSum8(acc.a);
  if constexpr (kHasC) return a - TreeSum4(_mm256_castps256_ps128(acc.e));
  return a;
}

}  // namespace MOEBATCH_QUANT_ISA
#endif  // MOEBATCH_QUANT_ISA

}  // namespace quant_linear_internal
}  // namespace moebatch
