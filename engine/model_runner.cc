#include "engine/model_runner.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "cpu_attention/decode_attention.h"

namespace moebatch {

ModelRunner::ModelRunner(std::unique_ptr<Device> device) : device_(std::move(device)) {}

absl::Status ModelRunner::Forward(const ForwardBatch& batch, PagedKvCache& cache,
                                  std::vector<float>* logits, ForwardStats* stats) {
  const ModelConfig& c = config();
  const int64_t tokens = static_cast<int64_t>(batch.token_ids.size());
  const int64_t d = c.head_dim;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;

  // Validate the batch and derive every token's position.
  positions_.assign(tokens, -1);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const ForwardSequence& seq = batch.seqs[s];
    if (seq.num_tokens <= 0 || seq.token_start < 0 || seq.token_start + seq.num_tokens > tokens ||
        seq.context_len < seq.num_tokens || seq.block_table == nullptr ||
        BlocksForTokens(seq.context_len, cache.config().block_size) >
            static_cast<int64_t>(seq.block_table->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: sequence ", s, " is malformed"));
    }
    if (seq.context_len > c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: sequence ", s, " reaches position ", seq.context_len - 1,
                       " beyond max_position_embeddings ", c.max_position_embeddings));
    }
    for (int64_t i = 0; i < seq.num_tokens; ++i) {
      positions_[seq.token_start + i] = seq.context_len - seq.num_tokens + i;
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (positions_[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: token ", t, " has no sequence"));
    }
    if (batch.token_ids[t] < 0 || batch.token_ids[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", batch.token_ids[t], " outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }

  // Where each token's K/V goes and what each sequence attends over (the same in every layer).
  std::vector<AttentionSequence> attn_seqs;
  attn_seqs.reserve(batch.seqs.size());
  append_rows_.resize(static_cast<size_t>(tokens));
  for (const ForwardSequence& seq : batch.seqs) {
    for (int64_t i = 0; i < seq.num_tokens; ++i) {
      const int64_t t = seq.token_start + i;
      append_rows_[t] = KvAppendRow{seq.block_table->data(), positions_[t]};
    }
    attn_seqs.push_back(AttentionSequence{seq.block_table->data(), seq.token_start, seq.num_tokens,
                                          seq.context_len});
  }
  q_.resize(static_cast<size_t>(tokens * heads * d));
  k_.resize(static_cast<size_t>(tokens * kv_heads * d));
  v_.resize(static_cast<size_t>(tokens * kv_heads * d));
  attn_.resize(static_cast<size_t>(tokens * heads * d));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  constexpr int kMicroBatch = 0;  // one micro-batch per pass (VSLPipe's split: issue 6)
  Device& device = *device_;
  if (auto st = device.Embed(kMicroBatch, batch.token_ids.data(), positions_.data(), tokens);
      !st.ok()) {
    return st;
  }
  ForwardStats local_stats;
  local_stats.tokens = tokens;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (auto st = device.TaskA(kMicroBatch, layer, q_.data(), k_.data(), v_.data()); !st.ok()) {
      return st;
    }
    // The CPU task (MoE-Lens §6.6): K/V append, then attention of every token over its context.
    KvLayerView view;
    view.base = cache.LayerBase(layer);
    view.dtype = cache.config().dtype;
    view.num_kv_heads = kv_heads;
    view.head_dim = d;
    view.block_size = cache.config().block_size;
    view.block_stride_bytes = cache.block_stride_bytes();
    view.value_offset_bytes = cache.value_offset_bytes();
    AppendKv(view, append_rows_.data(), tokens, k_.data(), v_.data());
    PagedAttention(view, attn_seqs.data(), static_cast<int64_t>(attn_seqs.size()), q_.data(), heads,
                   scale, c.sliding_window, attn_.data());
    if (auto st = device.TaskB(kMicroBatch, layer, attn_.data(), &local_stats); !st.ok()) {
      return st;
    }
  }

  // Final norm and lm_head on the rows that need logits only.
  std::vector<int64_t> rows;
  for (const ForwardSequence& seq : batch.seqs) {
    if (seq.need_logits) rows.push_back(seq.token_start + seq.num_tokens - 1);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  logits->resize(static_cast<size_t>(n * c.vocab_size));
  if (auto st = device.Logits(kMicroBatch, rows.data(), n, logits->data()); !st.ok()) return st;
  if (stats != nullptr) *stats = local_stats;
  return absl::OkStatus();
}

}  // namespace moebatch
