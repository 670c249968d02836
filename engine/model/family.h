// The model families moebatch runs, one file each under engine/model/families/ (as transformers'
// models/<family>/ and llama.cpp's src/models/): the config.json keys of its own and the names of
// its checkpoint's tensors. The forward is shared (engine/device.h and the backends), steered by
// the ModelConfig the family fills (biases, q/k norm, routing, shared expert, dense layers).
//
//   model_type   transformers class            source of the keys and names
//   mixtral      MixtralForCausalLM            models/mixtral/modeling_mixtral.py
//   llama        LlamaForCausalLM              models/llama/modeling_llama.py
//   mistral      MistralForCausalLM            models/mistral/modeling_mistral.py
//   qwen2        Qwen2ForCausalLM              models/qwen2/modeling_qwen2.py
//   qwen3        Qwen3ForCausalLM              models/qwen3/modeling_qwen3.py
//   qwen2_moe    Qwen2MoeForCausalLM           models/qwen2_moe/modeling_qwen2_moe.py
//   qwen3_moe    Qwen3MoeForCausalLM           models/qwen3_moe/modeling_qwen3_moe.py
//   olmoe        OlmoeForCausalLM              models/olmoe/modeling_olmoe.py
//   dbrx         DbrxForCausalLM               models/dbrx/modeling_dbrx.py
//   deepseek_v2  DeepseekV2ForCausalLM         models/deepseek_v2/modeling_deepseek_v2.py
//   deepseek_v3  DeepseekV3ForCausalLM         models/deepseek_v3/modeling_deepseek_v3.py
//   gpt_oss      GptOssForCausalLM             models/gpt_oss/modeling_gpt_oss.py
//
// Threading: the registry is constant; every function here is reentrant.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model_config.h"
#include "nlohmann/json_fwd.hpp"

namespace moebatch {

struct TensorSpec;

struct ModelFamily {
  const char* model_type;    // config.json "model_type"
  const char* architecture;  // its transformers class
  // The family's own keys, read into `config` after the shared ones (sizes, heads, RoPE, norms,
  // ids). InvalidArgument naming the key for a bad or unsupported value.
  absl::Status (*parse_config)(const nlohmann::json& j, ModelConfig* config);
  // Tensor names below "model.layers.<l>.": the MoE block's prefix ("block_sparse_moe" or "mlp")
  // and the names of an expert's gate, up and down projections ("w1", "w3", "w2" or "gate_proj",
  // "up_proj", "down_proj"); a dense FFN is "mlp.gate_proj" etc. in every family.
  const char* moe_prefix;
  const char* expert_gate;
  const char* expert_up;
  const char* expert_down;
  // Optional (null for the families whose config.json and tensors use the shared names):
  // Rewrites `j` so that the shared keys are there (DBRX's d_model, n_heads and nested
  // attn_config / ffn_config as hidden_size, num_attention_heads, ...), before they are read.
  // InvalidArgument naming the family's own key for a missing or bad value.
  absl::Status (*normalize_config)(nlohmann::json* j) = nullptr;
  // Points the tensors of ModelTensors (named as the shared layout names them) at where the
  // family's checkpoint holds them (TensorSpec::source, DBRX's fused tensors).
  void (*map_tensors)(const ModelConfig& config,
                      std::vector<std::vector<TensorSpec>>* regions) = nullptr;
};

// The family of `model_type`; null when moebatch has none.
const ModelFamily* FindModelFamily(std::string_view model_type);
// The family whose transformers class is `architecture` ("Qwen3MoeForCausalLM"); null when none.
const ModelFamily* FindModelFamilyByArchitecture(std::string_view architecture);
// "dbrx, deepseek_v2, deepseek_v3, gpt_oss, llama, mistral, mixtral, olmoe, qwen2, qwen2_moe,
// qwen3, qwen3_moe".
std::string SupportedModelTypes();

// One tensor of a checkpoint: its name, shape, and the ModelWeights field that points at it.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  const TensorInfo** target;
  // Where a safetensors checkpoint holds it when not as tensor `name` whole (DBRX, whose fused
  // Wqkv and expert tensors hold several of these): the rows [source_row, source_row + rows) of
  // tensor `source` of shape `source_shape`, rows = shape[0], a view without a copy; or, when
  // `transposed`, rows = shape[1] holding the tensor transposed ([shape[1], shape[0]]), copied
  // into `shape` at load. Empty `source`: the tensor is `name`.
  std::string source{};
  std::vector<int64_t> source_shape{};
  int64_t source_row = 0;
  bool transposed = false;
  // A slice of a tensor holding every expert of a layer (gpt-oss's experts.gate_up_proj,
  // experts.down_proj): expert `source_expert` (>= 0) of `source`, whose output features are
  // [experts, out, in] in `source_shape` order given below; this tensor [rows, in]'s row r is the
  // slice's output feature row_start + row_step * r (gate_up interleaves gate and up: step 2).
  // With `transposed` the file holds the slice as [in, out] (x @ W; source_shape {experts, in,
  // out}) and the rows are copied out transposed at load; with `mxfp4` the file holds
  // "<source>_blocks" [experts, out, in / 32, 16] and "<source>_scales" [experts, out, in / 32]
  // (U8; source_shape {experts, out, in}), repacked at load into ggml's MXFP4 blocks
  // (engine/model/ggml_quants.h; 17 bytes per 32 weights, as in the file).
  int64_t source_expert = -1;
  int64_t row_start = 0;
  int64_t row_step = 1;
  bool mxfp4 = false;
};

// Every tensor of `config`'s model with `num_layers` layers, in the order WeightStore lays them
// out: region 0 the globals (embed_tokens, norm, lm_head unless tied), region 1 + l layer l's
// (attention, norms, router, experts in id order (gate, up, down each), the shared expert and its
// gate). Sizes w->layers and each layer's experts; the targets point into *w.
std::vector<std::vector<TensorSpec>> ModelTensors(const ModelConfig& config, int64_t num_layers,
                                                  ModelWeights* w);

// The layer of a shared-layout name "model.layers.<l>.<rest>" into *layer and <rest> into *rest;
// false for a global tensor's name (for the families' map_tensors).
bool SplitLayerName(const std::string& name, int64_t* layer, std::string* rest);

namespace families {
// Defined in engine/model/families/<family>.cc.
extern const ModelFamily kMixtral, kLlama, kMistral, kQwen2, kQwen3, kQwen2Moe, kQwen3Moe, kOlmoe;
extern const ModelFamily kDbrx;
extern const ModelFamily kDeepseekV2, kDeepseekV3;  // families/deepseek.cc
extern const ModelFamily kGptOss;                   // families/gpt_oss.cc
}  // namespace families

}  // namespace moebatch
