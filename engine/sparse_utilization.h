// MoE-CAP's sparse utilization metrics (seed 004, §4.2-4.3) for one forward pass, from the
// router's actual expert choices (ForwardStats::experts_touched) rather than the full model:
//
//   S_activated = L * S_attn + sum over layers l and experts i of 1[l, i] * S_expert
//                 (1[l, i]: expert i of layer l received at least one token this pass)
//   S-MBU = B_achieved / B_peak,  B_achieved = (S_activated + S_KV) / pass time
//   S-MFU = achieved FLOP/s / F_peak,  FLOPs = tokens * (2 N_attn + 2 N_router + 2 k N_expert)
//
// S_attn: the bytes of one layer's attention weights (q, k, v, o projections and the norms);
// S_expert: one expert's w1, w2, w3; S_KV: the KV bytes the pass's attention read (every
// sequence's context, every layer); N_*: parameter counts; k: experts per token. MoE-CAP writes
// the per-token formula with TPOT for one decode step; a batch pass reads the activated weights
// once for all its tokens, so the bytes are per pass and the FLOPs per token times the tokens.
//
// The peaks are the caller's (the memory the weights and KV are read from, and the compute the
// GEMMs run on; flags --peak_memory_gbs and --peak_tflops); 0 leaves the ratio at 0 (unknown).
// Pure arithmetic; thread-safe.
#pragma once

#include <cstdint>

#include "engine/device.h"
#include "engine/model/model_config.h"

namespace moebatch {

struct SparseUtilization {
  double activated_weight_bytes = 0;  // S_activated
  double kv_bytes = 0;                // S_KV
  double flops = 0;                   // tokens * S-F_token
  double bytes_per_second = 0;        // B_achieved
  double flops_per_second = 0;
  double s_mbu = 0;  // 0 when the memory peak is unknown
  double s_mfu = 0;  // 0 when the compute peak is unknown
};

// `weight_bytes` / `kv_bytes`: bytes per weight and per KV element (the stored dtypes).
SparseUtilization ComputeSparseUtilization(const ModelConfig& config, double weight_bytes,
                                           double kv_bytes, const ForwardStats& pass,
                                           double peak_bytes_per_second, double peak_flops);

}  // namespace moebatch
