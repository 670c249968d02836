// The device interface: the matrix work of one pass, split where the CPU attends (MoE-Lens §6.4).
//
// Per layer, MoE-Lens runs
//   task A (device):  x = RMSNorm(h); q, k, v = x Wqᵀ, x Wkᵀ, x Wvᵀ; RoPE(q, k)
//   CPU task:         new K/V rows into the paged cache; attention of q over it (cpu_attention/)
//   task B (device):  h += attn Woᵀ; x = RMSNorm(h); router softmax -> top-k -> experts; h += moe
// and, around the layers, the embedding gather and the final RMSNorm + lm_head. A Device does the
// device side of that; engine/model_runner.h drives the layer loop and the CPU task, the same code
// for every backend (the cpu backend, cpu_attention/backend/cpu_device.h, and the cuda backend in
// cuda/). Nothing here names CUDA.
//
// Micro-batches: a pass may be split into up to kMaxMicroBatches micro-batches (VSLPipe's alpha and
// beta, MoE-Lens §6.4), each with its own hidden state on the device, so that task A/B of one can
// run while the CPU attends for the other. Every call names its micro-batch.
//
// Buffers crossing the interface are host memory, f32, row-major: the device copies them as it
// needs (the cuda backend: D2H of q/k/v after task A, H2D of attention outputs before task B).
// Calls are synchronous: when one returns, its outputs are in the host buffers.
//
// Threading: one thread at a time calls a Device (implementations share scratch between
// micro-batches). Errors: InvalidArgument for bad arguments (a micro-batch index out of range, a
// token id outside the vocabulary), Internal / ResourceExhausted for device failures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/host_memory.h"
#include "engine/model/model_config.h"

namespace moebatch {

inline constexpr int kMaxMicroBatches = 2;

// Per-pass counters: routing (the device fills them in task B) and where the time went (the
// runner, engine/model_runner.h). Busy times are wall time of the calls; in VSLPipe the device and
// CPU times overlap, so they may add up to more than the pass.
struct ForwardStats {
  int64_t tokens = 0;
  int64_t expert_token_pairs = 0;  // sum over layers of tokens routed to each expert (top-k each)
  int64_t experts_touched = 0;     // sum over layers of experts with at least one token
  int micro_batches = 0;
  double pass_seconds = 0;             // the whole Forward
  double device_seconds = 0;           // inside Device calls (tasks A/B, embedding, lm_head)
  double cpu_attention_seconds = 0;    // inside the CPU task (K/V append + attention)
  double weight_transfer_seconds = 0;  // weight copies in flight (Device::counters)
  int64_t weight_bytes = 0;            // weight bytes copied to the device
  // Sum of the keys each sequence's last query reads, per layer: its context length, a window
  // layer's at most its window (averaged over the layers).
  int64_t kv_tokens_read = 0;
  int64_t device_attention_tokens = 0;  // rows whose attention the device computed (prefill)
};

// What the device's weight transfers did so far (the cuda backend's data mover; zero on the cpu
// backend, whose weights never move).
struct DeviceCounters {
  int64_t weight_fills = 0;        // layers copied into a weight slot
  int64_t weight_bytes = 0;        // bytes copied
  double weight_busy_seconds = 0;  // time the copies were in flight
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda".
  virtual const char* name() const = 0;
  virtual const ModelConfig& config() const = 0;

  // A pass of `micro_batches` micro-batches (1 or 2) begins; their Embed calls follow. Layers are
  // then visited in order, and a layer's task B runs once per micro-batch before the device may
  // drop its weights (VSLPipe interleaves task A of layer i + 1 between them, MoE-Lens Fig. 9).
  // After a failed call the pass is abandoned; the next BeginPass starts afresh whatever state
  // the failed pass left.
  virtual void BeginPass(int micro_batches) {}

  // Starts micro-batch `micro_batch` with `tokens` tokens: h = embed_tokens[token_ids]
  // ([tokens, hidden]), and remembers each token's absolute position (for RoPE in task A).
  // token_ids [tokens] int32 in [0, vocab_size); positions [tokens] int64 >= 0. The caller has
  // validated both (engine/model_runner.cc).
  virtual absl::Status Embed(int micro_batch, const int32_t* token_ids, const int64_t* positions,
                             int64_t tokens) = 0;

  // Prefill attention on the device (MoE-Lens §6.4 puts the prefill tokens' attention in GPU
  // task A; the CPU attends the decode tokens). A sequence whose rows in a micro-batch are its
  // whole context (positions 0, 1, ..., a prompt prefilled in one chunk) attends only to its own
  // rows, so a device that has q, k and v of those rows can compute it. true: SetPrefillSegments
  // and TaskA's `attn` output are supported.
  virtual bool AttendsPrefill() const { return false; }

