// MLA decode attention on AMX tiles (AMX-TILE + AMX-BF16 with AVX-512 F/BW/VL/DQ/BF16), called
// only where runtime/cpu_isa.h's CpuAmxUsable() holds; compiled with those flags (CMakeLists.txt).
//
// Why tiles: DeepSeek's latent cache is MQA-shaped (one 576-value row per token for 16 or 128
// query heads), so its decode attention does 16 x 2 x (576 + 512) FLOP per 1,152-byte bf16 row,
// 30 FLOP per byte: no f32 FMA kernel can read it at the memory's rate (docs/performance.md, "MLA's
// latent cache"). One TDPBF16PS does 16 x 16 x 32 multiply-adds; the products here are full tiles:
//   scores  S^T [16 keys, 16 heads] = K [16 keys, 32 dims] x Q^T [32 dims, 16 heads], 18 steps
//           over 576 dims. K tiles load straight from the cache (16 rows of a KV block, the row
//           stride the tile's); Q^T is packed once per call in the VNNI pair layout.
//   p.V     O [16 heads, 16 values] += P [16 heads, 32 keys] x V [32 keys, 16 values]. V's VNNI
//           layout pairs two keys' values, so each 32-key step's rows are interleaved once
//           (vpunpck{l,h}wd: a tile holds the values 8i..8i+3 or 8i+4..8i+7 of 32; the output
//           columns are put back in order at the end).
// Accuracy: the cache is bf16 already; the f32 query and probabilities are each split into bf16
// hi + lo parts (x = hi + lo + O(2^-17 x)) and both parts multiplied, so the result matches the
// f32 kernels to ~1e-5 relative, not bf16's 4e-3.
//
// Per call (one query row, 16 query heads, the keys of one chunk of decode_attention.cc), one pass
// over the keys in 32-key steps with an online softmax. Per step: the scores (the step's rows
// loaded as K tiles straight from the cache; four accumulators, the step's two key tiles times Q
// hi and lo), the step's exp and P tiles, then O += P V over the value columns, 32 at a time: the
// two rows of each key pair are interleaved into a small ring one column block ahead of the tiles
// that load it, and O lives in a per-thread buffer of output tiles that each step loads and stores
// back, alternating between two accumulator pairs so one block's loads do not wait for the
// previous block's products. The next step's rows are prefetched into L2 while this step computes,
// half during q . K and half during P V. The max used for the exponentials only moves where a
// score passes it by more than kSlack (softmax does not depend on the shift; exp(s - max) <= e^16
// stays far inside f32's and bf16's range), so O is rescaled about once per call, at the first
// step. The buffers: about 200 KiB per thread, allocated at a thread's first call.
//
// Where the time goes (docs/performance.md, "MLA decode attention on AMX tiles"): ~3x the AVX-512
// FMA kernel and 1.2-1.35x a two-pass form (every score first, then P V with each output tile held
// in a register over the whole chunk, its V interleaved into an L2 buffer), but not the memory's
// rate: the row fetches are hidden in part only, and per step the q . K tiles take ~40% (their
// tile loads from L2), P V with its output tiles' round trips through L2 ~45%, the softmax ~15%.
// Tile registers are not renamed, so a tile load waits until the products reading the previous
// contents are done; the working set of a step (Q hi/lo 36 KiB, O 32 KiB, the rows 36 KiB) does
// not fit L1. Measured no faster on the development VM: 64-key steps (Q's tiles loaded once per 64
// keys, O's once per 64), hi and lo accumulated in one tile, software prefetch of O's and the
// rows' lines into L1, copying the rows into contiguous tiles first, interleaving V inside the
// q . K loop, other prefetch orders and distances (docs).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "cpu_attention/attention/decode_attention_avx512_ops.h"
#include "cpu_attention/attention/decode_attention_internal.h"

