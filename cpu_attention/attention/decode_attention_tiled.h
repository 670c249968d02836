// The heads-inner driver and the paced software prefetch shared by the tiled decode attention
// kernels of decode_attention_avx512.cc and decode_attention_avx2.cc. Include only from those
// files: everything here has internal linkage and is instantiated with each file's own vector
// code (see decode_attention_internal.h for why no inline symbol may cross ISA files). No std::
// templates, for the same reason.
#pragma once

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu_attention/attention/decode_attention_internal.h"

namespace moebatch {
namespace decode_attention_internal {
namespace {

// Largest head_dim of the tiled kernels; larger ones take the generic template. A KV head's state,
// [kMaxGroup][head_dim], must fit the driver's kMaxUnitFloats buffers.
constexpr int64_t kMaxTiledHeadDim = 256;
static_assert(kMaxGroup * kMaxTiledHeadDim <= kMaxUnitFloats, "tiled state exceeds the buffers");

// Prefetch: each 4 KiB K or V run of a block starts a new page, where the hardware prefetchers
// stop, so the kernels prefetch every line themselves. Each head-tile's lines are prefetched over
// the K::kPrefetchSpan head-tiles before it, starting K::kPrefetchFirst head-tiles ahead, a
// 1/kPrefetchSpan slice per head-tile, latest slice nearest; while one head-tile is computed,
// 2 x kPrefetchSpan pages (K and V) are being read at once (the read-only probe's lesson,
// bench/attention_bandwidth.cc: several pages read a KiB at a time go faster than whole runs one
// after another). The pacing matters as much as the addresses: the core has few line-fill
// buffers, and a prefetch that finds none free stalls it, so the queue of a head-tile
// (PrefetchQueue) is issued a K/V line pair per step of q . K and one per key row of each p.V
// pass (more for f32 rows), the rest after the tile. On the AVX-512 development host that read
// 16-31% faster (8 paired runs) than the same prefetches issued in four bursts, one per q . K step
// of 4 rows, and faster than spreading them over the q . K steps only or the p.V rows only; the
// AVX-512 kernel prefetches from 2 head-tiles ahead over 4, the AVX2 one (Zen 3's 32 KiB L1d) the
// whole next head-tile only (docs/performance.md).
constexpr int kMaxPrefetchSpan = 4;  // head-tiles ahead being prefetched at once, at most

// One head-tile's prefetches: slice span - 1 - k of head-tile k ahead (K lines at base[k], V lines
// value_offset further), taken round robin over k, `per_step` K/V line pairs per step; span =
// 1 << span_shift. The schedule was measured with bf16 or f16 rows of 128 elements (64 pairs per
// head-tile, one per step); per_step scales it to longer rows (f32: 2), so the share left for
// after the tile stays the same.
struct PrefetchQueue {
  const std::byte* base[kMaxPrefetchSpan] = {};
  size_t bytes[kMaxPrefetchSpan] = {};
  size_t value_offset = 0;
  int next = 0, total = 0;  // pairs issued, pairs in the queue (round robin: span x longest slice)
  int per_step = 1;         // pairs per Step(): total / 64, at least 1
  int span_shift = 0;       // log2 of the head-tiles in the queue

