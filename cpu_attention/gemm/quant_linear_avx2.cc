// QuantLinear's kernels with AVX2 + FMA + F16C (compiled with those flags only; run where CPUID has
// them): one 32-block per ymm. The integer lanes are vpmaddubsw (unsigned u = w + bias times signed
// q, pairs summed to int16: at most 2·63·127, no saturation) then vpmaddwd with ones (4 elements
// per int32 lane) plus the activations' correction -bias·Σq; Q8_0, whose bytes are signed, uses the
// sign trick instead (|w| times q·sign(w)). Blocks alternate between two ymm of partial sums (the
// model's lanes 0-7 and 8-15). Bits equal to quant_linear_portable.cc's.
#define MOEBATCH_QUANT_ISA avx2
#include <immintrin.h>

#include "cpu_attention/gemm/quant_linear_internal.h"

namespace moebatch {
namespace quant_linear_internal {
namespace avx2 {
namespace {

struct Acc {
  __m256 lo, hi;  // step 2's lanes 0-7 (even blocks) and 8-15 (odd blocks)
  __m256 e;       // step 3
};

template <GgmlType T>
struct Policy {
  static constexpr bool kSign = T == GgmlType::kQ8_0;
  using U = Unpack<T, kSign>;
  static constexpr int kBias = U::kBias;
  static constexpr int64_t kGroupBytes = U::kGroupBytes;
  static constexpr bool kHasC = U::kHasC;
  static constexpr int kMR = 4;

  struct DG {
    __m256i w[kGroupBlocks];                  // u = w + bias (kSign: w)
    __m256i abs_w[kSign ? kGroupBlocks : 1];  // kSign: |w|
    __m256 scale[kGroupBlocks];               // lane l of block i: the scale of elements 4l..4l+3
    __m256 c;
  };
  using Acc = avx2::Acc;

  __attribute__((always_inline)) static void Decode(const uint8_t* row, int64_t g, int nblk,
                                                    DG* dg) {
    Unpacked u;
    UnpackGroup<U>(row, g, nblk, &u);
    for (int i = 0; i < kGroupBlocks; ++i) {
      dg->w[i] = u.w[i];
      if constexpr (kSign) dg->abs_w[i] = _mm256_abs_epi8(u.w[i]);
      dg->scale[i] = _mm256_permutevar8x32_ps(u.scale, _mm256_set1_epi32(i));
    }
    if constexpr (kHasC) dg->c = u.c;
  }

  static Acc Zero() { return Acc{_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; }

  // Steps 1-2 for block i into *a.
  __attribute__((always_inline)) static void Block(__m256* a, const DG& dg, int i, const XRow& x) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + i * kBlock));
    __m256i p16;
    if constexpr (kSign) {
      p16 = _mm256_maddubs_epi16(dg.abs_w[i], _mm256_sign_epi8(q, dg.w[i]));
    } else {
      p16 = _mm256_maddubs_epi16(dg.w[i], q);
    }
    __m256i p = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    if constexpr (kBias != 0) {
      p = _mm256_add_epi32(p, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.corr + i * 8)));
    }
    const __m256 s = _mm256_mul_ps(dg.scale[i], _mm256_loadu_ps(x.d8 + i * 8));
    *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), *a);
  }

  // Block by block over the rows: block i's weights, |w| and scales are loaded once for all MR
  // rows (2.75 loads per block and row at MR 4, against 5 taking the rows one after another).
  template <bool kFull, int MR>
  __attribute__((always_inline)) static void Accumulate(Acc* acc, const DG& dg, int nblk,
                                                        const XRow* x) {
    const int blocks = kFull ? kGroupBlocks : nblk;
#pragma GCC unroll 8
    for (int i = 0; i < blocks; ++i) {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) Block(i % 2 ? &acc[r].hi : &acc[r].lo, dg, i, x[r]);
    }
    // The missing blocks of a short group have c = 0 and s = 0: adding 0 · 0 changes nothing.
    if constexpr (kHasC) {
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        acc[r].e = _mm256_fmadd_ps(dg.c, _mm256_loadu_ps(x[r].s), acc[r].e);
      }
    }
  }

  // One row of x (decode at batch 1): a loop over the group's blocks two at a time, each block
  // unpacked where it is used and its scale broadcast from a stack copy of the group's 8 scales.
  // Decode's whole DG (17-25 vectors) does not fit the 16 registers: GCC spilled most of the
  // unpacked blocks and rebuilt a vpermps index per block.
  static constexpr int kStreamedRows = 1;

  __attribute__((always_inline)) static void Stream(Acc* acc, const uint8_t* row, int64_t g,
                                                    int nblk, const XRow* x) {
    const uint8_t* b = row + g * kGroupBytes;
    alignas(32) float scale[kGroupBlocks];
    _mm256_store_ps(scale, U::Scales(b, nblk));
    const XRow& xr = x[0];
    auto block = [&](int i, __m256* a) {
      const __m256i w = U::Weights(b + i * U::kBytes);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr.q + i * kBlock));
      __m256i p16;
      if constexpr (kSign) {
        p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(q, w));
      } else {
        p16 = _mm256_maddubs_epi16(w, q);
      }
      __m256i p = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
      if constexpr (kBias != 0) {
        p = _mm256_add_epi32(p,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr.corr + i * 8)));
      }
      const __m256 s =
          _mm256_mul_ps(_mm256_broadcast_ss(&scale[i]), _mm256_loadu_ps(xr.d8 + i * 8));
      *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), *a);
    };
    int i = 0;
