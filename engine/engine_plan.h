// What the engine is asked for (EngineOptions, grouped by concern) and what it will do about it
// (EnginePlan): the backend's plan (engine/backend.h), the weights' bytes and where they live, the
// scheduler's limits and the KV cache, all computed from the options and the model's config.json
// before a weight is read. Engine::Create runs options -> plan -> load -> backend device -> KV
// cache; `moebatch-run --dry_run`, `moebatchd --dry_run` and `moebatch-plan --model DIR` print the
// plan and stop.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/dtype.h"
#include "engine/model/model_config.h"
#include "engine/scheduler.h"

namespace moebatch {

// The cpu backend's tokens per pass when the options leave it automatic.
inline constexpr int64_t kCpuTokensPerPass = 2048;

struct EngineOptions {
  // Hugging Face directory: config.json (+ generation_config.json), safetensors, and
  // tokenizer.json (+ tokenizer_config.json) or tokenizer.model.
  std::string model_dir;
  // A registered backend (engine/backend.h): "cpu", "cuda", or "auto" (the first automatic one
  // with a device: the cpu backend until the cuda backend has been validated on a GPU).
  std::string backend = "cpu";

  struct Text {
    // The chat layout of /v1/chat/completions requests, a name of engine/text/chat_layout.h's
    // ChatLayoutFromName; empty: the one recognised in the model's chat template.
    std::string chat_template;
  } text;

  struct Weights {
    // The backend may override it (the cuda backend streams from host regions: kMapped becomes
    // kHostCopy).
    WeightSource source = WeightSource::kMapped;
    // kHostCopy / kSynthetic: stored dtype (nullopt: the model's; the cuda backend: the GPU's
    // compute dtype).
    std::optional<DType> dtype;
    // kHostCopy / kSynthetic: the weight matrices quantized at load (int8 / int4,
    // engine/model/weight_store.h WeightQuantization); the other tensors take `dtype`.
    std::optional<WeightQuantization> quantize;
    int64_t synthetic_layers = 0;  // kSynthetic: layers generated (0: all)
    uint64_t synthetic_seed = 0;   // kSynthetic: the values are a function of it
    // Check every weight for NaN and infinity at load (engine/model/weight_check.h: one pass over
    // the weights' bytes); the loader checks the small tensors always.
    bool verify = false;
  } weights;

  // The cpu backend's math and the CPU thread pool every CPU task shares (attention included).
  struct Cpu {
    DType compute_dtype = DType::kF32;  // f32 (reference) or bf16
    // Matmuls in a fixed order per row (cpu_attention/gemm/invariant_linear.h), so a greedy
    // request's tokens do not depend on what else shares its passes (a restart after a crash,
    // another max_num_seqs). CPU attention is batch-invariant always. false: each matmul's
    // faster path for its size (oneDNN for prefill-sized ones, cpu_attention/gemm/matmul.h).
    bool batch_invariant = true;
    // A Hugging Face checkpoint's MXFP4 experts (ModelConfig::mxfp4_experts): widened exactly
    // with f32 activations (InvariantLinearMxfp4: transformers' results) or, false, with int8
    // activations as a GGUF file's (QuantLinear: llama.cpp's method, faster).
    bool mxfp4_f32_activations = true;
    // Q8_0 weights (GGUF, or the load-time int8 store): QuantLinear's int8 activations
    // (llama.cpp's method) or, true, widened exactly with f32 activations (InvariantLinearQ8_0:
    // the dequantized model's math; faster where int8 has no VNNI); unset: the host's faster one
    // (cpu_attention/backend/cpu_device.h, DefaultQ8_0F32Activations).
    std::optional<bool> q8_0_f32_activations;
    // Not batch-invariant, f32 compute with bf16/f16 weights: host bytes for f32 weight copies the
    // oneDNN path keeps between passes (cpu_attention/gemm/matmul.h); 0: widened on every use.
    int64_t widened_weight_budget_bytes = 0;
    // The pool of the thread that calls Step (cpu_attention/runtime/cpu_threads.h): threads (0:
    // one per CPU this process may use), and whether thread i is pinned to the i-th such CPU
    // (false: the threads float, or keep OpenMP's binding when OMP_PROC_BIND asks for one).
    int threads = 0;
    bool pin_threads = false;
  } cpu;

  struct Kv {
    std::optional<DType> dtype;  // element type; default: cpu.compute_dtype
    int64_t block_size = 16;     // token slots per KV block
    // Host memory for the cache, bytes. 0: what the host memory budget leaves after the weights
    // (host_memory_bytes, else 90% of MemAvailable), less 1 GiB and the pass's host buffers at
    // their largest (MoE-Lens §5.1: KV capacity bounds throughput, so use the memory there is).
    int64_t bytes = int64_t{1} << 30;
  } kv;

