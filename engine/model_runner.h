// The forward pass over the paged KV cache, the same for every backend: drives a Device (tasks A
// and B, engine/device.h) layer by layer and runs the CPU task between them: new K/V rows into the
// cache (cpu_attention/kv_append.h) and attention over it (cpu_attention/decode_attention.h),
// MoE-Lens §6.4 / §6.6.
//
// One pass may hold prefill chunks of many sequences of different lengths (no padding) and decode
// tokens of others: every token carries its own position and block table.
//
// Threading: Forward is called from one thread at a time; it parallelises inside with OpenMP. The
// device and the cache must outlive the call.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "cpu_attention/kv_append.h"
#include "engine/device.h"
#include "engine/kv_cache.h"

namespace moebatch {

// The tokens of one sequence in a pass: rows [token_start, token_start + num_tokens) of the batch,
// the last num_tokens of its first context_len tokens (so the first sits at position
// context_len - num_tokens). Its block table must already cover context_len tokens.
struct ForwardSequence {
  const std::vector<int32_t>* block_table = nullptr;
  int64_t token_start = 0;
  int64_t num_tokens = 0;
  int64_t context_len = 0;
  bool need_logits = false;  // produce logits for its last token in this pass
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [tokens]
  std::vector<ForwardSequence> seqs;
};

class ModelRunner {
 public:
  explicit ModelRunner(std::unique_ptr<Device> device);

  // Runs all layers over `batch`, writing each token's K/V into `cache` at its position, and
  // returns in `logits` a [n, vocab] f32 row-major block, one row per sequence with need_logits (in
  // batch order). InvalidArgument for a token id outside the vocabulary, a position beyond
  // max_position_embeddings or a malformed batch (naming the sequence or token); the device's
  // errors otherwise.
  absl::Status Forward(const ForwardBatch& batch, PagedKvCache& cache, std::vector<float>* logits,
                       ForwardStats* stats = nullptr);

  Device& device() { return *device_; }
  const ModelConfig& config() const { return device_->config(); }

 private:
  std::unique_ptr<Device> device_;
  // Scratch, reused across passes.
  std::vector<int64_t> positions_;
  std::vector<float> q_, k_, v_, attn_;
  std::vector<KvAppendRow> append_rows_;
};

}  // namespace moebatch
