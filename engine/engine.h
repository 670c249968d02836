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
#include "engine/model/checkpoint.h"
#include "engine/kv/kv_cache.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sparse_utilization.h"
#include "engine/text/tokenizer.h"
#include "engine/model/weight_store.h"

namespace moebatch {

// The cpu backend's tokens per pass when EngineOptions::max_tokens_per_pass is 0.
inline constexpr int64_t kCpuTokensPerPass = 2048;

struct EngineOptions {
  std::string model_dir;              // Hugging Face directory: config.json, safetensors,
                                      // tokenizer.model
  DType compute_dtype = DType::kF32;  // f32 (reference) or bf16
  std::optional<DType> kv_dtype;      // KV cache element type; default: the compute dtype
  int64_t kv_block_size = 16;         // token slots per KV block
  // Host memory for the KV cache (bytes). 0: what the host memory budget leaves after the weights
  // (host_memory_bytes, else 90% of MemAvailable), less 1 GiB and the pass's host buffers at their
  // largest (MoE-Lens §5.1: KV capacity bounds
  // throughput, so use the memory there is).
  int64_t kv_cache_bytes = int64_t{1} << 30;
  // Prefill + decode tokens per pass, the ceiling (MoE-Lens §6.2-6.3). 0 (automatic): on the cuda
  // backend AutomaticTokensPerPass (engine/offload/gpu_memory_plan.h: what the GPU budget holds
  // activations for, capped); on the cpu backend kCpuTokensPerPass. The cuda backend lowers the
  // scheduler's budget to the profiler's n_real (profile_token_budget) and sizes the GPU
  // activations for that budget.
  int64_t max_tokens_per_pass = 0;
  // Sequences holding KV at once. 0 (automatic): no limit but the token budget's, so the decode
  // tokens of a pass can fill it (engine/scheduler.h: SchedulerConfigFor).
  int64_t max_num_seqs = 0;
  // f32 compute with bf16/f16 weights: host bytes for f32 weight copies kept between passes
  // (cpu_attention/gemm/matmul.h); beyond it weights are widened on every use.
  int64_t widened_weight_budget_bytes = int64_t{2} << 30;
  // The cpu backend's matmuls in a fixed order per row (cpu_attention/gemm/invariant_linear.h), so a greedy
  // request's tokens do not depend on what else shares its passes (a restart after a crash, another
  // max_num_seqs). CPU attention is batch-invariant always (cpu_attention/attention/decode_attention.h). The
  // cuda backend's cuBLAS GEMMs are not covered. false: oneDNN matmuls (faster prefill).
  bool batch_invariant = true;
  // The CPU thread pool (cpu_attention/runtime/cpu_threads.h) of the thread that calls Step: threads
  // (0: one per CPU this process may use), and whether thread i is pinned to the i-th such CPU.
  int cpu_threads = 0;
  bool pin_cpu_threads = false;
  // Where the weights live (engine/model/weight_store.h):
  //   kMapped     the checkpoint's safetensors files, read in place (memory-mapped)
  //   kHostCopy   copied into one contiguous host region per layer (what the cuda backend streams)
  //   kSynthetic  generated from model_dir/config.json, no safetensors needed (benchmarks):
  //               synthetic_layers of them (0: all), values a function of synthetic_seed
  enum class WeightSource { kMapped, kHostCopy, kSynthetic };
  WeightSource weights = WeightSource::kMapped;
  int64_t synthetic_layers = 0;
  uint64_t synthetic_seed = 0;
  std::optional<DType> weight_dtype;  // kHostCopy / kSynthetic: stored dtype (default: the model's)
  // Host memory the weights (kHostCopy, kSynthetic) and the KV cache must fit in, bytes;
  // 0: MemAvailable. Checked before anything large is allocated.
  int64_t host_memory_bytes = 0;
  // Where tasks A and B run (engine/device.h): kCpu (cpu_attention/backend/cpu_device.h) or kCuda
  // (cuda/cuda_backend.h: the weights go to pinned host memory, kMapped becoming kHostCopy, in
  // the GPU's compute dtype unless weight_dtype says otherwise, and stream to the GPU per layer).
  enum class Backend { kCpu, kCuda };
  Backend backend = Backend::kCpu;
  int gpu_device = 0;
  int64_t gpu_memory_bytes = 0;  // the GPU budget; 0: the device's free memory less 1 GiB
  int64_t weight_packet_bytes = int64_t{64} << 20;  // the data mover's packet
  // cuda: layers kept on the GPU for good, the first ones (the rest stream through the two slots);
  // -1: as many as the GPU budget leaves room for beside the pass's buffers (engine/
  // gpu_memory_plan.h: MaxResidentLayers), saving r / L of every pass's weight transfer.
  int64_t gpu_resident_layers = -1;
  // VSLPipe (engine/model_runner.h): passes of two or more sequences run as two micro-batches in
  // a CPU/device pipeline. nullopt: on for the cuda backend, off for the cpu backend, whose device
  // tasks share the CPU with attention (measured slower with it: docs/performance.md).
  std::optional<bool> vslpipe;
  // cuda: run the pipeline profiler (engine/offload/pipeline_profiler.h, MoE-Lens §6.3) at start-up and cap
  // the scheduler's tokens per pass at its n_real (max_tokens_per_pass stays the ceiling the GPU
  // memory is planned for). Profiles are cached under profile_dir when it is set.
  bool profile_token_budget = true;
  // Peaks for MoE-CAP's S-MBU / S-MFU (engine/sparse_utilization.h): the bandwidth of the memory
  // weights and KV are read from (bytes/s) and the compute of the GEMMs (FLOP/s); 0: unknown.
  double peak_memory_bytes_per_second = 0;
  double peak_flops = 0;
  std::string profile_dir;
  // When set: every pass's device calls and CPU tasks are recorded and written to this file as a
  // Chrome trace (chrome://tracing, Perfetto) when the engine is destroyed or WriteTrace is called.
  std::string trace_file;
};

// "mapped", "host", "synthetic" (the --weights flag's spelling); nullopt for anything else.
std::optional<EngineOptions::WeightSource> WeightSourceFromString(std::string_view name);

enum class FinishReason { kNone, kStop, kLength, kAborted };
// "stop", "length", "aborted" ("" for kNone): the OpenAI spelling.
const char* FinishReasonName(FinishReason reason);

// What one Step produced for one request.
struct GenerationOutput {
  int64_t request_id = 0;
  std::vector<int32_t> new_token_ids;  // generated this step (EOS included when generated)
  std::string new_text;                // text released this step (UTF-8 complete; never part of a
                                       // stop string; EOS gives no text)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // generated so far
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

class Engine {
 public:
  // Loads the checkpoint (Checkpoint::Load errors; with synthetic weights only config.json), the
  // tokenizer (`<model_dir>/tokenizer.model`; NotFound "missing tokenizer"), places the weights
  // (WeightStore errors: ResourceExhausted when they and the KV cache exceed host_memory_bytes),
  // builds the model and allocates the KV cache (InvalidArgument when kv_cache_bytes holds less
  // than one block).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  // Queues a request; returns its id (increasing). InvalidArgument naming the field: empty prompt,
  // a token id outside the vocabulary, a prompt that leaves no room to generate within
  // max_context_tokens(), invalid sampling parameters.
  absl::StatusOr<int64_t> AddRequest(GenerationRequest request);