namespace moebatch {
namespace decode_attention_internal {
namespace {

constexpr int kHeads = kAmxHeads;  // 16: S^T's columns, P's and O's rows
constexpr int kStep = 32;          // keys per step: two score tiles, one p.V reduction step
constexpr float kSlack = 16.0f;    // how far a score may pass the max in use before it moves
constexpr int kVRing = 4;          // V tile blocks in flight (a ring)

// The palette-1 tile configuration (Intel SDM, LDTILECFG): every tile used is 16 rows of 64
// bytes (16 f32, or 32 bf16 = 16 VNNI pairs).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles: 0-3 accumulators (S^T of the step's two key tiles times Q hi and lo; then O's two column
// halves times P hi and lo); 4, 5 A operands (the K tiles; then P hi, P lo); 6, 7 B operands (Q^T
// hi, lo; then V's halves).
inline void ConfigureTiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// 16 x 16 32-bit transpose in registers: r[i] lane j <-> r[j] lane i.
inline void Transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // r[4i + c], 128-bit lane L: column 4L + c of rows 4i .. 4i + 3.
  __m512i out[16];
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    const __m512i y0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    out[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    out[8 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    out[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = out[i];
}

// 32 f32 (a: the first 16, b: the next 16) -> 32 bf16 hi (round to nearest even) and the 32 bf16
// of the remainders lo = x - hi.
inline __m512i AsInt(__m512bh x) { return (__m512i)x; }

inline void SplitBf16(__m512 a, __m512 b, __m512i& hi, __m512i& lo) {
  hi = AsInt(_mm512_cvtne2ps_pbh(b, a));
  const __m512 ha =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
  const __m512 hb = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
  lo = AsInt(_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha)));
}

// One column block of O += P V: O's two tiles (o[half]) in tiles C0 and C1, zeroed at the first
// step, else loaded; V's two tiles (vt[half]) in tiles 6 and 7; P hi and lo already in tiles 4 and
// 5. A macro because the tile numbers are spliced into the instructions' text (amxtileintrin.h's
// intrinsics are macros that stringify them).
#define MOEBATCH_ACCUMULATE_PV(C0, C1, first, o, vt) \
  do {                                               \
    if (first) {                                     \
      _tile_zero(C0);                                \
      _tile_zero(C1);                                \
    } else {                                         \
      _tile_loadd(C0, (o)[0], 64);                   \
      _tile_loadd(C1, (o)[1], 64);                   \
    }                                                \
    _tile_loadd(6, (vt)[0], 64);                     \
    _tile_loadd(7, (vt)[1], 64);                     \
    _tile_dpbf16ps(C0, 4, 6);                        \
    _tile_dpbf16ps(C1, 4, 7);                        \
    _tile_dpbf16ps(C0, 5, 6);                        \
    _tile_dpbf16ps(C1, 5, 7);                        \
    _tile_stored(C0, (o)[0], 64);                    \
    _tile_stored(C1, (o)[1], 64);                    \
  } while (0)

// Per-thread buffers, sized for head_dim, value_dim <= kAmxMaxDim.
struct Buffers {
  // Q^T in VNNI pairs: [head_dim / 32 steps][hi, lo][16 pair rows][16 heads] dwords.
  alignas(64) uint32_t q[kAmxMaxDim / 32][2][16][kHeads];
  alignas(64) uint16_t stage[2][16][kAmxMaxDim];  // key tiles that are not 16 rows of one block
  alignas(64) float sp[2][2][16][kHeads];         // a step's S^T tiles: [keys 0-15, 16-31][hi, lo]
  alignas(64) uint16_t p[2][kHeads][kStep];       // a step's P in bf16: [hi, lo][16 heads][keys]
  // A column block's V tiles (two keys' values interleaved), a ring of kVRing blocks.
  alignas(64) uint16_t v[kVRing][2][16][32];
  // O as output tiles: [value_dim / 32 blocks][half][16 heads][16 columns] f32; tile half's
  // column c is value 8 (c / 4) + c % 4 + 4 half of the block (vpunpck{l,h}wd's order).
  alignas(64) float o[kAmxMaxDim / 32][2][kHeads][16];
};

Buffers& ThreadBuffers() {
  thread_local std::unique_ptr<Buffers> buffers(new Buffers);
  return *buffers;
}

}  // namespace

void AttendMlaAmx(const KvLayerView& kv, const int32_t* block_table, int64_t first, int64_t last,
                  const float* q, float* acc, float* m_out, float* l_out) {
  Buffers& buf = ThreadBuffers();
  const int64_t d = kv.head_dim;
  const int64_t dv = kv.value_dim;
  const int64_t bs = kv.block_size;
  const int64_t n = last - first + 1;
  const int64_t steps = (n + kStep - 1) / kStep;
  const int64_t dsteps = d / 32;
  const int64_t vblocks = dv / 32;
  const size_t row_bytes = static_cast<size_t>(d) * 2;
  ConfigureTiles();

  // Q^T hi/lo in VNNI pairs: head h's bf16 row viewed as dwords (pairs of dims) is column h.
  for (int64_t ks = 0; ks < dsteps; ++ks) {
    __m512i hi[16], lo[16];
    for (int h = 0; h < kHeads; ++h) {
      const float* qh = q + h * d + ks * 32;
      SplitBf16(_mm512_loadu_ps(qh), _mm512_loadu_ps(qh + 16), hi[h], lo[h]);
    }
    Transpose16(hi);
    Transpose16(lo);
    for (int r = 0; r < 16; ++r) {
      _mm512_store_si512(buf.q[ks][0][r], hi[r]);
      _mm512_store_si512(buf.q[ks][1][r], lo[r]);
    }
  }

  // The key rows of step st (nullptr past the last key).
  auto step_rows = [&](int64_t st, const std::byte** rows) {
    for (int i = 0; i < kStep; ++i) {
      const int64_t t = st * kStep + i;
      if (t < n) {
        const int64_t j = first + t;
        const int64_t block = j / bs;
        rows[i] = kv.base + static_cast<size_t>(block_table[block]) * kv.block_stride_bytes +
                  static_cast<size_t>(j - block * bs) * row_bytes;
      } else {
        rows[i] = nullptr;
      }
    }
  };

  // The max in use and the sum of exp(s - max), per head.
  __m512 mx = _mm512_set1_ps(-__builtin_inff());
  __m512 sum = _mm512_setzero_ps();
  const std::byte* rows_buf[2][kStep];
  step_rows(0, rows_buf[0]);
  for (int64_t st = 0; st < steps; ++st) {
    const std::byte** rows = rows_buf[st & 1];
    const std::byte** next = rows_buf[(st + 1) & 1];
    if (st + 1 < steps) {
      step_rows(st + 1, next);
    } else {
      for (int i = 0; i < kStep; ++i) next[i] = nullptr;
    }
    // The step's two key tiles: 16 consecutive rows of one block load straight from the cache;
    // other tiles (block sizes not a multiple of 16, a range that starts mid-block, the last
    // keys) are staged. A tile with no key is all zeros.
    const std::byte* base[2];
    size_t stride[2];
    for (int half = 0; half < 2; ++half) {
      const std::byte** tr = rows + half * 16;
      if (tr[15] != nullptr && tr[15] == tr[0] + 15 * row_bytes) {
        base[half] = tr[0];
        stride[half] = row_bytes;
        continue;
      }
      for (int i = 0; i < 16; ++i) {
        if (tr[i] != nullptr) {
          std::memcpy(buf.stage[half][i], tr[i], row_bytes);
        } else {
          std::memset(buf.stage[half][i], 0, row_bytes);
        }
      }
      base[half] = reinterpret_cast<const std::byte*>(buf.stage[half]);
      stride[half] = sizeof(buf.stage[half][0]);
    }

    // Scores. Four independent accumulators (keys 0-15 and 16-31, times Q hi and lo): a chain of
    // TDPBF16PS into one tile waits for each one's latency. A tile load waits for its 16 rows'
    // lines, and the hardware prefetchers do not follow 16 rows read 64 bytes at a time across
    // blocks and pages, so the kernel prefetches the next step's rows into L2 itself, spread over
    // the whole step so the memory streams under all of its arithmetic: the first key tile's rows
    // during q . K (line ks of each at step ks), the second's during P V.
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t ks = 0; ks < dsteps; ++ks) {
      for (int i = 0; i < 16; ++i) {
        if (next[i] != nullptr) {
          _mm_prefetch(reinterpret_cast<const char*>(next[i] + ks * 64), _MM_HINT_T1);
        }
      }
      _tile_loadd(4, base[0] + ks * 64, stride[0]);
      _tile_loadd(6, buf.q[ks][0], 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, base[1] + ks * 64, stride[1]);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(7, buf.q[ks][1], 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, buf.sp[0][0], 64);
    _tile_stored(1, buf.sp[0][1], 64);
    _tile_stored(2, buf.sp[1][0], 64);
    _tile_stored(3, buf.sp[1][1], 64);
    __m512 s[kStep];
    __m512 smax = _mm512_set1_ps(-__builtin_inff());
    for (int i = 0; i < kStep; ++i) {
      s[i] = rows[i] == nullptr ? _mm512_set1_ps(-__builtin_inff())
                                : _mm512_add_ps(_mm512_load_ps(buf.sp[i / 16][0][i % 16]),
                                                _mm512_load_ps(buf.sp[i / 16][1][i % 16]));
      smax = _mm512_max_ps(smax, s[i]);
    }

    // The max in use moves for the heads where a score passes it by more than kSlack (all of
    // them at the first step); their sum and O rows are rescaled by exp(old max - new max).
    const __mmask16 moved =
        _mm512_cmp_ps_mask(smax, _mm512_add_ps(mx, _mm512_set1_ps(kSlack)), _CMP_GT_OQ);
    if (moved != 0) {
      const __m512 new_mx = _mm512_mask_max_ps(mx, moved, mx, smax);
      const __m512 alpha = Avx512Ops::Exp(_mm512_sub_ps(mx, new_mx));  // 0 where mx was -inf
      sum = _mm512_mul_ps(sum, alpha);
      if (st > 0) {
        alignas(64) float a[kHeads];
        _mm512_store_ps(a, alpha);
        for (int h = 0; h < kHeads; ++h) {
          if (((moved >> h) & 1) == 0) continue;
          const __m512 ah = _mm512_set1_ps(a[h]);
          for (int64_t cb = 0; cb < vblocks; ++cb) {
            for (int half = 0; half < 2; ++half) {
              float* row = buf.o[cb][half][h];
              _mm512_store_ps(row, _mm512_mul_ps(ah, _mm512_load_ps(row)));
            }
          }
        }
      }
      mx = new_mx;
    }

    // p = exp(s - max), l += p; P^T [16 heads, 32 keys] in bf16 hi/lo.
    __m512i pt[2][16];
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < 16; ++i) {
        const __m512 p = Avx512Ops::Exp(_mm512_sub_ps(s[half * 16 + i], mx));
        sum = _mm512_add_ps(sum, p);
        pt[half][i] = _mm512_castps_si512(p);
      }
      Transpose16(pt[half]);  // pt[half][h]: head h's p over the 16 keys
    }
    for (int h = 0; h < kHeads; ++h) {
      __m512i hi, lo;
      SplitBf16(_mm512_castsi512_ps(pt[0][h]), _mm512_castsi512_ps(pt[1][h]), hi, lo);
      _mm512_store_si512(buf.p[0][h], hi);
      _mm512_store_si512(buf.p[1][h], lo);
    }
    _tile_loadd(4, buf.p[0], 64);
    _tile_loadd(5, buf.p[1], 64);

