// Qwen2-MoE (transformers models/qwen2_moe: Qwen2MoeConfig, Qwen2MoeForCausalLM; Qwen1.5-MoE-A2.7B,
// Qwen2-57B-A14B): routed experts (mlp.gate, mlp.experts.{e}.gate_proj/up_proj/down_proj), the
// top-k weights renormalised only with norm_topk_prob, a shared expert added to every token's MoE
// output scaled by sigmoid(x · shared_expert_gate), dense layers by decoder_sparse_step /
// mlp_only_layers, a bias on q/k/v.
#include "engine/model/families/qwen_common.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  c->qkv_bias = true;
  // Qwen2MoeConfig defaults: 60 experts, top-4, moe_intermediate_size 1408, shared 5632.
  if (absl::Status s = ReadQwenMoe(j, 60, 4, 1408, c); !s.ok()) return s;
  if (absl::Status s = config_keys::ReadPositiveInt(j, "shared_expert_intermediate_size", 5632,
                                                    &c->shared_expert_intermediate_size);
      !s.ok()) {
    return s;
  }
  return ReadQwenSlidingWindow(j, c);
}

}  // namespace

const ModelFamily kQwen2Moe = {
    "qwen2_moe", "Qwen2MoeForCausalLM", Parse, "mlp", "gate_proj", "up_proj", "down_proj"};

}  // namespace moebatch::families
