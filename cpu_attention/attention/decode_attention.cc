// Dispatch and work split for the hand-vectorised paged attention (decode_attention.h).
//
// Compiled for baseline x86-64: calls the kernel of the ISA
// runtime/cpu_isa.h picked, plans the work and merges chunk partials; the per-ISA files hold the
// kernels.
//
// Work items: (query row, KV heads) = a "unit" (or, when a KV head has more than kMaxGroup query
// heads, (query row, KV head) with its query heads taken kMaxGroup at a time over the same keys,
// so a chunk's K/V bytes come from memory once and from the core's caches for the next subgroups:
// MLA's latent cache, one KV head for 16-128 query heads), split into chunks of
// kChunkTokens keys when longer (always, so results do not depend on the batch): the split
// over (sequence, KV head, chunk), with as many KV heads per unit as the thread count allows. A
// unit with one chunk writes its accumulators straight into `out` and normalises them; chunked
// units write (max, sum, acc) partials that a second parallel pass merges (flash-decoding). Head
// dims the kernel's vector width does not divide fall back to PagedAttentionReference.
#include "cpu_attention/attention/decode_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu_attention/attention/decode_attention_internal.h"
#include "spdlog/spdlog.h"

namespace moebatch {

namespace {

namespace dai = decode_attention_internal;

constexpr int64_t kChunkTokens = 512;

// Work items wanted per thread before units take several KV heads (dynamic scheduling evens out
// the rest).
constexpr int64_t kMinItemsPerThread = 4;

struct Unit {
  const int32_t* block_table;
  const float* q;  // [num_kv_heads][group][head_dim], unscaled
  float* out;      // [num_kv_heads][group][head_dim]
  int64_t kv_head, first, last;
  int num_kv_heads, group;  // group: query heads per KV head, all of them (may exceed kMaxGroup)
  int64_t first_partial, num_chunks;  // float offset of its chunk partials (num_chunks 1: none)
  int64_t partial_floats;             // floats per chunk partial: m, l [q heads], acc [q heads][d]
};

struct Chunk {
  int64_t unit, first, last;
  int64_t partial;  // float offset of its partial, -1 when writing straight to out
};

}  // namespace

void PagedAttention(CpuIsa isa, const KvLayerView& kv, const AttentionSequence* seqs,
                    int64_t num_seqs, const float* q, int64_t num_heads, float scale,
                    std::optional<int64_t> sliding_window, float* out, const float* sinks) {
  dai::PagedAttentionWith(isa, isa == CpuIsa::kAvx512 && CpuAmxUsable(), kv, seqs, num_seqs, q,
                          num_heads, scale, sliding_window, out, sinks);
}

void dai::PagedAttentionWith(CpuIsa isa, bool amx, const KvLayerView& kv,
                             const AttentionSequence* seqs, int64_t num_seqs, const float* q,
                             int64_t num_heads, float scale, std::optional<int64_t> sliding_window,
                             float* out, const float* sinks) {
  dai::AttendGroupFn kernel = nullptr;
  int64_t lanes = 1;
  if (isa == CpuIsa::kAvx2) {
    kernel = dai::AttendGroupAvx2;
    lanes = 8;
  } else if (isa == CpuIsa::kAvx512) {
    kernel = dai::AttendGroupAvx512;
    lanes = 16;
  }
  const int64_t d = kv.head_dim;
  if (kernel == nullptr || d <= 0 || d % lanes != 0 || kv.num_kv_heads <= 0 ||
      num_heads % kv.num_kv_heads != 0 || kv.value_dim % lanes != 0) {
    PagedAttentionReference(kv, seqs, num_seqs, q, num_heads, scale, sliding_window, out, sinks);
    return;
  }
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t num_kv = kv.num_kv_heads;
  // MLA's bf16 latent cache on AMX tiles: kAmxHeads query heads per kernel call.
  const bool use_amx = amx && isa == CpuIsa::kAvx512 && dai::MlaAmxApplies(kv, num_heads);
  const int64_t max_sub = use_amx ? dai::kAmxHeads : dai::kMaxGroup;

  // Key ranges of the query rows, and how many chunks each is split into: every key range longer
  // than kChunkTokens is split at fixed multiples of kChunkTokens, whatever the batch or thread
  // count, so a row's result is bitwise the same whatever else shares the call (batch invariance,
  // cpu_attention/gemm/invariant_linear.h says why). Splitting only when there are few units would
  // make the softmax's summation order depend on the batch.
  struct RowRange {
    const int32_t* block_table;
    int64_t row, first, last, chunks;
  };
  std::vector<RowRange> rows;
  int64_t row_chunks = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const AttentionSequence& seq = seqs[s];
    for (int64_t i = 0; i < seq.num_queries; ++i) {
      const int64_t pos = seq.context_len - seq.num_queries + i;
      const int64_t first = sliding_window ? std::max<int64_t>(0, pos - *sliding_window + 1) : 0;
      const int64_t chunks = (pos - first + kChunkTokens) / kChunkTokens;
      rows.push_back({seq.block_table, seq.query_start + i, first, pos, chunks});
      row_chunks += chunks;
    }
  }
  if (rows.empty()) return;

