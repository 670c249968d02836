// The engine: a model, its paged KV cache, the scheduler and per-request sampling, behind a small
// API that the offline runner, the daemon and the benchmarks share (see docs/architecture.md).
//
//   auto engine = Engine::Create(options);        // loads and validates the checkpoint + tokenizer
//   int64_t id = *engine->AddRequest({prompt_ids, sampling});
//   while (engine->HasUnfinished()) engine->Step(&outputs);   // one pass per call
//
// Threading: not thread-safe; one thread (the caller's, or the daemon's engine thread) calls
// everything. Step parallelises inside (OpenMP, oneDNN).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device.h"
#include "engine/engine_plan.h"
#include "engine/model/model_config.h"
#include "engine/plan/cpu_roofline.h"
#include "engine/sampler.h"
#include "engine/sparse_utilization.h"
#include "engine/text/tokenizer.h"

namespace moebatch {

// kError: the request failed (GenerationOutput::error says why); its output is an error line.
enum class FinishReason { kNone, kStop, kLength, kAborted, kError };
// "stop", "length", "aborted", "error" ("" for kNone): the OpenAI spelling where it has one.
const char* FinishReasonName(FinishReason reason);

// What one Step produced for one choice of one request (a request with SamplingParams::n > 1 has
// n choices, each finishing on its own: n final outputs per request).
struct GenerationOutput {
  int64_t request_id = 0;
  int32_t index = 0;                   // the choice, [0, n)
  std::vector<int32_t> new_token_ids;  // generated this step (EOS included when generated)
  // With SamplingParams::logprobs: one per new token id, in order (sampler.h's TokenLogprobs:
  // the raw logits' log-softmax; top_logprobs entries each).
  std::vector<TokenLogprob> new_logprobs;
  std::string new_text;  // text released this step (UTF-8 complete; never part of a
                         // stop string; EOS gives no text)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // generated so far
  // With FinishReason::kError: Internal, e.g. logits that were not finite (NaN or inf: broken
  // weights or computation; Engine::Step never samples from them).
  absl::Status error;
};

struct GenerationRequest {
  std::vector<int32_t> prompt_token_ids;  // BOS included when wanted (Tokenizer::Encode does)
  SamplingParams sampling;
};

struct EngineStats {
  std::string backend;  // the device's name: "cpu", "cuda"
  int64_t passes = 0;
  int64_t prefill_tokens = 0;  // tokens prefilled (re-prefill after preemption included)
  int64_t decode_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t requests_finished = 0;
  int64_t requests_failed = 0;  // finished with FinishReason::kError (non-finite logits)
  int64_t waiting = 0, running = 0;
  int64_t kv_blocks_total = 0, kv_blocks_free = 0;
  double forward_seconds = 0.0;  // wall time inside the model forward
  // Where the forward time went (ForwardStats summed over passes; device and CPU overlap under
  // VSLPipe): inside device calls, inside the CPU task, weight copies in flight.
  double device_seconds = 0.0, cpu_attention_seconds = 0.0, weight_transfer_seconds = 0.0;
  int64_t weight_bytes = 0;
  int64_t expert_token_pairs = 0, experts_touched = 0;  // routing, summed over layers and passes
  ForwardStats last_pass;
  SparseUtilization last_utilization;  // S-MBU / S-MFU of the last pass
  // Over all passes: activated weight + KV bytes and FLOPs (divide by forward_seconds for rates).
  double activated_bytes = 0, sparse_flops = 0;
};

class BlockAllocator;
class Checkpoint;
class JsonTokenMask;
class ModelRunner;
class PagedKvCache;
class PipelineTrace;
class Scheduler;
class WeightStore;

class Engine {
 public:
  // options -> plan -> load -> backend device -> KV cache: reads config.json and plans
  // (MakeEnginePlan's errors, NotFound for a backend not registered), loads the checkpoint
  // (Checkpoint::Load errors; with synthetic weights only config.json) and the tokenizer
  // (`<model_dir>/tokenizer.model`; NotFound "missing tokenizer"), places the weights (WeightStore
  // errors: ResourceExhausted when they and the KV cache exceed host_memory_bytes), creates the
  // backend's device and allocates the KV cache.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);

  // The plan of `options` without loading anything but config.json (what --dry_run prints).
  static absl::StatusOr<EnginePlan> Plan(const EngineOptions& options);
  ~Engine();

