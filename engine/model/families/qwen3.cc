// Qwen3 dense (transformers models/qwen3: Qwen3Config, Qwen3ForCausalLM): dense layers, RMSNorm on
// each head of q and k before RoPE (q_norm, k_norm [head_dim]), `attention_bias` on q/k/v/o.
#include "engine/model/families/qwen_common.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  c->dense = true;
  c->qk_norm = QkNorm::kPerHead;
  bool bias = false;
  if (absl::Status s = config_keys::ReadBool(j, "attention_bias", false, &bias); !s.ok()) return s;
  c->qkv_bias = c->o_bias = bias;
  return ReadQwenSlidingWindow(j, c);
}

}  // namespace

const ModelFamily kQwen3 = {"qwen3",     "Qwen3ForCausalLM", Parse,      "mlp",
                            "gate_proj", "up_proj",          "down_proj"};

}  // namespace moebatch::families