#pragma GCC unroll 1
    for (; i + 1 < nblk; i += 2) {
      block(i, &acc[0].lo);
      block(i + 1, &acc[0].hi);
    }
    if (i < nblk) block(i, &acc[0].lo);
    if constexpr (kHasC) {
      acc[0].e = _mm256_fmadd_ps(U::C(b, nblk), _mm256_loadu_ps(xr.s), acc[0].e);
    }
  }

  static float Finish(const Acc& acc) {
    const float a = TreeSum8(_mm256_add_ps(acc.lo, acc.hi));
    if constexpr (kHasC) return a + TreeSum8(acc.e);
    return a;
  }
};

// The K-quant types (quant_linear.h, "K-quants"), blocks in natural order, one per ymm: vpmaddubsw
// (u times q, pairs to int16: at most 2·63·127), plus, for Q6_K, the activations' correction
// -32·(q + q') per pair (giving Σ w·q exactly, |.| <= 2·32·127), then vpmaddwd with the int16 scale
// of those elements into int32 lanes of 4 elements, summed over the blocks in two chains.
template <GgmlType T>
struct PolicyK {
  static constexpr bool kSuperblock = true;
  using Q = KQuant<T>;
  static constexpr int kBias = Q::kBias;
  static constexpr int64_t kGroupBytes = Q::kGroupBytes;
  static constexpr bool kHasC = Q::kHasC;
  static constexpr int kMR = 4;

  struct DG {
    __m256i w[kGroupBlocks];   // block b: u
    __m256i sc[kGroupBlocks];  // block b: int16 t holds the scale of elements 2t, 2t + 1
    __m128i mins;              // Q4_K / Q5_K: int16 m_b
    __m128 dmin;               // d, dmin
  };
  using Acc = KAcc;

  // A super-block's int16 scales, each block's picked by one vpshufb (extracting words to general
  // registers and broadcasting them took ~3 instructions per block). Q4_K / Q5_K: the 8 scales in
  // both lanes; Q6_K: block j takes scales 2j (int16 0-7 of the product vector) and 2j + 1 (8-15),
  // from the 16 scales' low or high half in both lanes.
  struct Scales {
    __m256i half[T == GgmlType::kQ6_K ? 2 : 1];
    __m128i mins;  // Q4_K / Q5_K: int16 m_b; Q6_K: zero

    __attribute__((always_inline)) explicit Scales(const uint8_t* b) {
      if constexpr (T == GgmlType::kQ6_K) {
        const __m256i s = ScalesQ6K(b);
        half[0] = _mm256_permute2x128_si256(s, s, 0x00);
        half[1] = _mm256_permute2x128_si256(s, s, 0x11);
        mins = _mm_setzero_si128();
      } else {
        half[0] = _mm256_broadcastsi128_si256(ScalesK4(b, &mins));
      }
    }

