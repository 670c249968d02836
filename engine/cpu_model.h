// The Mixtral forward pass on the cpu backend, over the paged KV cache.
//
// Follows transformers' modeling_mixtral.py (MixtralForCausalLM, 4.x) op for op:
//   h = embed_tokens[ids]
//   per layer: x = RMSNorm(h)                      (MixtralRMSNorm: fp32 variance, w * x)
//              q, k, v = x Wqᵀ, x Wkᵀ, x Wvᵀ; RoPE(q, k)   (rotate_half, inv_freq from rope_theta)
//              K/V written to the paged cache; attention over it (GQA, causal, sliding window)
//              h = h + attn Woᵀ
//              x = RMSNorm(h); router: softmax(x Wgᵀ) in fp32 -> top-k -> renormalise
//              h = h + sum_{e in top-k} w_e * W2_e (silu(W1_e x) * W3_e x) (MixtralSparseMoeBlock)
//   logits = RMSNorm(h) lm_headᵀ, for the last token of each sequence that asks for them.
// One pass may hold prefill chunks of many sequences of different lengths (no padding) and decode
// tokens of others: every token carries its own position and block table.
//
// Threading: Forward is called from one thread at a time; it parallelises inside with OpenMP and
// oneDNN. The Checkpoint must outlive the model (weights are read in place from its mapping).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cpu_attention/kv_append.h"
#include "engine/checkpoint.h"
#include "engine/kv_cache.h"
#include "engine/matmul.h"

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

struct CpuModelOptions {
  DType compute_dtype = DType::kF32;  // f32 (reference) or bf16 (see engine/matmul.h)
  // f32 mode: bytes of f32 weight copies kept between passes (see engine/matmul.h). 0 = convert
  // on every use.
  int64_t widened_weight_budget_bytes = int64_t{2} << 30;
};

// Per-pass counters the forward fills (for engine statistics and, later, S-MBU / S-MFU).
struct ForwardStats {
  int64_t tokens = 0;
  int64_t expert_token_pairs = 0;  // sum over layers of tokens routed to each expert (top-k each)
  int64_t experts_touched = 0;     // sum over layers of experts with at least one token
};

class CpuModel {
 public:
  static absl::StatusOr<std::unique_ptr<CpuModel>> Create(const Checkpoint& checkpoint,
                                                          const CpuModelOptions& options);
  ~CpuModel();

  // Runs all layers over `batch`, writing each token's K/V into `cache` at its position, and
  // returns in `logits` a [n, vocab] f32 row-major block, one row per sequence with need_logits (in
  // batch order). InvalidArgument for a token id outside the vocabulary or a malformed batch.
  absl::Status Forward(const ForwardBatch& batch, PagedKvCache& cache, std::vector<float>* logits,
                       ForwardStats* stats = nullptr);

  const ModelConfig& config() const { return checkpoint_.config(); }

 private:
  CpuModel(const Checkpoint& checkpoint, std::unique_ptr<Matmul> matmul);
  absl::Status Linear(const std::vector<float>& x, int64_t rows, const TensorInfo& w,
                      std::vector<float>* y);
  absl::Status AttentionBlock(int64_t layer, const ForwardBatch& batch, PagedKvCache& cache);
  absl::Status MoeBlock(int64_t layer, int64_t tokens, ForwardStats* stats);

  const Checkpoint& checkpoint_;
  std::unique_ptr<Matmul> matmul_;
  std::vector<std::vector<float>> input_norm_, post_norm_;  // per layer, f32 [hidden]
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  // Scratch, reused across passes.
  std::vector<float> h_, x_, q_, k_, v_, attn_, proj_, router_, moe_out_;
  std::vector<float> expert_in_, gate_, up_, expert_out_;
  std::vector<int64_t> positions_;
  std::vector<KvAppendRow> append_rows_;
};

}  // namespace moebatch