  // KV heads per unit: all of a row's (heads inner in the tiled kernels: each KV block read as
  // two sequential streams), within the kernels' per-unit state, and halved while there are fewer
  // than kMinItemsPerThread work items per thread. Each head's bits do not depend on it.
  int64_t heads_per_unit = 1;
  if (group <= dai::kMaxGroup) {
    heads_per_unit = std::min({num_kv, dai::kMaxUnitQueryHeads / group,
                               std::max<int64_t>(1, dai::kMaxUnitFloats / (group * d))});
    const int64_t want = kMinItemsPerThread * omp_get_max_threads();
    while (heads_per_unit > 1 &&
           row_chunks * ((num_kv + heads_per_unit - 1) / heads_per_unit) < want) {
      heads_per_unit = (heads_per_unit + 1) / 2;
    }
  }

  // Units: (row, KV heads [h, h + heads_per_unit)), or (row, one KV head) whose query heads the
  // work item takes kMaxGroup at a time when group > kMaxGroup.
  std::vector<Unit> units;
  for (const RowRange& r : rows) {
    for (int64_t g = 0; g < num_kv; g += heads_per_unit) {
      const int64_t head = g * group;
      Unit u;
      u.block_table = r.block_table;
      u.q = q + (r.row * num_heads + head) * d;
      u.out = out + (r.row * num_heads + head) * d;
      u.kv_head = g;
      u.num_kv_heads = static_cast<int>(std::min(heads_per_unit, num_kv - g));
      u.first = r.first;
      u.last = r.last;
      u.group = static_cast<int>(group);
      u.first_partial = 0;
      u.num_chunks = r.chunks;
      u.partial_floats = static_cast<int64_t>(u.num_kv_heads) * u.group * (2 + d);
      units.push_back(u);
    }
  }