    __attribute__((always_inline)) __m256i Of(int j) const {
      if constexpr (T == GgmlType::kQ6_K) {
        const int lo = (2 * j) % 8, hi = (2 * j + 1) % 8;  // word indices within the half
        const __m256i pick = _mm256_setr_epi8(
            2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo,
            2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * hi,
            2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi,
            2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1);
        return _mm256_shuffle_epi8(half[j / 4], pick);
      } else {
        return _mm256_shuffle_epi8(
            half[0], _mm256_set1_epi16(static_cast<int16_t>(0x0100 * (2 * j + 1) + 2 * j)));
      }
    }
  };

  __attribute__((always_inline)) static void Decode(const uint8_t* row, int64_t g, int /*nblk*/,
                                                    DG* dg) {
    const uint8_t* b = row + g * kGroupBytes;
    Weights<T>(b, dg->w);
    const Scales sc(b);
    for (int j = 0; j < kGroupBlocks; ++j) dg->sc[j] = sc.Of(j);
    dg->mins = sc.mins;
    dg->dmin = Q::DMin(b);
  }

  static Acc Zero() { return Acc{_mm256_setzero_ps(), _mm256_setzero_ps()}; }

  // Block j's integer lanes: its weights w and int16 scales sc against row x.
  __attribute__((always_inline)) static __m256i BlockOf(__m256i w, __m256i sc, int j,
                                                        const XRow& x) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + j * kBlock));
    __m256i p16 = _mm256_maddubs_epi16(w, q);
    if constexpr (kBias != 0) {
      p16 = _mm256_add_epi16(
          p16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.corr16 + j * kBlock / 2)));
    }
    return _mm256_madd_epi16(p16, sc);
  }

  __attribute__((always_inline)) static __m256i Block(const DG& dg, int j, const XRow& x) {
    return BlockOf(dg.w[j], dg.sc[j], j, x);
  }

  template <bool kFull, int MR>
  __attribute__((always_inline)) static void Accumulate(Acc* acc, const DG& dg, int nblk,
                                                        const XRow* x) {
    RowAfterRow<PolicyK, kFull, MR>(acc, dg, nblk, x);
  }

  template <bool kFull>
  __attribute__((always_inline)) static void AccumulateRow(Acc* acc, const DG& dg, int /*nblk*/,
                                                           const XRow& x) {
    __m256i s0 = Block(dg, 0, x), s1 = Block(dg, 1, x);
    for (int j = 2; j < kGroupBlocks; j += 2) {
      s0 = _mm256_add_epi32(s0, Block(dg, j, x));
      s1 = _mm256_add_epi32(s1, Block(dg, j + 1, x));
    }
    KStep<kHasC>(acc, _mm256_add_epi32(s0, s1), dg.dmin, dg.mins, x);
  }

  // One row of x (decode at batch 1): the super-block unpacked 4 blocks at a time and used at
  // once (Decode's DG is 16 vectors and more: GCC spilled it). The integer sums are exact, so
  // their order does not change the lanes.
  static constexpr int kStreamedRows = 1;

  __attribute__((always_inline)) static void Stream(Acc* acc, const uint8_t* row, int64_t g,
                                                    int /*nblk*/, const XRow* x) {
    const uint8_t* b = row + g * kGroupBytes;
    const XRow& xr = x[0];
    const Scales sc(b);
    __m256i w[kGroupBlocks];
    Quad<T, 0>(b, w);
    __m256i s0 = BlockOf(w[0], sc.Of(0), 0, xr), s1 = BlockOf(w[1], sc.Of(1), 1, xr);
    s0 = _mm256_add_epi32(s0, BlockOf(w[2], sc.Of(2), 2, xr));
    s1 = _mm256_add_epi32(s1, BlockOf(w[3], sc.Of(3), 3, xr));
    Quad<T, 1>(b, w);
    s0 = _mm256_add_epi32(s0, BlockOf(w[4], sc.Of(4), 4, xr));
    s1 = _mm256_add_epi32(s1, BlockOf(w[5], sc.Of(5), 5, xr));
    s0 = _mm256_add_epi32(s0, BlockOf(w[6], sc.Of(6), 6, xr));
    s1 = _mm256_add_epi32(s1, BlockOf(w[7], sc.Of(7), 7, xr));
    KStep<kHasC>(acc, _mm256_add_epi32(s0, s1), Q::DMin(b), sc.mins, xr);
  }

  static float Finish(const Acc& acc) { return KFinish<kHasC>(acc); }
};

