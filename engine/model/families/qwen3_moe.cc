// Qwen3-MoE (transformers models/qwen3_moe: Qwen3MoeConfig, Qwen3MoeForCausalLM; Qwen3-30B-A3B,
// Qwen3-235B-A22B): routed experts as Qwen2-MoE's without a shared expert, RMSNorm on each head of
// q and k before RoPE, `attention_bias` on q/k/v/o.
#include "engine/model/families/qwen_common.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  c->qk_norm = QkNorm::kPerHead;
  bool bias = false;
  if (absl::Status s = config_keys::ReadBool(j, "attention_bias", false, &bias); !s.ok()) return s;
  c->qkv_bias = c->o_bias = bias;
  // Qwen3MoeConfig defaults: 128 experts, top-8, moe_intermediate_size 768.
  if (absl::Status s = ReadQwenMoe(j, 128, 8, 768, c); !s.ok()) return s;
  return ReadQwenSlidingWindow(j, c);
}

}  // namespace

const ModelFamily kQwen3Moe = {
    "qwen3_moe", "Qwen3MoeForCausalLM", Parse, "mlp", "gate_proj", "up_proj", "down_proj"};

}  // namespace moebatch::families
