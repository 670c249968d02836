// Llama (transformers models/llama: LlamaConfig, LlamaForCausalLM; Llama 2/3.x, SmolLM2): dense
// layers (mlp.gate_proj/up_proj/down_proj), `attention_bias` on q/k/v/o, RoPE with llama3
// scaling (ModelConfig::rope_scaling, read for every family).
#include "engine/model/config_keys.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  c->dense = true;
  bool bias = false, mlp_bias = false;
  if (absl::Status s = config_keys::ReadBool(j, "attention_bias", false, &bias); !s.ok()) return s;
  c->qkv_bias = c->o_bias = bias;
  if (absl::Status s = config_keys::ReadBool(j, "mlp_bias", false, &mlp_bias); !s.ok()) return s;
  if (mlp_bias) {
    return config_keys::KeyError("mlp_bias", "is true: MLP biases are not computed by moebatch");
  }
  c->sliding_window.reset();  // LlamaAttention has no sliding window
  return absl::OkStatus();
}

}  // namespace

const ModelFamily kLlama = {"llama",     "LlamaForCausalLM", Parse,      "mlp",
                            "gate_proj", "up_proj",          "down_proj"};

}  // namespace moebatch::families
