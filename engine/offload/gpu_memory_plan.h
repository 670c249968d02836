// The GPU memory budget (--gpu_memory_gb): every byte the cuda backend allocates on the device,
// planned before it allocates anything, so a T4 (16 GB) or L4 (24 GB) can be emulated on a larger
// GPU and the engine never exceeds the budget. The cuda backend makes one cudaMalloc of
// `total_bytes` and carves the buffers below out of it (MoE-Lens §6.5: a two-slot weight buffer,
// 2 x one layer).
//
// Buffers (bytes; T = tokens per pass, `c` the compute dtype's size, f = 4):
//   weight_slots   2 x the largest layer region (engine/model/weight_store.h)
//   resident       lm_head [vocab, hidden] c + final norm [hidden] c
//   resident layers  optionally, layers 0..r-1 kept on the device for good (r x the largest
//                  layer region, 256-byte aligned): MoE-Lens §6.5 streams every layer; a budget
//                  with room to spare after the pass's buffers saves r / L of each pass's transfer
//   activations    per token: hidden state h [hidden] f, position (8) and prefill segment
//                  offset (4) for each of the kMaxMicroBatches micro-batches,
//                  plus the scratch of one task at a time: x [hidden] c, q/k/v [q + 2 kv] f,
//                  attention in [q] f and [q] c, o-proj out [hidden] f, router logits [E] f,
//                  top-k ids, weights, slots and sorted tokens [k] x 16, expert inputs [k, hidden]
//                  c, gate and up [k, 2 x ffn] f, SiLU-mul out [k, ffn] c, expert outputs [k,
//                  hidden] f, logits [vocab] f and their row index (4) (one row per token at most)
//   dequant        with weights kept in ggml blocks (a GGUF file, --weight_dtype int8|int4): the
//                  scratch a quantized matrix is dequantized into before its GEMM, in the compute
//                  dtype: the largest quantized matrix of a layer (an expert's, or q_proj/o_proj);
//                  0 otherwise. The weight slots and resident layers hold the blocks as they
//                  are (their bytes are the store's regions, so a quantized layer takes a quarter
//                  to a half of its bf16 bytes); lm_head is dequantized once into its resident
//                  buffer
//   workspace      fixed (kWorkspaceBytes): the cuBLAS workspace (kCublasWorkspaceBytes), the
//                  expert offsets, the RoPE table and the 256-byte alignment of every buffer
// The CUDA context itself (a few hundred MiB, driver-managed) is outside cudaMalloc and outside
// the budget; docs/performance.md says so next to each figure.
//
// Pure arithmetic: no CUDA here. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/dtype.h"
#include "engine/model/model_config.h"

namespace moebatch {

struct GpuMemoryPlan {
  static constexpr int64_t kWorkspaceBytes = int64_t{64} << 20;
  static constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;

  int64_t tokens_per_pass = 0;    // T the activations are sized for
  int64_t weight_slot_bytes = 0;  // one slot; two are allocated
  int64_t resident_bytes = 0;
  int64_t resident_layers = 0;       // r
  int64_t resident_layer_bytes = 0;  // r x one aligned layer region
  int64_t activation_bytes = 0;
  int64_t dequant_bytes = 0;  // the dequantization scratch (0: no quantized weights)
  int64_t workspace_bytes = 0;
  // 2 x weight_slot + resident + resident_layer_bytes + activations + dequant + workspace
  int64_t total_bytes = 0;