  // Runs one pass (or none when idle) and appends what it produced to `outputs`: every request that
  // generated tokens, finished or was aborted. Finished requests release their KV blocks at once.
  // Errors are internal (the model failed); requests stay queued. The first Step on a thread sizes
  // (and pins) that thread's CPU pool as the options ask.
  absl::Status Step(std::vector<GenerationOutput>* outputs);

  // Stops a request; its final output (FinishReason::kAborted) comes from the next Step. Unknown
  // or finished ids are ignored.
  void Abort(int64_t request_id);

  bool HasUnfinished() const { return !sequences_.empty(); }
  EngineStats stats() const;
  const ModelConfig& config() const { return model_->config(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const EngineOptions& options() const { return options_; }
  // The scheduler's limits as resolved from the options (automatic values filled in, the token
  // budget lowered to n_real on the cuda backend).
  const SchedulerConfig& schedule() const { return scheduler_->config(); }
  // Writes the trace recorded so far to options().trace_file (FailedPrecondition when unset).
  absl::Status WriteTrace() const;
  // Longest sequence (prompt + generated) the engine can hold: min(max_position_embeddings,
  // KV blocks * block size).
  int64_t max_context_tokens() const { return max_context_; }

 private:
  struct Sequence;
  Engine() = default;
  void Finish(Sequence* seq, FinishReason reason, GenerationOutput* out);
  // Appends a sampled token, applies the stop rules, fills `out`.
  void AcceptToken(Sequence* seq, int32_t token, GenerationOutput* out);

  EngineOptions options_;
  std::thread::id cpu_pool_owner_;             // the thread whose pool ConfigureCpuThreads set up
  std::unique_ptr<Checkpoint> checkpoint_;     // null with synthetic weights
  std::unique_ptr<WeightStore> weight_store_;  // kHostCopy, kSynthetic
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PipelineTrace> trace_;
  std::unique_ptr<ModelRunner> model_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> sequences_;
  std::vector<int64_t> aborted_;
  int64_t next_id_ = 1;
  int64_t max_context_ = 0;
  EngineStats stats_;
  std::vector<float> logits_;           // [sampled sequences of the pass, vocab]
  std::vector<int32_t> greedy_tokens_;  // [greedy sequences of the pass]
};

}  // namespace moebatch
