// A Hugging Face checkpoint directory, validated: config.json plus every tensor its family
// (engine/model/family.h: ModelTensors) expects, with its shape and dtype, checked before the first
// forward. Tensor names and shapes ([out_features, in_features], as torch.nn.Linear stores) for
// Mixtral (transformers 4.x, hub per-expert layout); the other families name theirs in
// engine/model/families/<family>.cc (mlp.{gate,up,down}_proj for dense layers,
// mlp.experts.{e}.* and mlp.gate for Qwen-MoE / OLMoE, self_attn.{q,k}_norm, biases,
// mlp.shared_expert.* and mlp.shared_expert_gate):
//   model.embed_tokens.weight                                   [vocab, hidden]
//   model.layers.{l}.input_layernorm.weight                     [hidden]
//   model.layers.{l}.self_attn.{q,k,v,o}_proj.weight            q [heads*head_dim, hidden],
//                                                               k/v [kv_heads*head_dim, hidden],
//                                                               o [hidden, heads*head_dim]
//   model.layers.{l}.post_attention_layernorm.weight            [hidden]
//   model.layers.{l}.block_sparse_moe.gate.weight               [experts, hidden]   (the router)
//   model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight     [intermediate, hidden] (gate proj)
//   model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight     [hidden, intermediate] (down proj)
//   model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight     [intermediate, hidden] (up proj)
//   model.norm.weight                                           [hidden]
//   lm_head.weight                                              [vocab, hidden] (absent when tied)
// Every tensor must have the config's torch_dtype (bf16, fp16 or fp32).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace moebatch {

// One FFN: down(silu(gate(x)) * up(x)) (the names are Mixtral's w1 = gate, w3 = up, w2 = down).
struct ExpertWeights {
  const TensorInfo* w1 = nullptr;  // [width, hidden]
  const TensorInfo* w2 = nullptr;  // [hidden, width]
  const TensorInfo* w3 = nullptr;  // [width, hidden]
};

struct LayerWeights {
  const TensorInfo* input_layernorm = nullptr;
  const TensorInfo* q_proj = nullptr;
  const TensorInfo* k_proj = nullptr;
  const TensorInfo* v_proj = nullptr;
  const TensorInfo* o_proj = nullptr;
  // Present when the config says so (ModelConfig::qkv_bias, o_bias, qk_norm); null otherwise.
  const TensorInfo* q_bias = nullptr;  // [q_size]
  const TensorInfo* k_bias = nullptr;  // [kv_size]
  const TensorInfo* v_bias = nullptr;  // [kv_size]
  const TensorInfo* o_bias = nullptr;  // [hidden]
  const TensorInfo* q_norm = nullptr;  // [head_dim] (per head) or [q_size] (per projection)
  const TensorInfo* k_norm = nullptr;  // [head_dim] or [kv_size]
  const TensorInfo* post_attention_layernorm = nullptr;
  // A MoE layer: the router [experts, hidden] and num_local_experts experts. A dense layer: no
  // router and one "expert", the dense FFN, always chosen with weight 1.
  const TensorInfo* router = nullptr;
  std::vector<ExpertWeights> experts;
  // Qwen2-MoE's shared expert and its gate [1, hidden]; null when the model has none.
  ExpertWeights shared_expert;
  const TensorInfo* shared_expert_gate = nullptr;
};

struct ModelWeights {
  const TensorInfo* embed_tokens = nullptr;
  const TensorInfo* norm = nullptr;
  const TensorInfo* lm_head = nullptr;  // == embed_tokens when tie_word_embeddings
  std::vector<LayerWeights> layers;
};

class Checkpoint {
 public:
  // Loads config.json, opens the tensors (TensorStore::Open) and validates every expected tensor.
  // Errors name the tensor and file at fault:
  //   NotFound         missing config.json, missing weights file or shard, missing tensor
  //   InvalidArgument  a NaN or infinity in a norm, a router or the first rows of the embedding
  //                    or lm_head (engine/model/weight_check.h), bad config, wrong shape
  //                    ("expected [64, 32000], found [64, 31999]"), wrong
  //                    dtype ("expected BF16 (config torch_dtype), found F32"), unknown
  //                    architecture
  //   DataLoss         truncated file
  // Unexpected extra tensors are ignored (logged at debug level).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Load(const std::string& model_dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const TensorStore& store() const { return *store_; }

 private:
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  ModelWeights weights_;
};

}  // namespace moebatch
