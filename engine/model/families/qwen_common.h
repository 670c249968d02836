// Keys the Qwen families share (Qwen2Config, Qwen3Config, Qwen2MoeConfig, Qwen3MoeConfig).
#pragma once

#include "absl/status/status.h"
#include "engine/model/config_keys.h"
#include "engine/model/model_config.h"

namespace moebatch::families {

// use_sliding_window (default false): the window applies only when true, and then only from
// layer max_window_layers on, which moebatch does not compute: refused rather than ignored.
inline absl::Status ReadQwenSlidingWindow(const nlohmann::json& j, ModelConfig* c) {
  bool use = false;
  if (absl::Status s = config_keys::ReadBool(j, "use_sliding_window", false, &use); !s.ok()) {
    return s;
  }
  if (use) {
    return config_keys::KeyError("use_sliding_window",
                                 "is true: per-layer sliding windows (max_window_layers) are not "
                                 "computed by moebatch");
  }
  c->sliding_window.reset();
  return absl::OkStatus();
}

// The routed experts: num_experts, num_experts_per_tok, moe_intermediate_size (the expert width;
// intermediate_size is the dense layers'), norm_topk_prob, decoder_sparse_step, mlp_only_layers.
inline absl::Status ReadQwenMoe(const nlohmann::json& j, int64_t experts, int64_t top_k,
                                int64_t moe_width, ModelConfig* c) {
  using config_keys::ReadPositiveInt;
  if (absl::Status s = ReadPositiveInt(j, "num_experts", experts, &c->num_local_experts); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadPositiveInt(j, "num_experts_per_tok", top_k, &c->num_experts_per_tok);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ReadPositiveInt(j, "moe_intermediate_size", moe_width, &c->intermediate_size);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = config_keys::ReadBool(j, "norm_topk_prob", false, &c->norm_topk_prob);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ReadPositiveInt(j, "decoder_sparse_step", int64_t{1}, &c->decoder_sparse_step);
      !s.ok()) {
    return s;
  }
  return config_keys::ReadIntList(j, "mlp_only_layers", &c->mlp_only_layers);
}

}  // namespace moebatch::families