  // The rows of the micro-batch whose attention TaskA computes, for every layer of the pass begun;
  // called after Embed of the micro-batch (which clears them), before its first TaskA. cu_rows
  // [num_segments + 1] int32, non-decreasing, within [0, tokens]: segment s is rows [cu_rows[s],
  // cu_rows[s + 1]), one sequence's whole context at positions 0, 1, .... num_segments 0 clears.
  // InvalidArgument for a malformed list; FailedPrecondition for segments on a device that does not
  // attend prefill.
  virtual absl::Status SetPrefillSegments(int micro_batch, const int32_t* cu_rows,
                                          int64_t num_segments) {
    return num_segments == 0
               ? absl::OkStatus()
               : absl::FailedPreconditionError("this device does not attend prefill tokens");
  }

  // Task A of `layer` for the micro-batch: writes q [tokens, num_heads, head_dim] and
  // k, v [tokens, num_kv_heads, head_dim] (f32, RoPE applied to q and k), and attends the rows of
  // the prefill segments (SetPrefillSegments): causal over the segment, GQA, the model's sliding
  // window, scale head_dim^-0.5 (the math of cpu_attention/attention/paged_attention.h). The device
  // either writes their attention output into attn [tokens, num_heads, head_dim] f32, which its
  // TaskB then reads, or keeps and applies it itself (the cuda backend: it never crosses PCIe), in
  // which case TaskB ignores those rows of attn. Either way the caller leaves the segments' rows
  // of attn alone; q of those rows may be left unwritten (nothing reads it). attn may be null when
  // there are no segments.
  virtual absl::Status TaskA(int micro_batch, int64_t layer, float* q, float* k, float* v,
                             float* attn) = 0;

  // Task B of `layer`: attn [tokens, num_heads * head_dim] f32 is the attention output (of the
  // rows TaskA did not attend on the device, or all of them; see TaskA); updates the micro-batch's
  // hidden state. Adds the routing counts to *stats when not null.
  virtual absl::Status TaskB(int micro_batch, int64_t layer, const float* attn,
                             ForwardStats* stats) = 0;

  // logits [n, vocab_size] f32 = RMSNorm(h[rows[i]]) lm_headᵀ for rows of the micro-batch.
  virtual absl::Status Logits(int micro_batch, const int64_t* rows, int64_t n, float* logits) = 0;

  // Greedy decoding's next tokens: token_ids [n] int32, token_ids[i] = the argmax of Logits' row i,
  // the first maximum winning (torch.argmax; Sampler with temperature 0), or -1 when the row holds
  // a NaN or an infinity (the engine fails that request). A device that computes logits away from
  // the host overrides it to move n token ids instead of n x vocab_size logits; this default scans
  // Logits on the host.
  virtual absl::Status GreedyTokens(int micro_batch, const int64_t* rows, int64_t n,
                                    int32_t* token_ids) {
    const int64_t vocab = config().vocab_size;
    std::vector<float> logits(static_cast<size_t>(n * vocab));
    if (absl::Status st = Logits(micro_batch, rows, n, logits.data()); !st.ok()) return st;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * vocab;
      const bool finite = std::all_of(row, row + vocab, [](float v) { return std::isfinite(v); });
      token_ids[i] = finite ? static_cast<int32_t>(std::max_element(row, row + vocab) - row) : -1;
    }
    return absl::OkStatus();
  }

  virtual DeviceCounters counters() const { return {}; }

  // The attention-sink logits of `layer` (ModelConfig::attention_sinks, gpt-oss's self_attn.sinks)
  // as f32 host memory [num_attention_heads], which the CPU task's attention adds to each head's
  // softmax denominator (cpu_attention/attention/paged_attention.h); null when the model has none.
  // Owned by the device, valid while it lives; any thread may read it.
  virtual const float* AttentionSinks(int64_t layer) const { return nullptr; }

  // Where the host buffers this device copies to and from (TaskA's q/k/v/attn, TaskB's attn)
  // should live: the cuda backend's page-locked memory, so its copies are asynchronous DMA at full
  // PCIe speed rather than staged through a driver buffer. null: pageable memory. The allocator
  // lives as long as the device; memory from it must be freed before the device is destroyed.
  virtual HostAllocator* host_buffer_allocator() const { return nullptr; }
};

}  // namespace moebatch