  // Chunks, and their partials: per chunk m[q heads], l[q heads], acc[q heads][d].
  std::vector<Chunk> chunks;
  int64_t partial_floats_total = 0;
  for (int64_t u = 0; u < static_cast<int64_t>(units.size()); ++u) {
    Unit& unit = units[u];
    if (unit.num_chunks == 1) {
      chunks.push_back({u, unit.first, unit.last, -1});
      continue;
    }
    unit.first_partial = partial_floats_total;
    for (int64_t c = 0; c < unit.num_chunks; ++c) {
      const int64_t f = unit.first + c * kChunkTokens;
      chunks.push_back({u, f, std::min(unit.last, f + kChunkTokens - 1), partial_floats_total});
      partial_floats_total += unit.partial_floats;
    }
  }
  std::vector<float> partials(static_cast<size_t>(partial_floats_total));

  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  const int64_t scratch = std::max<int64_t>(dai::kMaxUnitFloats, max_sub * d);
#pragma omp parallel
  {
    std::vector<float> qs(static_cast<size_t>(scratch));
    float m[dai::kMaxUnitQueryHeads], l[dai::kMaxUnitQueryHeads];
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < num_chunks; ++c) {
      const Chunk& chunk = chunks[c];
      const Unit& unit = units[chunk.unit];
      const int64_t q_heads = static_cast<int64_t>(unit.num_kv_heads) * unit.group;
      // Subgroups of at most kMaxGroup query heads (kAmxHeads on AMX; one subgroup when group <=
      // kMaxGroup: all the unit's KV heads in one call), over the same keys.
      for (int64_t h0 = 0; h0 < unit.group; h0 += max_sub) {
        const int sub = unit.group <= dai::kMaxGroup
                            ? unit.group
                            : static_cast<int>(std::min<int64_t>(max_sub, unit.group - h0));
        const int64_t sub_heads = unit.group <= dai::kMaxGroup ? q_heads : sub;
        const int64_t n = sub_heads * d;
        const float* uq = unit.q + h0 * d;
        for (int64_t x = 0; x < n; ++x) qs[x] = uq[x] * scale;
        const bool direct = chunk.partial < 0;
        float* p = direct ? nullptr : partials.data() + chunk.partial;
        // Accumulators, max and sum: straight into `out` (normalised below) or the partial.
        float* o0 = direct ? unit.out + h0 * d : p + 2 * q_heads + h0 * d;
        float* mo = direct ? m : p + h0;
        float* lo = direct ? l : p + q_heads + h0;
        if (use_amx) {
          dai::AttendMlaAmx(kv, unit.block_table, chunk.first, chunk.last, qs.data(), o0, mo, lo);
        } else {
          kernel(kv, unit.block_table, unit.kv_head, unit.num_kv_heads, chunk.first, chunk.last,
                 qs.data(), sub, o0, mo, lo);
        }
        if (direct) {
          // The unit's first query head of this subgroup: kv_head * group + h0.
          const float* unit_sinks =
              sinks != nullptr ? sinks + unit.kv_head * unit.group + h0 : nullptr;
          for (int64_t h = 0; h < sub_heads; ++h) {
            const float inv =
                SoftmaxNormalizer(m[h], l[h], unit_sinks != nullptr ? unit_sinks + h : nullptr);
            float* o = o0 + h * d;
            for (int64_t x = 0; x < d; ++x) o[x] *= inv;
          }
        }
      }
    }
  }
  if (partial_floats_total == 0) return;

  // Merge the chunk partials of each split unit.
  const int64_t num_units = static_cast<int64_t>(units.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < num_units; ++u) {
    const Unit& unit = units[u];
    if (unit.num_chunks == 1) continue;
    const int64_t q_heads = static_cast<int64_t>(unit.num_kv_heads) * unit.group;
    for (int64_t h = 0; h < q_heads; ++h) {
      float mx = -INFINITY;
      for (int64_t c = 0; c < unit.num_chunks; ++c) {
        mx = std::max(mx, partials[unit.first_partial + c * unit.partial_floats + h]);
      }
      float* o = unit.out + h * d;
      std::fill(o, o + d, 0.0f);
      float sum = 0.0f;
      for (int64_t c = 0; c < unit.num_chunks; ++c) {
        const float* p = partials.data() + unit.first_partial + c * unit.partial_floats;
        const float w = std::exp(p[h] - mx);
        sum += p[q_heads + h] * w;
        const float* acc = p + 2 * q_heads + h * d;
        for (int64_t x = 0; x < d; ++x) o[x] += w * acc[x];
      }
      const float* sink = sinks != nullptr ? sinks + unit.kv_head * unit.group + h : nullptr;
      const float inv = SoftmaxNormalizer(mx, sum, sink);
      for (int64_t x = 0; x < d; ++x) o[x] *= inv;
    }
  }
}

}  // namespace moebatch
