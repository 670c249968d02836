// Mistral (transformers models/mistral: MistralConfig, MistralForCausalLM; Mistral 7B): dense
// layers as Llama's, no biases, the optional sliding window of `sliding_window`.
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  c->dense = true;
  return absl::OkStatus();
}

}  // namespace

const ModelFamily kMistral = {"mistral", "MistralForCausalLM", Parse, "mlp", "gate_proj",
                              "up_proj", "down_proj"};

}  // namespace moebatch::families