// --- The K-quants' prefill-sized tiles ---------------------------------------------------------
// quant_linear.h's K-quant steps split in two passes over a tile of rows of x and unpacked weight
// rows, each with every output's own float operations in their order, so the bits of PolicyK:
//   1. SuperBlockTile: kTileRows rows of x against kTileCols weight rows at once, the integer lanes
//      L of each product summed over a super-block's blocks in registers (exact, so one chain gives
//      the L of PolicyK's two), then a[l] = fma(d · dx, float(L[l]), a[l]); a in memory, touched
//      once per super-block. Each block's weights (1 load per weight row) and activations (1
//      load per row of x) serve its 8 products, the scales staying memory operands: 14 loads per
//      block where row after row (PolicyK::AccumulateRow) takes 24, three for each product.
//   2. Q4_K / Q5_K, MinsPass: the mins term e[j] = fma(dmin · dx, float(E[j]), e[j]) of one row of
//      x against 8 weight rows at once, one weight row per lane (MinCols: each super-block's mins
//      as int16 pairs, 8 weight rows side by side), the 4 sums e[0..4) in registers over all of K;
//      then y = Tree(a) - Tree(e) for the 8 outputs in the lanes. Per output that is KStep's and
//      KFinish's arithmetic; per product it costs a quarter of KStep's mins part in instructions.
// On Zen 3 (bench_quant_linear, one thread, L2-resident weights, M 256, best of 3 runs) this took
// Q4_K from 95.1 to 104.9 GFLOP/s at 480 x 2048 and from 84.5 to 92.5 at 256 x 5632 (Q5_K +7-11%,
// Q6_K +9%) against PolicyK's rows; 4 x 2 tiles ran 1.95 cycles per block and product with the mins
// still in step 1, against 2.04 at 3 x 2 and 2.11 at 2 x 3.
constexpr int kTileRows = 4, kTileCols = 2;
constexpr int kMinLanes = 8;  // weight rows per MinCols

// One output's step-1 sums, parked between K slices.
struct Sum8 {
  __m256 v;
};
static_assert(sizeof(Sum8) == sizeof(__m256), "parked sums are contiguous vectors");

// One super-block of kMinLanes weight rows, for MinsPass: pair[j] lane c holds the int16 mins
// (m_2j, m_2j+1) of weight row c (zeros past the tile's last row); dmin lane c its dmin.
struct MinCols {
  __m256i pair[4];
  __m256 dmin;
};

// Q6_K's prefill tiles with unsigned activations (Kernel::unsigned_prefill): vpmaddubsw takes
// x's q + 128 (1..255, unsigned) against the signed weights w = u - 32 (-32..31), pairs within
// int16 (|.| <= 2·255·32), so a block's lanes are Σ sc · Σ (q + 128) · w = PolicyK's lanes plus
// 128 · Σ sc · Σ w, a constant of the weight row and super-block (c below) subtracted once per
// super-block: the integer lanes, and so every bit, are PolicyK's. It saves the activations'
// correction (corr16: a load per row and block, an add per product, 4 of the record's 13 lines):
// Q6_K ~7% faster on Zen 3 (bench_quant_linear, 1 thread, M 256, L2: 89.3 -> 95.9 GFLOP/s at 480
// x 2048, 80.8 -> 87.1 at 256 x 5632, best of 4 alternated runs); the vpmaddubsw / vpmaddwd pair
// per product, which bounds the loop, is unchanged. DGU6 is PolicyK<Q6_K>'s unpacked group with w
// = u - 32 instead of u, and c.
struct DGU6 : PolicyK<GgmlType::kQ6_K>::DG {
  __m256i c;  // lane l: 128 · Σ_b Σ_(t in lane l) sc_t · (w_2t + w_2t+1)
};

struct UnpackU6 {
  using DG = DGU6;
  __attribute__((always_inline)) static void Decode(const uint8_t* row, int64_t g, int nblk,
                                                    DG* dg) {
    PolicyK<GgmlType::kQ6_K>::Decode(row, g, nblk, dg);
    __m256i c = _mm256_setzero_si256();
    for (int j = 0; j < kGroupBlocks; ++j) {
      dg->w[j] = _mm256_sub_epi8(dg->w[j], _mm256_set1_epi8(32));
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), dg->w[j]);
      c = _mm256_add_epi32(c, _mm256_madd_epi16(pairs, dg->sc[j]));
    }
    dg->c = _mm256_slli_epi32(c, 7);
  }
};

