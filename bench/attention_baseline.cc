// The auto-vectorised baseline of bench_attention_bandwidth: a copy of the portable
// decode attention (PagedAttentionReference, cpu_attention/attention/paged_attention.cc: scalar
// loops, fp32 accumulation, online softmax, parallel over (query, head) with OpenMP) that
// bench/CMakeLists.txt compiles at -O3 once per vector ISA (AVX-512 F/BW/VL+FMA+F16C, and
// AVX2+FMA+F16C), each copy under its own function name (MOEBATCH_BASELINE_NAME). That gives the
// compiler the same instructions the hand kernel uses, so the comparison measures hand
// vectorisation, not ISA. Strict IEEE order is kept (no -ffast-math, like the library build), so
// the q.K dot product stays a sequential reduction; the acc updates vectorise.
//
// Only the bench calls these, and only on a CPU that has the copy's ISA
// (__builtin_cpu_supports). Everything here is file-local and uses no inline or template function
// of a shared header (no std::vector, no std::optional, no BF16ToF32): a weak symbol compiled with
// AVX-512 flags could otherwise be picked by the linker for the rest of the program.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu_attention/attention/paged_attention.h"

#ifndef MOEBATCH_BASELINE_NAME
#error "compile with -DMOEBATCH_BASELINE_NAME=<function name> (see bench/CMakeLists.txt)"
#endif

namespace moebatch {
namespace {

inline float Bf16ToF32Local(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline int64_t MaxLocal(int64_t a, int64_t b) { return a > b ? a : b; }

enum class Elem { kF32, kBF16, kF16 };

template <Elem T>
inline float LoadElement(const std::byte* p, int64_t i) {
  if constexpr (T == Elem::kF32) {
    return reinterpret_cast<const float*>(p)[i];
  } else if constexpr (T == Elem::kBF16) {
    return Bf16ToF32Local(reinterpret_cast<const uint16_t*>(p)[i]);
  } else {
    return F16ToF32(
        reinterpret_cast<const uint16_t*>(p)[i]);  // out of line in engine/model/dtype.cc
  }
}

// Attention of one query row for one head: online softmax over the keys [first, last]
// (the same statements as the reference's AttendOne).
template <Elem T>
void AttendOne(const KvLayerView& kv, const int32_t* block_table, int64_t kv_head, int64_t first,
               int64_t last, const float* q, float scale, float* out, float* acc) {
  const int64_t d = kv.head_dim;
  constexpr size_t elem = T == Elem::kF32 ? 4 : 2;
  const size_t head_offset = static_cast<size_t>(kv_head) * kv.block_size * d * elem;
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  for (int64_t i = 0; i < d; ++i) acc[i] = 0.0f;
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
      for (int64_t i = 0; i < d; ++i) acc[i] *= correction;
      running_max = s;
    }
    const float p = std::exp(s - running_max);
    running_sum += p;
    for (int64_t i = 0; i < d; ++i) acc[i] += p * LoadElement<T>(value, i);
  }
  const float inv = 1.0f / running_sum;
  for (int64_t i = 0; i < d; ++i) out[i] = acc[i] * inv;
}

struct Row {
  int64_t seq;
  int64_t query;
};

}  // namespace

// Same contract as PagedAttentionReference (cpu_attention/attention/paged_attention.h), except the
// window: sliding_window <= 0 means none (a plain integer, so no std::optional code is emitted
// here).
void MOEBATCH_BASELINE_NAME(const KvLayerView& kv, const AttentionSequence* seqs, int64_t num_seqs,
                            const float* q, int64_t num_heads, float scale, int64_t sliding_window,
                            float* out) {
  int64_t num_rows = 0;
  for (int64_t s = 0; s < num_seqs; ++s) num_rows += seqs[s].num_queries;
  Row* rows = static_cast<Row*>(std::malloc(sizeof(Row) * (num_rows > 0 ? num_rows : 1)));
  int64_t r = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t i = 0; i < seqs[s].num_queries; ++i) rows[r++] = Row{s, i};
  }
  const int64_t d = kv.head_dim;
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t work = num_rows * num_heads;
  const bool windowed = sliding_window > 0;
  const int64_t window = sliding_window;
#pragma omp parallel
  {
    float* acc = static_cast<float*>(std::malloc(sizeof(float) * d));
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < work; ++w) {
      const Row row_id = rows[w / num_heads];
      const int64_t h = w % num_heads;
      const AttentionSequence& seq = seqs[row_id.seq];
      const int64_t pos = seq.context_len - seq.num_queries + row_id.query;
      const int64_t first = windowed ? MaxLocal(0, pos - window + 1) : 0;
      const int64_t row = seq.query_start + row_id.query;
      const float* q_row = q + (row * num_heads + h) * d;
      float* out_row = out + (row * num_heads + h) * d;
      if (kv.dtype == DType::kF32) {
        AttendOne<Elem::kF32>(kv, seq.block_table, h / group, first, pos, q_row, scale, out_row,
                              acc);
      } else if (kv.dtype == DType::kBF16) {
        AttendOne<Elem::kBF16>(kv, seq.block_table, h / group, first, pos, q_row, scale, out_row,
                               acc);
      } else {
        AttendOne<Elem::kF16>(kv, seq.block_table, h / group, first, pos, q_row, scale, out_row,
                              acc);
      }
    }
    std::free(acc);
  }
  std::free(rows);
}

}  // namespace moebatch
