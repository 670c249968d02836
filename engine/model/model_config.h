// Model hyper-parameters read from a Hugging Face `config.json`: the keys every supported family
// shares (transformers' LlamaConfig / MixtralConfig names and defaults, 4.x and 5.x spellings) and
// each family's own, which engine/model/families/<family>.cc reads (engine/model/family.h lists
// the families: mixtral, llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, olmoe, dbrx).
//
// One ModelConfig describes every decoder layer: attention (GQA, optional q/k/v and o biases,
// optional q/k RMSNorm, optional q/k/v clipping (OLMoE; DBRX's fused Wqkv), RoPE with its scaling),
// then an FFN that is either a routed MoE (num_local_experts experts of width intermediate_size,
// top-k, optionally a shared expert with a sigmoid gate) or, for dense models and a MoE model's
// dense layers, one FFN of width dense_intermediate_size. The forward reads the widths from the
// tensors' shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/dtype.h"

namespace moebatch {

// rope_scaling (rope_parameters in transformers 5): the RoPE frequency schemes of
// transformers' modeling_rope_utils.py that the supported families use.
struct RopeScaling {
  enum class Type { kDefault, kLinear, kLlama3, kYarn };
  Type type = Type::kDefault;
  double factor = 1.0;
  // llama3 (_compute_llama3_parameters)
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // yarn (_compute_yarn_parameters)
  double beta_fast = 32.0, beta_slow = 1.0;
  std::optional<double> attention_factor;  // absent: 0.1 ln(factor) + 1
  bool truncate = true;
};

// How q and k are normalised before RoPE.
enum class QkNorm {
  kNone,
  kPerHead,        // RMSNorm over each head's head_dim values (Qwen3, Qwen3-MoE): weight [head_dim]
  kPerProjection,  // RMSNorm over the whole q (k) projection (OLMoE): weight [q_size] ([kv_size])
};

// The normalisation of the decoder layers' inputs and of the final hidden state.
enum class NormType {
  kRmsNorm,    // weight * x / sqrt(mean(x^2) + eps) (LlamaRMSNorm, MixtralRMSNorm)
  kLayerNorm,  // weight * (x - mean) / sqrt(var + eps), no bias (DBRX: nn.LayerNorm(bias=False))
};

struct ModelConfig {
  std::string model_type;    // config.json model_type: "mixtral", "qwen3_moe", ...
  std::string architecture;  // the transformers class: "MixtralForCausalLM", ...
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  // The FFN width of a routed expert (Mixtral intermediate_size, Qwen-MoE moe_intermediate_size,
  // OLMoE intermediate_size); of the FFN, for a dense model.
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA: num_attention_heads % num_key_value_heads == 0
  int64_t head_dim = 0;             // `head_dim` key, else hidden_size / num_attention_heads
  // Routed experts per MoE layer and the router's top-k; 1 and 1 for a dense model (its FFN is
  // the one "expert", always chosen with weight 1, and no router).
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  bool dense = false;  // no MoE layer at all (llama, mistral, qwen2, qwen3)
  // The layers of a MoE model whose FFN is dense (Qwen-MoE's mlp_only_layers, and the layers
  // decoder_sparse_step skips: layer l is MoE iff (l + 1) % decoder_sparse_step == 0 and l is not
  // in mlp_only_layers), of width dense_intermediate_size.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t dense_intermediate_size = 0;
  // Qwen2-MoE's shared expert, added to every token's MoE output, scaled by
  // sigmoid(x · shared_expert_gate); 0: none.
  int64_t shared_expert_intermediate_size = 0;
  // Renormalise the top-k routing weights to sum to 1 (Mixtral always; Qwen-MoE and OLMoE by
  // `norm_topk_prob`).
  bool norm_topk_prob = true;
  // The p of that renormalisation: the top-k weights divided by their p-norm (sum w^p)^(1/p)
  // (DBRX's moe_normalize_expert_weights, torch.norm(p=...)); 1 divides by their sum.
  double topk_norm_p = 1.0;
  // Attention.
  bool qkv_bias = false;  // q_proj, k_proj, v_proj carry a bias (Qwen2, Qwen2-MoE; Llama's
                          // attention_bias)
  bool o_bias = false;    // o_proj carries a bias (Llama's attention_bias)
  QkNorm qk_norm = QkNorm::kNone;
  std::optional<double> clip_qkv;  // OLMoE: q, k and v clamped to [-clip_qkv, clip_qkv]
  int64_t max_position_embeddings = 0;
  double rope_theta = 1e6;
  RopeScaling rope_scaling;
  NormType norm = NormType::kRmsNorm;  // input, post-attention and final norms
  double rms_norm_eps = 1e-5;          // the eps of `norm` (DBRX's LayerNorm: nn.LayerNorm's 1e-5)
  std::optional<int64_t> sliding_window;  // null/absent/unused: full causal attention
  bool tie_word_embeddings = false;       // lm_head shares model.embed_tokens.weight
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 2;  // the first of config.json's eos_token_id (an id or a list)
  // Every id that ends a sequence: config.json's eos_token_id list, then generation_config.json's
  // (LoadModelConfig) not already in it. Never empty after parsing.
  std::vector<int32_t> eos_token_ids = {2};
  DType torch_dtype = DType::kBF16;  // `torch_dtype` (or transformers >= 4.56 `dtype`) key

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // Whether layer l's FFN is the routed MoE (else one dense FFN of dense_intermediate_size).
  bool IsMoeLayer(int64_t layer) const;
};

// Parses and validates config.json text. Errors (InvalidArgument) name the key and the reason:
// bad JSON, missing or mistyped required key, non-positive sizes, heads not divisible by KV heads,
// top-k larger than the number of experts, a model_type moebatch does not support (the message
// lists the supported ones), a feature of a supported family it does not compute (named).
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);

// The config.json of well-known models, for planning, benchmarks and tests without their files:
// "mixtral-8x7b" (mistralai Mixtral-8x7B-v0.1 and -Instruct-v0.1, the same shapes as
// bench/models/mixtral-8x7b/config.json), "mixtral-8x22b" (Mixtral-8x22B-Instruct-v0.1: vocab
// 32768; the base v0.1 has 32000), "qwen3-30b-a3b", "qwen2-57b-a14b", "olmoe-1b-7b",
// "llama-3.1-8b", "dbrx" (databricks/dbrx-base and dbrx-instruct: 132B parameters, 16 experts
// top-4). nullopt for any other name.
std::optional<ModelConfig> KnownModelConfig(std::string_view name);
// The names KnownModelConfig knows.
std::vector<std::string> KnownModelConfigNames();

// Reads `<model_dir>/config.json` (NotFound when absent) and parses it, and adds the
// eos_token_id of `<model_dir>/generation_config.json` (when present) to eos_token_ids.
// `model_dir` may instead be a GGUF file (engine/model/gguf.h IsGgufFile): its metadata is read as
// engine/model/gguf_config.h's GgufModelConfig does. Another regular file is InvalidArgument.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// RoPE's inverse frequencies [head_dim / 2] (f32, as transformers' rotary embedding computes them
// in f32 for the config's rope_scaling) and the factor cos and sin are multiplied by (1 but for
// yarn's attention factor).
struct RopeTable {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
RopeTable ComputeRope(const ModelConfig& config);

}  // namespace moebatch