// The unpacking of a prefill tile's weight rows, and its unpacked group.
template <GgmlType T, bool kUnsigned>
using TileUnpack = std::conditional_t<kUnsigned, UnpackU6, PolicyK<T>>;
template <GgmlType T, bool kUnsigned>
using TileDG = typename TileUnpack<T, kUnsigned>::DG;

// Step 1 for one super-block: rows x[r] against unpacked weight rows d[c], r < MR, c < NR, into
// a[c · kTileRows + r]. kUnsigned: x's q + 128 against DGU6's signed weights.
template <GgmlType T, bool kUnsigned, int MR, int NR>
__attribute__((always_inline)) inline void SuperBlockTile(__m256* a,
                                                          const TileDG<T, kUnsigned>* const* d,
                                                          const XRow* x) {
  using P = PolicyK<T>;
  constexpr bool kCorr = P::kBias != 0 && !kUnsigned;
  __m256i s[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NR; ++c) s[r][c] = _mm256_setzero_si256();
  }
  // Not unrolled: unrolled, GCC scheduled all 8 blocks' products first and spilled them.
#pragma GCC unroll 1
  for (int j = 0; j < kGroupBlocks; ++j) {
    __m256i w[NR];
#pragma GCC unroll 4
    for (int c = 0; c < NR; ++c) {
      w[c] = _mm256_load_si256(&d[c]->w[j]);
      // w and q in registers: as memory operands GCC loaded them again for every product (18
      // loads per block at 4 x 2; Zen 3 loads two ymm per cycle). sc stays a memory operand
      // (14 loads then, against 16 vpmaddubsw / vpmaddwd at two per cycle): in registers too,
      // the 8 sums, 2 w, 2 sc and q did not fit and GCC spilled a sum.
      asm("" : "+x"(w[c]));
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].q + j * kBlock));
      asm("" : "+x"(q));
      __m256i corr = _mm256_setzero_si256();
      if constexpr (kCorr) {
        corr = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r].corr16 + j * kBlock / 2));
      }
#pragma GCC unroll 4
      for (int c = 0; c < NR; ++c) {
        __m256i p16 = kUnsigned ? _mm256_maddubs_epi16(q, w[c]) : _mm256_maddubs_epi16(w[c], q);
        if constexpr (kCorr) p16 = _mm256_add_epi16(p16, corr);
        s[r][c] =
            _mm256_add_epi32(s[r][c], _mm256_madd_epi16(p16, _mm256_load_si256(&d[c]->sc[j])));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NR; ++c) {
      const __m128 f = TimesDx(d[c]->dmin, x[r].dx);  // lane 0: d · dx (KStep's)
      __m256* ac = &a[c * kTileRows + r];
      __m256i lanes = s[r][c];
      if constexpr (kUnsigned) {
        lanes = _mm256_sub_epi32(lanes, _mm256_load_si256(&d[c]->c));
      }
      *ac = _mm256_fmadd_ps(_mm256_broadcastss_ps(f), _mm256_cvtepi32_ps(lanes), *ac);
    }
  }
}

// Step 1 for rows r0 .. r0 + MR of x and unpacked weight rows drow + c · groups (c < NR) over
// super-blocks [g0, g1): the sums start at zero (first) or from park (row r, weight row c at
// park[c · kTileRows + r]) and end there (!last) or reduced, y[r · ldy + c] = Tree(a).
template <GgmlType T, bool kUnsigned, int MR, int NR>
void MicroK(const QuantizedRows& xq, int64_t r0, const TileDG<T, kUnsigned>* drow, int64_t groups,
            int64_t g0, int64_t g1, __m256* park, bool first, bool last, float* y, int64_t ldy) {
  using P = PolicyK<T>;
  if (first) {
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NR; ++c) park[c * kTileRows + r] = _mm256_setzero_ps();
    }
  }
  for (int64_t g = g0; g < g1; ++g) {
    XRow x[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) x[r] = RowAt<P>(xq, r0 + r, g);
    const TileDG<T, kUnsigned>* d[NR];
#pragma GCC unroll 4
    for (int c = 0; c < NR; ++c) d[c] = drow + c * groups + g;
    SuperBlockTile<T, kUnsigned, MR, NR>(park, d, x);
    // The sums are loaded and stored back once per super-block: GCC otherwise kept a second copy
    // of all of them on the stack besides storing them.
    asm volatile("" ::: "memory");
  }
  if (!last) return;
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) y[r * ldy + c] = TreeSum8(park[c * kTileRows + r]);
  }
}

