// OLMoE (transformers models/olmoe: OlmoeConfig, OlmoeForCausalLM; OLMoE-1B-7B): routed experts in
// every layer (mlp.gate, mlp.experts.{e}.gate_proj/up_proj/down_proj, width intermediate_size),
// weights renormalised only with norm_topk_prob, RMSNorm over the whole q and k projections
// (q_norm [q_size], k_norm [kv_size]), then q, k and v clamped to +-clip_qkv when set,
// `attention_bias`.
#include "engine/model/config_keys.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  using config_keys::ReadPositiveInt;
  c->qk_norm = QkNorm::kPerProjection;
  bool bias = false;
  if (absl::Status s = config_keys::ReadBool(j, "attention_bias", false, &bias); !s.ok()) return s;
  c->qkv_bias = c->o_bias = bias;
  // OlmoeConfig defaults: 64 experts, top-8, norm_topk_prob false.
  if (absl::Status s = ReadPositiveInt(j, "num_experts", 64, &c->num_local_experts); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadPositiveInt(j, "num_experts_per_tok", 8, &c->num_experts_per_tok);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = config_keys::ReadBool(j, "norm_topk_prob", false, &c->norm_topk_prob);
      !s.ok()) {
    return s;
  }
  if (const auto it = j.find("clip_qkv"); it != j.end() && !it->is_null()) {
    double clip = 0;
    if (absl::Status s = config_keys::ReadPositiveDouble(j, "clip_qkv", 1.0, &clip); !s.ok()) {
      return s;
    }
    c->clip_qkv = clip;
  }
  c->sliding_window.reset();
  return absl::OkStatus();
}

}  // namespace

const ModelFamily kOlmoe = {"olmoe",     "OlmoeForCausalLM", Parse,      "mlp",
                            "gate_proj", "up_proj",          "down_proj"};

}  // namespace moebatch::families
