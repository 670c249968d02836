#include "cpu_attention/attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moebatch {
namespace {

// Element i of a K/V row stored as `T`; a compile-time type so the inner loops carry no branch.
template <DType T>
inline float LoadElement(const std::byte* p, int64_t i) {
  if constexpr (T == DType::kF32) {
    return reinterpret_cast<const float*>(p)[i];
  } else if constexpr (T == DType::kBF16) {
    return BF16ToF32(reinterpret_cast<const uint16_t*>(p)[i]);
  } else {
    return F16ToF32(reinterpret_cast<const uint16_t*>(p)[i]);
  }
}

// Attention of one query row for one head: online softmax over the keys [first, last].
template <DType T>
void AttendOne(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head, int64_t first,
               int64_t last, const float* q, float scale, const float* sink, float* out,
               float* acc) {
  const int64_t d = kv.head_dim;
  const int64_t dv = kv.value_dim > 0 ? kv.value_dim : d;
  constexpr size_t elem = DTypeSize(T);
  const size_t head_offset = static_cast<size_t>(kv_head) * kv.block_size * d * elem;
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  std::fill(acc, acc + d, 0.0f);
  for (int64_t j = first; j <= last; ++j) {
    const std::byte* key = kv.base + block_table[j / kv.block_size] * kv.block_stride_bytes +
                           head_offset + static_cast<size_t>(j % kv.block_size) * d * elem;
    const std::byte* value = key + kv.value_offset_bytes;
    float s = 0.0f;
    for (int64_t i = 0; i < d; ++i) s += q[i] * LoadElement<T>(key, i);
    s *= scale;
    if (s > running_max) {
      const float correction = std::exp(running_max - s);  // 0 on the first key
      running_sum *= correction;
      for (int64_t i = 0; i < dv; ++i) acc[i] *= correction;
      running_max = s;
    }
    const float p = std::exp(s - running_max);
    running_sum += p;
    for (int64_t i = 0; i < dv; ++i) acc[i] += p * LoadElement<T>(value, i);
  }
  const float inv = SoftmaxNormalizer(running_max, running_sum, sink);
  for (int64_t i = 0; i < dv; ++i) out[i] = acc[i] * inv;
  for (int64_t i = dv; i < d; ++i) out[i] = 0.0f;
}

}  // namespace

void PagedAttentionReference(const KvLayerView& kv, const AttentionSequence* seqs, int64_t num_seqs,
                             const float* q, int64_t num_heads, float scale,
                             std::optional<int64_t> sliding_window, float* out,
                             const float* sinks) {
  // Flatten (sequence, query) into rows so the parallel loop balances prefill and decode.
  std::vector<std::pair<int64_t, int64_t>> rows;  // (sequence index, query index)
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t i = 0; i < seqs[s].num_queries; ++i) rows.emplace_back(s, i);
  }
  const int64_t d = kv.head_dim;
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t work = static_cast<int64_t>(rows.size()) * num_heads;
#pragma omp parallel
  {
    std::vector<float> acc(d);
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < work; ++w) {
      const auto [s, i] = rows[w / num_heads];
      const int64_t h = w % num_heads;
      const AttentionSequence& seq = seqs[s];
      const int64_t pos = seq.context_len - seq.num_queries + i;
      const int64_t first = sliding_window ? std::max<int64_t>(0, pos - *sliding_window + 1) : 0;
      const int64_t row = seq.query_start + i;
      auto attend = kv.dtype == DType::kF32    ? AttendOne<DType::kF32>
                    : kv.dtype == DType::kBF16 ? AttendOne<DType::kBF16>
                                               : AttendOne<DType::kF16>;
      attend(kv, seq.block_table, h / group, first, pos, q + (row * num_heads + h) * d, scale,
             sinks != nullptr ? sinks + h : nullptr, out + (row * num_heads + h) * d, acc.data());
    }
  }
}

}  // namespace moebatch