// MicroK<T, kUnsigned, mr, nr> for 1 <= mr <= MR, 1 <= nr <= NR.
template <GgmlType T, bool kUnsigned, int MR, int NR, class... Args>
inline void MicroKRows(int mr, int nr, Args... args) {
  if constexpr (MR > 1) {
    if (mr < MR) return MicroKRows<T, kUnsigned, MR - 1, NR>(mr, nr, args...);
  }
  if constexpr (NR > 1) {
    if (nr < NR) return MicroKRows<T, kUnsigned, MR, NR - 1>(mr, nr, args...);
  }
  MicroK<T, kUnsigned, MR, NR>(args...);
}

// Step 2 for row r of x against the weight rows of mins (MinCols, `groups` per kMinLanes weight
// rows): y[c] -= Tree(e) for the cols <= kMinLanes weight rows there.
inline void MinsPass(const QuantizedRows& xq, int64_t r, const MinCols* mins, int64_t groups,
                     int cols, float* y) {
  __m256 e[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  for (int64_t g = 0; g < groups; ++g) {
    const XGroup& x = xq.x[g * xq.stride + r];
    const MinCols& m = mins[g];
    // dmin · dx rounded to float, as TimesDx.
    const __m256 f = _mm256_mul_ps(m.dmin, _mm256_set1_ps(x.dx));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      int32_t bsum_pair;  // (B_2j, B_2j+1) as int16 pair
      std::memcpy(&bsum_pair, x.bsum + 2 * j, 4);
      const __m256i ej = _mm256_madd_epi16(m.pair[j], _mm256_set1_epi32(bsum_pair));
      e[j] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(ej), e[j]);
    }
  }
  // TreeSum4 per lane: (e0 + e2) + (e1 + e3).
  const __m256 tree = _mm256_add_ps(_mm256_add_ps(e[0], e[2]), _mm256_add_ps(e[1], e[3]));
  alignas(32) float t[kMinLanes];
  _mm256_store_ps(t, tree);
  for (int c = 0; c < cols; ++c) y[c] -= t[c];
}

// The K-quants' prefill-sized tiles: unpack the tile's weight rows once as Tile does (UnpackRows;
// kUnsigned: UnpackU6) and, Q4_K / Q5_K, gather their mins as MinCols, then for each kTileRows rows
// of x, K slice by K slice, run step 1 over the weight rows kTileCols at a time, then step 2.
template <GgmlType T, bool kUnsigned>
void PrefillTileK(const QuantizedRows& xq, int64_t m0, int64_t m1, const uint8_t* wb,
                  int64_t row_bytes, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  using P = PolicyK<T>;
  const int64_t groups = xq.groups;
  const int64_t cols = n1 - n0;
  const int64_t min_blocks = (cols + kMinLanes - 1) / kMinLanes;
  const TileDG<T, kUnsigned>* unpacked =
      UnpackRows<TileUnpack<T, kUnsigned>>(xq, wb, row_bytes, n0, n1);
  thread_local std::vector<MinCols> mins;
  thread_local std::vector<Sum8> park;
  park.resize(static_cast<size_t>(cols * kTileRows));
  if constexpr (P::kHasC) {
    mins.resize(static_cast<size_t>(min_blocks * groups));
    for (int64_t b = 0; b < min_blocks; ++b) {
      for (int64_t g = 0; g < groups; ++g) {
        alignas(32) uint32_t pair[4][kMinLanes] = {};
        alignas(32) float dmin[kMinLanes] = {};
        for (int64_t c = b * kMinLanes; c < std::min(cols, (b + 1) * kMinLanes); ++c) {
          const TileDG<T, kUnsigned>& dg = unpacked[c * groups + g];
          alignas(16) uint32_t m[4];
          _mm_store_si128(reinterpret_cast<__m128i*>(m), dg.mins);
          for (int j = 0; j < 4; ++j) pair[j][c - b * kMinLanes] = m[j];
          dmin[c - b * kMinLanes] = _mm_cvtss_f32(_mm_shuffle_ps(dg.dmin, dg.dmin, 0x55));
        }
        MinCols& mc = mins[static_cast<size_t>(b * groups + g)];
        for (int j = 0; j < 4; ++j) {
          mc.pair[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pair[j]));
        }
        mc.dmin = _mm256_load_ps(dmin);
      }
    }
  }
  for (int64_t r = m0; r < m1; r += kTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileRows, m1 - r));
    for (int64_t s0 = 0; s0 < groups; s0 += kSliceGroups) {
      const int64_t s1 = std::min(groups, s0 + kSliceGroups);
      SlicePrefetcher<true, P::kBias != 0 && !kUnsigned, false> prefetch(
          xq, r, kTileRows, s1, m1, (cols + kTileCols - 1) / kTileCols);
      for (int64_t c = 0; c < cols; c += kTileCols) {
        prefetch.Step();
        const int nr = static_cast<int>(std::min<int64_t>(kTileCols, cols - c));
        MicroKRows<T, kUnsigned, kTileRows, kTileCols>(
            mr, nr, xq, r, unpacked + c * groups, groups, s0, s1,
            &park[static_cast<size_t>(c * kTileRows)].v, s0 == 0, s1 == groups,
            y + r * ldy + n0 + c, ldy);
      }
    }
    if constexpr (P::kHasC) {
      for (int64_t i = r; i < r + mr; ++i) {
        for (int64_t b = 0; b < min_blocks; ++b) {
          MinsPass(xq, i, mins.data() + b * groups, groups,
                   static_cast<int>(std::min<int64_t>(kMinLanes, cols - b * kMinLanes)),
                   y + i * ldy + n0 + b * kMinLanes);
        }
      }
    }
  }
}