  inline void Step() { Issue(per_step); }
  inline void Issue(int pairs) {
    for (; pairs > 0 && next < total; --pairs, ++next) {
      const int k = next & ((1 << span_shift) - 1);
      const size_t at = static_cast<size_t>(next >> span_shift) * 64;
      if (at < bytes[k]) {
        _mm_prefetch(reinterpret_cast<const char*>(base[k] + at), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(base[k] + value_offset + at), _MM_HINT_T0);
      }
    }
  }
  void IssueRest() { Issue(total - next); }
};

// Natural order [d] -> "pair order" [d] and back, for kernels whose vectors hold kLanes floats:
// for bf16, per 2 x kLanes elements the even ones, then the odd ones (a bf16 pair in a 32-bit lane
// is widened by a shift and a mask, no shuffles); for f16 and f32 the natural order.
template <DType T, int kLanes>
inline void ToPairOrder(const float* in, int64_t d, float* out) {
  if constexpr (T == DType::kBF16) {
    for (int64_t c = 0; c < d; c += 2 * kLanes) {
      for (int i = 0; i < kLanes; ++i) {
        out[c + i] = in[c + 2 * i];
        out[c + kLanes + i] = in[c + 2 * i + 1];
      }
    }
  } else {
    for (int64_t i = 0; i < d; ++i) out[i] = in[i];
  }
}
template <DType T, int kLanes>
inline void FromPairOrder(const float* in, int64_t d, float* out) {
  if constexpr (T == DType::kBF16) {
    for (int64_t c = 0; c < d; c += 2 * kLanes) {
      for (int i = 0; i < kLanes; ++i) {
        out[c + 2 * i] = in[c + i];
        out[c + 2 * i + 1] = in[c + kLanes + i];
      }
    }
  } else {
    for (int64_t i = 0; i < d; ++i) out[i] = in[i];
  }
}

// Heads inner: the keys are walked in tiles of up to kTile keys within one KV block, and each tile
// is attended for every KV head of the work item in turn, each head with its own queries,
// accumulators and softmax state. A block's K runs of all KV heads are adjacent
// (engine/kv/kv_cache.h), so a work item of 8 KV heads reads each block as two 32 KiB sequential
// streams instead of one 4 KiB K run and one V run per item; the read-only probe of
// bench/attention_bandwidth.cc reads that order faster (docs/performance.md). The prefetches follow
// the same order: head-tile i = (tile, head) prefetches head-tiles i + K::kPrefetchFirst ..
// i + K::kPrefetchFirst + K::kPrefetchSpan - 1. Each head's arithmetic is exactly that of a
// one-head call. Same contract as AttendGroupFn (decode_attention_internal.h).
//
// K, the ISA's tile kernel, provides:
//   kLanes;                             floats per vector (the pair order's half width)
//   kPrefetchFirst, kPrefetchSpan;      the prefetch schedule (above; the span 1, 2 or 4)
//   using Sum;                          per-head running sum, one value per lane
//   static Sum ZeroSum(); static float ReduceSum(Sum);
//   template <DType T, int G> static void Tile(const std::byte* keys, size_t value_offset,
//       int64_t n, size_t row_bytes, int64_t d, PrefetchQueue& pq, const float* qp, float* acc,
//       float* m, Sum* l);          one tile of n keys for G query heads; issues pq, ends with
//                                   pq.IssueRest()
template <class K, DType T, int G>
void AttendHeadsTiled(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head,
                      int num_kv_heads, int64_t first, int64_t last, const float* q, float* acc_out,
                      float* m_out, float* l_out) {
  constexpr size_t elem = DTypeSize(T);
  const int64_t d = kv.head_dim;
  const int64_t bs = kv.block_size;
  const int64_t hd = G * d;  // floats of one KV head's state
  const size_t row_bytes = static_cast<size_t>(d) * elem;
  const size_t run_bytes = static_cast<size_t>(bs) * row_bytes;
  constexpr int kFirst = K::kPrefetchFirst, kSpan = K::kPrefetchSpan;
  static_assert(kSpan == 1 || kSpan == 2 || kSpan == 4, "the span: 1, 2 or 4 head-tiles");
  const size_t slice = static_cast<size_t>(kTile) * row_bytes / kSpan;  // per head-tile

  alignas(64) float qp[kMaxUnitFloats];
  alignas(64) float acc[kMaxUnitFloats];
  float m[kMaxUnitQueryHeads];
  typename K::Sum l[kMaxUnitQueryHeads];
  for (int64_t x = 0; x < num_kv_heads * G; ++x) {
    ToPairOrder<T, K::kLanes>(q + x * d, d, qp + x * d);
    m[x] = -__builtin_inff();
    l[x] = K::ZeroSum();
  }
  for (int64_t i = 0; i < num_kv_heads * hd; ++i) acc[i] = 0.0f;

  auto row_address = [&](int64_t j, int64_t head) {
    const int64_t block = j / bs;
    return kv.base + static_cast<size_t>(block_table[block]) * kv.block_stride_bytes +
           static_cast<size_t>(head) * run_bytes + static_cast<size_t>(j - block * bs) * row_bytes;
  };

  int64_t j = first;
  while (j <= last) {
    const int64_t off = j % bs;
    int64_t n = bs - off;
    if (n > kTile) n = kTile;
    if (n > last - j + 1) n = last - j + 1;
    for (int i = 0; i < num_kv_heads; ++i) {
      // Head-tiles ahead (tiles of up to kTile keys, as if aligned to blocks: an approximation
      // only when a chunk starts mid-block); head-tile k ahead gives its slice
      // kSpan - 1 - k.
      PrefetchQueue pq;
      pq.value_offset = kv.value_offset_bytes;
      pq.span_shift = kSpan == 4 ? 2 : kSpan == 2 ? 1 : 0;
      size_t longest = 0;
      for (int k = 0; k < kSpan; ++k) {
        const int idx = i + kFirst + k;
        const int64_t pj = j + static_cast<int64_t>(idx / num_kv_heads) * kTile;
        if (pj > last) break;
        int64_t pn = bs - pj % bs;
        if (pn > kTile) pn = kTile;
        if (pn > last - pj + 1) pn = last - pj + 1;
        const size_t from = static_cast<size_t>(kSpan - 1 - k) * slice;
        const size_t run = static_cast<size_t>(pn) * row_bytes;
        const size_t to = from + slice < run ? from + slice : run;
        if (to <= from) continue;
        pq.base[k] = row_address(pj, kv_head + idx % num_kv_heads) + from;
        pq.bytes[k] = to - from;
        if (to - from > longest) longest = to - from;
      }
      pq.total = static_cast<int>((longest + 63) / 64) * kSpan;
      pq.per_step = pq.total > 64 ? pq.total / 64 : 1;
      K::template Tile<T, G>(row_address(j, kv_head + i), kv.value_offset_bytes, n, row_bytes, d,
                             pq, qp + i * hd, acc + i * hd, m + i * G, l + i * G);
    }
    j += n;
  }
  for (int64_t x = 0; x < num_kv_heads * G; ++x) {
    FromPairOrder<T, K::kLanes>(acc + x * d, d, acc_out + x * d);
    m_out[x] = m[x];
    l_out[x] = K::ReduceSum(l[x]);
  }
}

}  // namespace
}  // namespace decode_attention_internal
}  // namespace moebatch
