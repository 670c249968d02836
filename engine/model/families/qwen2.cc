// Qwen2 / Qwen2.5 (transformers models/qwen2: Qwen2Config, Qwen2ForCausalLM): dense layers, a bias
// on q/k/v (not o).
#include "engine/model/families/qwen_common.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

absl::Status Parse(const nlohmann::json& j, ModelConfig* c) {
  c->dense = true;
  c->qkv_bias = true;
  return ReadQwenSlidingWindow(j, c);
}

}  // namespace

const ModelFamily kQwen2 = {"qwen2",     "Qwen2ForCausalLM", Parse,      "mlp",
                            "gate_proj", "up_proj",          "down_proj"};

}  // namespace moebatch::families
