// Attention over the paged KV cache on the CPU: causal prefill chunks and decode tokens of many
// sequences in one call, GQA, optional sliding window (MoE-Lens §6.6 runs decode attention here).
//
// This is the portable reference kernel: fp32 accumulation, online softmax (flash-decoding style:
// one pass over the keys with a running max and sum). The AVX2 / AVX-512 kernels
// (decode_attention.h) have the same contract and are checked against this one.
//
// Math (transformers' eager_attention_forward for Mixtral): for query token at absolute position p
// of a sequence, head h, and its KV head g = h / (num_heads / num_kv_heads) (repeat_kv):
//   out[h] = sum_j softmax_j(scale * q[h] . K[g][j]) V[g][j],  over keys j with
//   max(0, p - window + 1) <= j <= p   (window = sliding_window, or unbounded when unset).
// With attention sinks (gpt-oss, modeling_gpt_oss.py's eager_attention_forward: a learned logit
// per query head concatenated to the scores, softmaxed with them, then dropped), the softmax's
// denominator gets one more term exp(sink[h] - max) that carries no value:
//   out[h] = sum_j exp(s_j - m) V[g][j] / (sum_j exp(s_j - m) + exp(sink[h] - m)).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "engine/model/dtype.h"

namespace moebatch {

// One layer's view of the KV cache (see engine/kv/kv_cache.h for the layout).
struct KvLayerView {
  std::byte* base = nullptr;  // block 0's keys for this layer (attention reads; AppendKv writes)
  DType dtype = DType::kF32;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  size_t block_stride_bytes = 0;  // block b's keys at base + b * block_stride_bytes
  size_t value_offset_bytes = 0;  // values at keys + value_offset_bytes
  // 0: a value row has head_dim values. > 0: the value is the key row's first value_dim values
  // (value_offset_bytes 0; MLA's latent cache, engine/kv/kv_cache.h): out gets value_dim values
  // per head, the rest of its head_dim row is written 0 (AppendKv stores no V).
  int64_t value_dim = 0;
};

// The queries of one sequence in this call: rows [query_start, query_start + num_queries) of q/out.
// They are the last num_queries tokens of the sequence's first `context_len` tokens, whose K/V
// must already be in the cache: query i sits at position context_len - num_queries + i.
struct AttentionSequence {
  const int32_t* block_table = nullptr;  // covers context_len tokens
  int64_t query_start = 0;
  int64_t num_queries = 0;
  int64_t context_len = 0;
};

// The factor an online softmax's accumulator is multiplied by at the end, from its running max
// `max` and sum `sum` (of exp(s - max)): 1 / sum, or with a sink logit 1 / (sum + exp(*sink -
// max)), computed as w / (sum w + 1), w = exp(max - sink), when the sink exceeds the max (so no
// exp overflows).
inline float SoftmaxNormalizer(float max, float sum, const float* sink) {
  if (sink == nullptr) return 1.0f / sum;
  if (*sink <= max) return 1.0f / (sum + std::exp(*sink - max));
  const float w = std::exp(max - *sink);
  return w / (sum * w + 1.0f);
}

// q: [tokens, num_heads, head_dim] f32; out: [tokens, num_heads, head_dim] f32 (rows not named by
// any sequence are left untouched; with kv.value_dim > 0 each head's first value_dim values are
// the output and the rest 0). scale: usually head_dim^-0.5 (MLA: ModelConfig::attention_scale).
// sinks: [num_heads] f32 sink logits (in the scaled scores' units), or null for none.
// Parallel over (query, head) with OpenMP; call from one thread.
void PagedAttentionReference(const KvLayerView& kv, const AttentionSequence* seqs, int64_t num_seqs,
                             const float* q, int64_t num_heads, float scale,
                             std::optional<int64_t> sliding_window, float* out,
                             const float* sinks = nullptr);

}  // namespace moebatch