    // O += P V, one block of 32 value columns at a time; the value rows of keys 2r and 2r + 1
    // interleaved (zeros past the last key) one block ahead of the tile loads that read them.
    auto interleave = [&](int64_t cb) {
      uint16_t(*vt)[16][32] = buf.v[cb % kVRing];
      for (int r = 0; r < 16; ++r) {
        const std::byte* a = rows[2 * r];
        const std::byte* b = rows[2 * r + 1];
        const __m512i va = a ? _mm512_loadu_si512(a + cb * 64) : _mm512_setzero_si512();
        const __m512i vb = b ? _mm512_loadu_si512(b + cb * 64) : _mm512_setzero_si512();
        _mm512_store_si512(vt[0][r], _mm512_unpacklo_epi16(va, vb));
        _mm512_store_si512(vt[1][r], _mm512_unpackhi_epi16(va, vb));
      }
    };
    interleave(0);
    for (int64_t cb = 0; cb < vblocks; ++cb) {
      if (cb + 1 < vblocks) interleave(cb + 1);
      // The next step's second key tile: lines [cb, cb + 1) x dsteps / vblocks of each row.
      for (int64_t c = cb * dsteps / vblocks; c < (cb + 1) * dsteps / vblocks; ++c) {
        for (int i = 16; i < kStep; ++i) {
          if (next[i] != nullptr) {
            _mm_prefetch(reinterpret_cast<const char*>(next[i] + c * 64), _MM_HINT_T1);
          }
        }
      }
      const uint16_t(*vt)[16][32] = buf.v[cb % kVRing];
      float(*o)[kHeads][16] = buf.o[cb];
      // Accumulator pairs (0, 1) for even blocks, (2, 3) for odd ones.
      if (cb % 2 == 0) {
        MOEBATCH_ACCUMULATE_PV(0, 1, st == 0, o, vt);
      } else {
        MOEBATCH_ACCUMULATE_PV(2, 3, st == 0, o, vt);
      }
    }
  }
  _mm512_storeu_ps(m_out, mx);
  _mm512_storeu_ps(l_out, sum);

  // O's tiles back in column order: tile 0's column c is value 8 (c / 4) + c % 4 of the block,
  // tile 1's the same + 4.
  const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i hi_idx =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t cb = 0; cb < vblocks; ++cb) {
    for (int h = 0; h < kHeads; ++h) {
      const __m512 x0 = _mm512_load_ps(buf.o[cb][0][h]);
      const __m512 x1 = _mm512_load_ps(buf.o[cb][1][h]);
      float* o = acc + h * d + cb * 32;
      _mm512_storeu_ps(o, _mm512_permutex2var_ps(x0, lo_idx, x1));
      _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(x0, hi_idx, x1));
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int64_t x = dv; x < d; x += 16) _mm512_storeu_ps(acc + h * d + x, _mm512_setzero_ps());
  }
  _tile_release();
}

#undef MOEBATCH_ACCUMULATE_PV

}  // namespace decode_attention_internal
}  // namespace moebatch