  std::string ToString() const;  // "2 x 2.80 GiB weight slots + ... = 6.1 GiB"
};

// Bytes of activations per token of a pass (see above).
int64_t GpuActivationBytesPerToken(const ModelConfig& config, DType compute_dtype);

// FFN columns per token that the gate/up (and activation) buffers hold: the widest of a MoE
// layer's top_k experts (top_k x intermediate_size), a dense layer's FFN and the shared expert.
int64_t GpuFfnColumnsPerToken(const ModelConfig& config);

// The dequantization scratch for `config`'s weights when they are quantized (dequant bytes
// above), bytes: its largest decoder-layer weight matrix (q/k/v/o projections, router, an
// expert's or the dense FFN's w1/w3/w2, the shared expert's) in `compute_dtype`. What a plan made
// before the weights are read counts (the cuda backend's Plan, moebatch-plan); the device itself
// sizes it from the store's quantized tensors, which never exceeds this.
int64_t GpuDequantScratchBytes(const ModelConfig& config, DType compute_dtype);

// The plan for `tokens_per_pass` tokens and `resident_layers` layers kept on the device, with
// `dequant_bytes` of dequantization scratch (0: the weights are not quantized).
// ResourceExhausted when it exceeds budget_bytes, naming the parts and, when the weights alone
// fit, the largest tokens_per_pass that would (beside those resident layers); InvalidArgument for
// non-positive sizes, a negative resident_layers or dequant_bytes, or a compute dtype other than
// bf16/f16/f32.
absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const ModelConfig& config, DType compute_dtype,
                                            int64_t max_layer_bytes, int64_t tokens_per_pass,
                                            int64_t budget_bytes, int64_t resident_layers = 0,
                                            int64_t dequant_bytes = 0);

// The cuda backend's automatic ceiling on tokens per pass, before the profiler's n_real lowers it:
// what budget_bytes holds activations for beside the slots, lm_head and `resident_layers` (given
// by the user: -1 or 0 for none, clamped to num_layers - 2), at most kMaxAutomaticTokensPerPass.
// The cap: a T4 holds fewer, an L4 about as many (Mixtral-8x7B: 19,362 / 34,420 tokens, where the
// profiler's n_real, ~12,000, lowers them anyway); on larger GPUs, or when
// no profile lowers it, the per-pass host buffers grow with it (a sampled sequence's logits row is
// 128 KB, q/k/v/attention ~40 KB a token) while the GEMMs gain little more. 0 when nothing fits.
inline constexpr int64_t kMaxAutomaticTokensPerPass = 32768;
int64_t AutomaticTokensPerPass(const ModelConfig& config, DType compute_dtype,
                               int64_t max_layer_bytes, int64_t budget_bytes, int64_t num_layers,
                               int64_t resident_layers, int64_t dequant_bytes = 0);

// The cuda backend's plan, one function for its start-up plan and its device: the tokens per pass
// (`tokens_per_pass`, or AutomaticTokensPerPass when 0) and the resident layers (`resident_request`
// >= 0 clamped to num_layers - 2, or MaxResidentLayers at those tokens when -1) in budget_bytes,
// beside `dequant_bytes` of dequantization scratch. PlanGpuMemory's errors; ResourceExhausted
// (PlanGpuMemory's, at one token) when the automatic tokens per pass leave no room at all.
absl::StatusOr<GpuMemoryPlan> PlanGpuDevice(const ModelConfig& config, DType compute_dtype,
                                            int64_t max_layer_bytes, int64_t num_layers,
                                            int64_t tokens_per_pass, int64_t budget_bytes,
                                            int64_t resident_request, int64_t dequant_bytes = 0);

// The most layers that can stay on the device next to the plan for tokens_per_pass within
// budget_bytes, leaving at least two of num_layers to stream through the two slots (which then
// hold them for good when exactly two are left): 0 for num_layers <= 2 or no room.
int64_t MaxResidentLayers(const ModelConfig& config, DType compute_dtype, int64_t max_layer_bytes,
                          int64_t tokens_per_pass, int64_t budget_bytes, int64_t num_layers,
                          int64_t dequant_bytes = 0);

// The largest tokens per pass whose plan (with `resident_layers` resident layers and
// `dequant_bytes` of scratch) fits in budget_bytes; 0 when even the weight slots, lm_head, scratch
// and resident layers do not fit.
int64_t MaxTokensPerPassForBudget(const ModelConfig& config, DType compute_dtype,
                                  int64_t max_layer_bytes, int64_t budget_bytes,
                                  int64_t resident_layers = 0, int64_t dequant_bytes = 0);

}  // namespace moebatch