  // Queues a request; returns its id (increasing). InvalidArgument naming the field: empty prompt,
  // a token id outside the vocabulary, a prompt that leaves no room to generate within
  // max_context_tokens(), invalid sampling parameters, n above max_choices().
  // With n > 1 the prompt is prefilled once; then the sequence forks into n choices that share the
  // prompt's KV blocks (a partly filled last block is copied when a choice first writes to it) and
  // draw their first tokens from the same logits, each with its own generator (ChoiceSeed).
  absl::StatusOr<int64_t> AddRequest(GenerationRequest request);
  // The largest n a request may ask for: kMaxChoices, or fewer when the scheduler decodes fewer
  // sequences per pass (min(max_num_seqs, max_tokens_per_pass)).
  int32_t max_choices() const;
  // The most sequences one pass decodes: min(max_num_seqs, max_tokens_per_pass) of the plan.
  int64_t max_sequences_per_pass() const;

  // Runs one pass (or none when idle) and appends what it produced to `outputs`: every request that
  // generated tokens, finished or was aborted. Finished requests release their KV blocks at once.
  // Errors are internal (the model failed); requests stay queued. The first Step on a thread sizes
  // (and pins) that thread's CPU pool as the options ask.
  absl::Status Step(std::vector<GenerationOutput>* outputs);

  // Scores texts: for each sequence of token ids, the natural-log probability of ids[i] given
  // ids[0, i) for every i in [first, ids.size()), from one prefill of all of them (f32 logits,
  // log-softmax in f64): what perplexity needs (llama.cpp's llama-perplexity scores the second
  // half of each context this way). Returns one vector of ids.size() - first values per sequence.
  // Only while no request is in flight (FailedPrecondition otherwise). InvalidArgument for first
  // < 1 or >= a sequence's length, a token id outside the vocabulary, or more tokens in total
  // than the plan's tokens per pass or KV blocks hold (naming the limit). The KV blocks are
  // released before it returns.
  absl::StatusOr<std::vector<std::vector<double>>> ScoreTokens(
      const std::vector<std::vector<int32_t>>& sequences, int64_t first);

  // Stops a request (all its choices); their final outputs (FinishReason::kAborted) come from the
  // next Step. Unknown or finished ids are ignored.
  void Abort(int64_t request_id);

  bool HasUnfinished() const { return !sequences_.empty(); }
  EngineStats stats() const;
  const ModelConfig& config() const { return plan_.config; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const EngineOptions& options() const { return options_; }
  // What the engine runs: the backend's plan, the scheduler's limits as resolved from the options
  // (automatic values filled in, the token budget lowered to n_real on the cuda backend), the KV
  // cache.
  const EnginePlan& plan() const { return plan_; }
  const SchedulerConfig& schedule() const { return plan_.schedule; }
  // Writes the trace recorded so far to options().trace_file (FailedPrecondition when unset).
  absl::Status WriteTrace() const;
  // Longest sequence (prompt + generated) the engine can hold: min(max_position_embeddings,
  // KV blocks * block size).
  int64_t max_context_tokens() const { return plan_.max_context_tokens; }

 private:
  struct Sequence;
  Engine();
  void Finish(Sequence* seq, FinishReason reason, GenerationOutput* out);
  // A request's choices 1..n-1 out of its choice 0 after its prompt is prefilled: each shares its
  // KV blocks and is added to the running set. Returns them, in choice order.
  std::vector<Sequence*> Fork(Sequence* parent);
  // The sequence id of choice `choice` of request `request_id` (ids keep arrival order).
  static int64_t SequenceId(int64_t request_id, int32_t choice) {
    return request_id * kMaxChoices + choice;
  }
  // Appends a sampled token, applies the stop rules, fills `out`.
  void AcceptToken(Sequence* seq, int32_t token, GenerationOutput* out);
  // Puts the roofline of the pass just run (engine/plan/cpu_roofline.h) on its trace event.
  void AnnotatePass(const ForwardStats& pass, int64_t logits_rows);

  EngineOptions options_;
  EnginePlan plan_;
  std::thread::id cpu_pool_owner_;             // the thread whose pool ConfigureCpuThreads set up
  std::unique_ptr<Checkpoint> checkpoint_;     // mapped weights only (else null)
  std::unique_ptr<WeightStore> weight_store_;  // kHostCopy, kSynthetic
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int32_t>
      eos_token_ids_;  // ModelConfig::eos_token_ids: a sampled one ends the sequence
  // JSON mode's view of the vocabulary, built by the first json_object request (AddRequest).
  std::unique_ptr<JsonTokenMask> json_mask_;
  std::unique_ptr<PipelineTrace> trace_;
  // With a trace: the host's ceilings each pass's roofline is put against (--peak_memory_gbs /
  // --peak_tflops where given, else measured at start).
  HostCeilings roof_;
  std::unique_ptr<ModelRunner> model_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> sequences_;  // by SequenceId
  std::vector<int64_t> aborted_;
  int64_t next_id_ = 1;
  EngineStats stats_;
  std::vector<float> logits_;           // [sampled sequences of the pass, vocab]
  std::vector<int32_t> greedy_tokens_;  // [greedy sequences of the pass]
};

}  // namespace moebatch
