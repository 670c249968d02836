// The forward pass over the paged KV cache, the same for every backend: drives a Device (tasks A
// and B, engine/device.h) layer by layer and runs the CPU task between them: new K/V rows into the
// cache (cpu_attention/attention/kv_append.h) and attention over it
// (cpu_attention/attention/decode_attention.h), MoE-Lens §6.4 / §6.6.
//
// One pass may hold prefill chunks of many sequences of different lengths (no padding) and decode
// tokens of others: every token carries its own position and block table.
//
// VSLPipe (MoE-Lens §6.4, Fig. 8-9), on by default for passes of two or more sequences: the
// sequences are split into micro-batches alpha and beta, balanced in tokens, and run as a software
// pipeline: a prologue (A_0(alpha); then C_0(alpha) beside A_0(beta)), N-1 stages of two phases
//   phase 1:  CPU C_i(beta)        beside  device B_i(alpha), A_{i+1}(alpha)
//   phase 2:  CPU C_{i+1}(alpha)   beside  device B_i(beta),  A_{i+1}(beta)
// and an epilogue (C_{N-1}(beta) beside B_{N-1}(alpha); then B_{N-1}(beta)), where A/B are the
// device's tasks and C the CPU task of a layer for a micro-batch. In each phase the CPU task runs
// on the runner's worker thread while the calling thread drives the device; they meet at the
// phase's end. Each micro-batch computes exactly what the plain pass computes for its tokens
// (attention and K/V of a sequence never depend on other sequences), so the tokens are the same.
//
// Prefill attention on the device (MoE-Lens §6.4): when the device AttendsPrefill(), a sequence
// whose rows in the pass are its whole context (a prompt prefilled in one chunk) is attended by
// the device in task A; its rows go last in their micro-batch, and the CPU task only appends their
// K/V. Other sequences (decode tokens, later chunks of a chunked prefill) are attended on the CPU.
//
// Threading: Forward is called from one thread at a time; it parallelises inside with OpenMP (the
// worker thread has its own OpenMP team of the caller's size). The device and the cache must
// outlive the call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "cpu_attention/attention/kv_append.h"
#include "cpu_attention/attention/paged_attention.h"
#include "engine/device.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/host_memory.h"
#include "engine/pipeline_trace.h"

namespace moebatch {

// The tokens of one sequence in a pass: rows [token_start, token_start + num_tokens) of the batch,
// the last num_tokens of its first context_len tokens (so the first sits at position
// context_len - num_tokens). Its block tables must already cover context_len tokens, from the first
// key its first token reads on (position context_len - num_tokens - window + 1 for a table kept to
// a window; the entries before it may be kNoBlock).
struct ForwardSequence {
  const std::vector<int32_t>* block_table = nullptr;
  int64_t token_start = 0;
  int64_t num_tokens = 0;
  int64_t context_len = 0;
  bool need_logits = false;  // produce logits for its last token in this pass
  // With need_logits and not greedy: logits for its last num_logits rows (in [1, num_tokens]),
  // in row order: what scoring a text needs (Engine::ScoreTokens).
  int64_t num_logits = 1;
  // With need_logits: produce its greedy token instead of its logits (Device::GreedyTokens), so
  // the device moves one token id rather than a row of vocab_size logits.
  bool greedy = false;
  // The window group's block table (engine/kv/kv_cache.h), for a cache with two layer groups.
  const std::vector<int32_t>* window_block_table = nullptr;
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [tokens]
  std::vector<ForwardSequence> seqs;
};

struct ModelRunnerOptions {
  bool vslpipe = true;  // two micro-batches in a pipeline when the pass has >= 2 sequences
};

class ModelRunner {
 public:
  explicit ModelRunner(std::unique_ptr<Device> device, ModelRunnerOptions options = {});
  ~ModelRunner();

