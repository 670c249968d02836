// Mixtral (transformers models/mixtral: MixtralConfig, MixtralForCausalLM): a routed MoE in every
// layer (block_sparse_moe.gate, experts.{e}.w1/w3/w2), softmax -> top-k -> renormalised weights,
// no biases, an optional sliding window.
#include "engine/model/config_keys.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  using config_keys::ReadPositiveInt;
  // MixtralConfig defaults num_local_experts=8, num_experts_per_tok=2.
  if (absl::Status s = ReadPositiveInt(j, "num_local_experts", 8, &c->num_local_experts); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadPositiveInt(j, "num_experts_per_tok", 2, &c->num_experts_per_tok);
      !s.ok()) {
    return s;
  }
  c->norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises
  return absl::OkStatus();
}

}  // namespace

const ModelFamily kMixtral = {
    "mixtral", "MixtralForCausalLM", Parse, "block_sparse_moe", "w1", "w3", "w2"};

}  // namespace moebatch::families
