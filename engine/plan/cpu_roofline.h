// The CPU roofline of a forward pass: what the pass reads (weights, K/V cache) and computes
// (FLOPs), against the host's memory bandwidth and FMA peak (cpu_attention/runtime/host_roof.h
// measures both), so a pass that runs slow names its bound: the memory side (bytes / bandwidth)
// or the compute side (FLOPs / peak), whichever is longer, is the least time the pass can take.
//
// Two sources of the counts: a pass the engine ran (PassWorkOf: the tensors the checkpoint holds,
// the experts its tokens touched, its K/V rows; the engine puts the result on each pass of the
// trace, engine/pipeline_trace.h), and a planned pass (DecodePassWork, PrefillPassWork: from a
// ModelShape, engine/plan/perf_model.h, with uniform routing; moebatch-plan --backend cpu prints
// them).
//
// Units: bytes, FLOP (a multiply and an add are 2), seconds, bytes/s, FLOP/s. Pure arithmetic;
// thread-safe.
#pragma once

#include <cstdint>

#include "engine/model/checkpoint.h"
#include "engine/model/model_config.h"
#include "engine/plan/perf_model.h"

namespace moebatch {

// What one forward pass reads from memory and computes.
struct PassWork {
  double weight_bytes = 0;  // stored bytes of the weights it reads (quantized: the blocks)
  double kv_bytes = 0;      // K/V cache bytes its attention reads
  double flops = 0;         // GEMMs (projections, router, experts, lm_head) and attention
  double bytes() const { return weight_bytes + kv_bytes; }
};

// The host's ceilings: memory bandwidth (the STREAM triad, all threads) and f32 FMA peak.
struct HostCeilings {
  double bytes_per_s = 0;
  double flops_per_s = 0;
};

struct Roofline {
  double memory_seconds = 0;   // bytes / bandwidth (0 when the bandwidth is unknown)
  double compute_seconds = 0;  // FLOPs / peak (0 when the peak is unknown)
  // The longer of the two: the least time the pass can take.
  double seconds() const {
    return memory_seconds > compute_seconds ? memory_seconds : compute_seconds;
  }
  bool memory_bound() const { return memory_seconds >= compute_seconds; }
  const char* bound_name() const { return memory_bound() ? "memory" : "compute"; }
};

Roofline RooflineOf(const PassWork& work, const HostCeilings& host);

// A pass the engine ran. Weights: every tensor ModelTensors lists for `config` (so every family's
// own), read once per pass: the layers' tensors outside the routed experts; the routed experts'
// at stats.experts_touched times the mean bytes of one expert (formats may differ between layers,
// as Q4_K_M's do; a dense layer's FFN is its one expert); the embedding rows of the pass's tokens;
// the lm_head when logits_rows > 0. FLOPs: 2 x tokens x elements of each matrix outside the
// routed experts, 2 x stats.expert_token_pairs x the mean elements of one expert, 2 x logits_rows
// x lm_head's elements, and attention 4 x q_size x stats.kv_tokens_read per layer (exact for
// decode rows; prefill rows attend about half their context each, which this leaves out).
// K/V: stats.kv_tokens_read x layers x kv_bytes_per_token_layer (the cache's K and V bytes of one
// token in one layer).
// The counts of a pass PassWorkOf needs (the engine's ForwardStats, engine/device.h, has them).
struct PassCounts {
  int64_t tokens = 0;              // rows of the pass
  int64_t experts_touched = 0;     // sum over layers of experts with at least one token
  int64_t expert_token_pairs = 0;  // sum over layers of tokens routed to each expert
  int64_t kv_tokens_read = 0;      // sum of the sequences' context lengths (one layer)
};
PassWork PassWorkOf(const ModelConfig& config, const ModelWeights& weights, const PassCounts& stats,
                    double kv_bytes_per_token_layer, int64_t logits_rows);

// Planned passes from a ModelShape (weights at model.weight_bytes_per_element, K/V at
// KvBytesPerToken), routing taken as uniform: a MoE layer with t tokens touches
// N_e (1 - (1 - N_k / N_e)^t) experts. Decode: `sequences` rows, each attending `context` tokens
// (a window layer at most its window: KvBytesPerSequenceToken), logits for every row. Prefill:
// `sequences` prompts of `prompt_tokens`, attention over half the prompt per row on average, logits
// for the last row of each.
PassWork DecodePassWork(const ModelShape& model, int64_t sequences, int64_t context);
PassWork PrefillPassWork(const ModelShape& model, int64_t sequences, int64_t prompt_tokens);

// The expected number of distinct experts `tokens` tokens touch in one MoE layer under uniform
// routing: N_e (1 - (1 - N_k / N_e)^tokens).
double ExpectedExpertsTouched(const ModelShape& model, double tokens);

}  // namespace moebatch