  // Runs all layers over `batch`, writing each token's K/V into `cache` at its position, and
  // returns in `logits` a [n, vocab] f32 row-major block, num_logits rows per sequence with
  // need_logits and not greedy (in batch order), and in `greedy_tokens` one token per sequence with
  // need_logits and greedy (in batch order; may be null when there are none). InvalidArgument for a
  // token id outside the vocabulary, a position beyond max_position_embeddings or a malformed batch
  // (naming the sequence or token); the device's errors otherwise.
  absl::Status Forward(const ForwardBatch& batch, PagedKvCache& cache, std::vector<float>* logits,
                       ForwardStats* stats = nullptr,
                       std::vector<int32_t>* greedy_tokens = nullptr);

  Device& device() { return *device_; }
  const ModelConfig& config() const { return device_->config(); }
  const ModelRunnerOptions& options() const { return options_; }
  // Records every device call and CPU task of later passes into `trace` (null: stop). The trace
  // must outlive its use.
  void SetTrace(PipelineTrace* trace) { trace_ = trace; }
  // Micro-batches of the last Forward (1: plain pass, 2: VSLPipe).
  int last_micro_batches() const { return last_micro_batches_; }

 private:
  // One micro-batch's share of the pass, in its own row numbering.
  struct MicroBatch {
    std::vector<int32_t> token_ids;
    std::vector<int64_t> positions;
    std::vector<KvAppendRow> append_rows;
    std::vector<AttentionSequence> attn_seqs;  // attended on the CPU
    // The same rows and sequences with the window block tables, for the window group's layers.
    std::vector<KvAppendRow> window_append_rows;
    std::vector<AttentionSequence> window_attn_seqs;
    std::vector<int32_t> prefill_cu_rows;  // segments the device attends (empty: none)
    std::vector<int64_t> logit_rows;       // rows of this micro-batch that need logits
    std::vector<size_t> logit_outputs;     // their row in the pass's logits
    std::vector<int64_t> greedy_rows;      // rows that need their greedy token
    std::vector<size_t> greedy_outputs;    // their index in the pass's greedy tokens
    std::vector<int32_t> greedy_tokens;
    // Task A outputs, attention output: the device's host_buffer_allocator() memory.
    HostBuffer<float> q, k, v, attn;
    HostBuffer<float> logits;  // sampled rows' logits in micro-batch order (the device's memory)
    int64_t tokens() const { return static_cast<int64_t>(token_ids.size()); }
  };

  // A thread that runs the CPU task of a phase while the caller drives the device.
  class PhaseWorker {
   public:
    explicit PhaseWorker(int omp_threads);
    ~PhaseWorker();
    void Start(std::function<void()> task);
    void Wait();

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::function<void()> task_;
    bool busy_ = false, stop_ = false;
    std::thread thread_;
  };

  absl::Status Plan(const ForwardBatch& batch, const PagedKvCache& cache, int micro_batches);
  void CpuTask(int64_t layer, MicroBatch& mb, PagedKvCache& cache);
  // Runs a device call, adding its time to stats->device_seconds and to the trace.
  template <typename F>
  absl::Status DeviceCall(const char* name, int64_t layer, int micro_batch, ForwardStats* stats,
                          F&& call);
  absl::Status RunPlain(PagedKvCache& cache, ForwardStats* stats);
  absl::Status RunPipelined(PagedKvCache& cache, ForwardStats* stats);

  std::unique_ptr<Device> device_;  // declared before the buffers its allocator frees
  ModelRunnerOptions options_;
  MicroBatch micro_batches_[kMaxMicroBatches];
  int num_micro_batches_ = 1;
  int last_micro_batches_ = 0;
  std::unique_ptr<PhaseWorker> worker_;
  PipelineTrace* trace_ = nullptr;
  int64_t window_layers_ = 0;  // layers attending config().sliding_window only (ForwardStats)
  double cpu_seconds_ = 0;     // CPU task time of the current pass (one thread at a time writes it)
};

}  // namespace moebatch