// The TileFn of the K-quants: Q6_K with unsigned activations (a call of m > kStreamRows) through
// PrefillTileK whatever the tile's rows; otherwise decode-sized tiles as Tile (StreamedTile) and
// prefill-sized ones through PrefillTileK.
template <GgmlType T>
void TileK(const QuantizedRows& xq, int64_t m0, int64_t m1, const std::byte* w, int64_t row_bytes,
           int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  if constexpr (T == GgmlType::kQ6_K) {
    if (xq.unsigned_q) return PrefillTileK<T, true>(xq, m0, m1, wb, row_bytes, n0, n1, y, ldy);
  }
  if (m1 - m0 <= kStreamRows) {
    return StreamedTile<PolicyK<T>>(xq, m0, m1, wb, row_bytes, n0, n1, y, ldy);
  }
  PrefillTileK<T, false>(xq, m0, m1, wb, row_bytes, n0, n1, y, ldy);
}

template <GgmlType T>
Kernel KernelOf() {
  if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K || T == GgmlType::kQ6_K) {
    constexpr bool kUnsigned = T == GgmlType::kQ6_K;  // UnpackU6
    Kernel k{TileK<T>, PolicyK<T>::kBias, static_cast<int64_t>(sizeof(TileDG<T, kUnsigned>))};
    k.superblock = true;
    k.unsigned_prefill = kUnsigned;
    return k;
  } else {
    return Kernel{Tile<Policy<T>>, Policy<T>::kBias,
                  static_cast<int64_t>(sizeof(typename Policy<T>::DG))};
  }
}

}  // namespace
}  // namespace avx2

Kernel Avx2Kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return avx2::KernelOf<GgmlType::kQ4_0>();
    case GgmlType::kQ4_1:
      return avx2::KernelOf<GgmlType::kQ4_1>();
    case GgmlType::kQ5_0:
      return avx2::KernelOf<GgmlType::kQ5_0>();
    case GgmlType::kQ5_1:
      return avx2::KernelOf<GgmlType::kQ5_1>();
    case GgmlType::kQ8_0:
      return avx2::KernelOf<GgmlType::kQ8_0>();
    case GgmlType::kQ4_K:
      return avx2::KernelOf<GgmlType::kQ4_K>();
    case GgmlType::kQ5_K:
      return avx2::KernelOf<GgmlType::kQ5_K>();
    case GgmlType::kQ6_K:
      return avx2::KernelOf<GgmlType::kQ6_K>();
    case GgmlType::kMXFP4:
      return avx2::KernelOf<GgmlType::kMXFP4>();
    default:
      return Kernel{};
  }
}

