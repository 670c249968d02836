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
//
// A GGUF file (llama.cpp's format, engine/model/gguf.h) loads into the same ModelWeights: each
// Hugging Face tensor is found under llama.cpp's name (engine/model/gguf_tensors.h), an expert as
// its slice of the merged ffn_*_exps tensor, read in place from the mapping in its own type
// (F32/F16/BF16 as TensorInfo::dtype; Q4_0 ... Q6_K, MXFP4 as TensorInfo::quant, kept quantized).
// Only llama-architecture q/k projections are copied: their rows are put back in the Hugging Face
// order (convert_hf_to_gguf.py permuted them for ggml's interleaved RoPE).
//
// A family whose checkpoint fuses tensors (DBRX: Wqkv, the experts' w1 / v1 / w2) names its parts
// by TensorSpec::source (engine/model/family.h): each part is a view of rows of the fused tensor in
// the mapping, found under its shared-layout name (Find("model.layers.0.self_attn.q_proj.weight"));
// a transposed part (DBRX's down projections) is copied into its shape at load. gpt-oss's
// per-layer expert tensors (TensorSpec::source_expert) are copied once per expert into [out, in]
// rows, gate and up de-interleaved from gate_up_proj; MXFP4 ones (*_blocks / *_scales, U8) are
// repacked into ggml's MXFP4 blocks (TensorInfo::quant, 4.25 bits per weight as in the file).
// Wrong shapes or dtypes of the blocks and scales are InvalidArgument naming the file's tensor.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
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
  // DeepSeek: the noaux_tc router's e_score_correction_bias [experts]; null otherwise.
  const TensorInfo* router_bias = nullptr;
  // gpt-oss (ModelConfig::attention_sinks, router_linear_bias, expert_bias; null otherwise): the
  // attention sinks [heads], the router Linear's bias [experts] (added to its logits), and the
  // fused experts' biases: gate_up [experts, 2 * intermediate] with gate and up interleaved
  // (gate = [..., ::2], up = [..., 1::2]) and down [experts, hidden].
  const TensorInfo* sinks = nullptr;
  const TensorInfo* router_linear_bias = nullptr;
  const TensorInfo* experts_gate_up_bias = nullptr;
  const TensorInfo* experts_down_bias = nullptr;
  // Multi-head latent attention (ModelConfig::mla; q_proj, k_proj, v_proj are then null, but
  // q_proj when q_lora_rank is 0): q_a_proj [q_lora_rank, hidden], q_a_layernorm [q_lora_rank],
  // q_b_proj [heads * qk_head_dim, q_lora_rank], kv_a_proj_with_mqa
  // [kv_lora_rank + qk_rope_head_dim, hidden], kv_a_layernorm [kv_lora_rank], kv_b_proj
  // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]; o_proj [hidden, heads * v_head_dim].
  const TensorInfo* q_a_proj = nullptr;
  const TensorInfo* q_a_layernorm = nullptr;
  const TensorInfo* q_b_proj = nullptr;
  const TensorInfo* kv_a_proj = nullptr;
  const TensorInfo* kv_a_layernorm = nullptr;
  const TensorInfo* kv_b_proj = nullptr;
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
  // `model_dir` may be a GGUF file instead (IsGgufFile); its errors name the file and the tensor:
  // those of GgufFile::Open and FindGgufSource, InvalidArgument for a tensor type moebatch does not
  // compute with ("blk.0.attn_q.weight (for ...): type Q2_K; moebatch runs F32, F16, BF16, Q4_0,
  // ...") or a quantized vector (norms and biases must be F32, F16 or BF16), and the non-finite
  // checks above (quantized tensors are decoded for them).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Load(const std::string& model_dir);

  const std::string& dir() const { return dir_; }  // the directory or GGUF file loaded
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // The tensor of Hugging Face name `name` (a ModelTensors name), or null.
  const TensorInfo* Find(const std::string& name) const;
  // The safetensors files; a safetensors checkpoint only (gguf() == nullptr).
  const TensorStore& store() const { return *store_; }
  // The GGUF file, or null for a safetensors checkpoint.
  const GgufFile* gguf() const { return gguf_.get(); }
  // Bytes of the model's tensors as loaded (quantized ones in their blocks).
  int64_t tensor_bytes() const;
  // Whether `t`'s bytes are a copy the checkpoint holds in memory (GGUF llama q/k put back in the
  // Hugging Face order, DBRX's transposed down projections) rather than the file's mapping.
  bool OwnsData(const TensorInfo& t) const;

 private:
  static absl::Status LoadGguf(Checkpoint* ckpt);
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;  // safetensors
  std::unique_ptr<GgufFile> gguf_;      // GGUF
  std::deque<TensorInfo> gguf_infos_;   // GGUF: the TensorInfos weights_ points at
  std::deque<TensorInfo> parts_;  // safetensors: TensorSpec::source parts (DBRX's fused tensors)
  std::vector<std::unique_ptr<std::byte[]>> reordered_;  // copies: GGUF llama q/k, DBRX's w2
  std::map<std::string, const TensorInfo*> tensors_;     // every model tensor by name
  ModelWeights weights_;
};

}  // namespace moebatch