  struct Schedule {
    // Prefill + decode tokens per pass, the ceiling (MoE-Lens §6.2-6.3). 0: the backend's
    // automatic value (cpu: kCpuTokensPerPass; cuda: what the GPU budget holds activations for,
    // capped, and lowered to the profiler's n_real).
    int64_t max_tokens_per_pass = 0;
    // Sequences holding KV at once. 0: no limit but the token budget's (engine/scheduler.h).
    int64_t max_num_seqs = 0;
    // VSLPipe (engine/model_runner.h). nullopt: the backend's choice (on for cuda, off for cpu).
    std::optional<bool> vslpipe;
    // Profile the pipeline at start-up where the backend does (cuda, MoE-Lens §6.3) and cap the
    // tokens per pass at its n_real; profiles are cached under profile_dir when it is set.
    bool profile_token_budget = true;
    std::string profile_dir;
  } schedule;

  // The GPU of the cuda backend (cuda/cuda_backend.h).
  struct Gpu {
    int device = 0;
    int64_t memory_bytes = 0;                  // the budget; 0: the device's free memory less 1 GiB
    int64_t packet_bytes = int64_t{64} << 20;  // the data mover's packet
    // Layers kept on the GPU for good, the first ones; -1: as many as the budget leaves room for
    // beside the pass's buffers (engine/offload/gpu_memory_plan.h: MaxResidentLayers).
    int64_t resident_layers = -1;
  } gpu;

  // Host memory the weights (host copy, synthetic) and the KV cache must fit in, bytes; 0:
  // MemAvailable. Checked before anything large is allocated.
  int64_t host_memory_bytes = 0;

  struct Metrics {
    // Peaks for MoE-CAP's S-MBU / S-MFU (engine/sparse_utilization.h): the bandwidth of the memory
    // weights and KV are read from (bytes/s) and the compute of the GEMMs (FLOP/s); 0: unknown.
    double peak_memory_bytes_per_second = 0;
    double peak_flops = 0;
    // When set: every pass's device calls and CPU tasks are written to this file as a Chrome trace
    // when the engine is destroyed or WriteTrace is called.
    std::string trace_file;
  } metrics;
};

// What the host offers, read once by the caller (ReadHostFacts) before any weight is placed, so
// that MakeEnginePlan is pure.
struct HostFacts {
  int64_t available_memory_bytes = 0;  // MemAvailable, bytes (0: unknown)
};
HostFacts ReadHostFacts();

struct EnginePlan {
  std::string backend;  // the registered backend's name
  BackendPlan device;   // the backend's plan
  ModelConfig config;   // config.json, num_hidden_layers as the engine runs it (synthetic layers)
  DType weight_dtype = DType::kBF16;  // as the float weights are kept
  // How the weight matrices are kept: the dtype's name, "int4 (Q4_1, groups of 32)" when quantized
  // at load, "GGUF Q4_K" (the type of most bytes) for a GGUF file.
  std::string weight_format;
  double weight_bytes_per_param = 2;  // weight_bytes / the model's parameters
  int64_t weight_bytes = 0;           // all weights in host memory, bytes
  int64_t layer_bytes = 0;            // one decoder layer's region (what streams per layer)
  // The scheduler: the backend's ceiling lowered to n_real when the profile gave one.
  std::optional<int64_t> n_real;
  SchedulerConfig schedule;
  bool vslpipe = false;
  // The KV cache. kv.num_blocks is what kv_bytes holds.
  KvCacheConfig kv;
  int64_t kv_bytes = 0;
  bool kv_automatic = false;       // kv_bytes from the host memory (EngineOptions::Kv::bytes 0)
  int64_t host_budget_bytes = 0;   // what kv_automatic divided: the options' budget or MemAvailable
  int64_t pass_buffer_bytes = 0;   // the pass's host buffers at their largest (q/k/v/attn, logits)
  int64_t max_context_tokens = 0;  // min(max_position_embeddings, KV blocks x block size)

  // The plan as the lines --dry_run prints (no trailing newline).
  std::string ToString() const;
};

// The plan of `options` for a model whose config.json is `config` (the full layer count; the plan
// applies weights.synthetic_layers) on `backend`, with `n_real` from a profile when one was made.
// InvalidArgument naming the option for a value out of range (max_num_seqs < 0, gpu
// resident_layers < -1, max_tokens_per_pass < 0, kv block_size <= 0, a KV cache that holds no
// block); the backend's Plan errors.
absl::StatusOr<EnginePlan> MakeEnginePlan(const EngineOptions& options, const ModelConfig& config,
                                          const Backend& backend, const HostFacts& host,
                                          std::optional<int64_t> n_real = std::nullopt);

}  // namespace moebatch