namespace {

// The 32 weights of an MXFP4 block as four vectors of 8 floats (exact: kvalues · 2^(e - 128)).
inline void WidenMxfp4Block(const uint8_t* b, __m256 w[4]) {
  const __m256i v = _mm256_sub_epi8(_mm256_shuffle_epi8(avx2::Mxfp4Table(), avx2::Nibbles(b + 1)),
                                    _mm256_set1_epi8(12));
  // 2^(e - 128) (ggml's GGML_E8M0_TO_FP32_HALF) in general-purpose registers, then broadcast.
  const uint32_t e = b[0];
  const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
  const __m256 d = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(bits)));
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int p = 0; p < 4; ++p) {
    w[p] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p])), d);
  }
}

// Rows r < MR of x against NR MXFP4 weight rows (row c at rows + c * row_bytes), y[r * ldy + c],
// in invariant_linear.h's order: lane j of 16 sums t = j mod 16 in increasing t (lanes 0-7 in lo,
// 8-15 in hi), then the lane tree. MR x NR independent sums hide the FMA latency.
template <int MR, int NR>
void Mxfp4Block(const float* x, int64_t k, const uint8_t* rows, int64_t row_bytes, float* y,
                int64_t ldy) {
  __m256 lo[MR][NR], hi[MR][NR];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  }
  for (int64_t t = 0, off = 0; t < k; t += kBlock, off += 17) {
    for (int c = 0; c < NR; ++c) {
      __m256 w[4];
      WidenMxfp4Block(rows + c * row_bytes + off, w);
      for (int r = 0; r < MR; ++r) {
        const float* xr = x + r * k + t;
        lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), w[0], lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), w[1], hi[r][c]);
        lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 16), w[2], lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), w[3], hi[r][c]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      // InvariantLinear's Reduce: i + (i+8), then i + (i+4), i + (i+2), i + (i+1).
      const __m256 s8 = _mm256_add_ps(lo[r][c], hi[r][c]);
      const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
      const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      y[r * ldy + c] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
    }
  }
}

// Weight rows [n0, n1) against rows r0 .. r0 + MR of x, NR weight rows at a time, then one.
template <int MR, int NR>
void Mxfp4Rows(const float* x, int64_t k, const uint8_t* w, int64_t row_bytes, int64_t n0,
               int64_t n1, float* y, int64_t ldy) {
  int64_t j = n0;
  for (; j + NR <= n1; j += NR) Mxfp4Block<MR, NR>(x, k, w + j * row_bytes, row_bytes, y + j, ldy);
  for (; j < n1; ++j) Mxfp4Block<MR, 1>(x, k, w + j * row_bytes, row_bytes, y + j, ldy);
}

}  // namespace

void Avx2WidenMxfp4Row(const std::byte* row, int64_t k, float* dst) {
  const auto* b = reinterpret_cast<const uint8_t*>(row);
  for (int64_t i = 0; i < k; i += kBlock, b += 17, dst += kBlock) {
    __m256 w[4];
    WidenMxfp4Block(b, w);
    for (int p = 0; p < 4; ++p) _mm256_storeu_ps(dst + 8 * p, w[p]);
  }
}

void Avx2Mxfp4Rows(const float* x, int64_t m, int64_t k, const std::byte* w, int64_t n0, int64_t n1,
                   float* y, int64_t ldy) {
  const int64_t row_bytes = k / kBlock * 17;
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  for (int64_t r = 0; r < m; r += 4) {
    const float* xr = x + r * k;
    float* yr = y + r * ldy;
    switch (std::min<int64_t>(4, m - r)) {
      case 1:
        Mxfp4Rows<1, 4>(xr, k, wb, row_bytes, n0, n1, yr, ldy);
        break;
      case 2:
        Mxfp4Rows<2, 2>(xr, k, wb, row_bytes, n0, n1, yr, ldy);
        break;
      case 3:
        Mxfp4Rows<3, 1>(xr, k, wb, row_bytes, n0, n1, yr, ldy);
        break;
      default:
        Mxfp4Rows<4, 1>(xr, k, wb, row_bytes, n0, n1, yr, ldy);
    }
  }
}

}  // namespace quant_linear_internal
}  // namespace moebatch
