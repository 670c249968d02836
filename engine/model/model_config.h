// Model hyper-parameters read from a Hugging Face `config.json`: the keys every supported family
// shares (transformers' LlamaConfig / MixtralConfig names and defaults, 4.x and 5.x spellings) and
// each family's own, which engine/model/families/<family>.cc reads (engine/model/family.h lists
// the families: mixtral, llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, olmoe, dbrx,
// deepseek_v2, deepseek_v3, gpt_oss).
//
// One ModelConfig describes every decoder layer: attention (GQA, optional q/k/v and o biases,
// optional q/k RMSNorm, optional q/k/v clipping (OLMoE; DBRX's fused Wqkv), RoPE with its scaling),
// then an FFN that is either a routed MoE (num_local_experts experts of width intermediate_size,
// top-k, optionally a shared expert with a sigmoid gate) or, for dense models and a MoE model's
// dense layers, one FFN of width dense_intermediate_size. The forward reads the widths from the
// tensors' shapes.
#pragma once

#include <cmath>
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
  // DeepSeek's yarn keys: with both set (non-zero) and no attention_factor, the factor is
  // get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) (get_mscale(s, m) =
  // 0.1 m ln(s) + 1); DeepSeek-V3's attention also scales its softmax by
  // get_mscale(factor, mscale_all_dim)^2 (MlaConfig::softmax_scale).
  std::optional<double> mscale, mscale_all_dim;
};

// DeepSeek-V2 / V3 multi-head latent attention (transformers DeepseekV2Attention,
// DeepseekV3Attention): q = q_proj(x) or q_b_proj(RMSNorm(q_a_proj(x))) [heads, qk_nope + qk_rope];
// [c_kv | k_pe] = kv_a_proj_with_mqa(x) [kv_lora_rank + qk_rope]; c_kv = kv_a_layernorm(c_kv);
// kv_b_proj(c_kv) gives each head's k_nope [qk_nope] and v [v_head_dim]; RoPE on q_pe and the one
// shared k_pe. moebatch attends in the absorbed form (engine/model/mla.h): the cache holds the
// latent row [c_kv | k_pe] per token and layer, one "KV head" whose value is the row's first
// kv_lora_rank values.
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0 (config null): q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // RoPE on the pairs (2i, 2i + 1) (V2's complex multiply; V3 with rope_interleave) rather than on
  // the halves (i, i + d/2) (V3 with rope_interleave false).
  bool rope_interleave = true;
  // The attention's softmax scale: qk_head_dim^-0.5, times get_mscale(factor, mscale_all_dim)^2
  // for DeepSeek-V3 with yarn and mscale_all_dim (DeepseekV3Attention.scaling; transformers 4.57's
  // DeepseekV2Attention does not apply it).
  double softmax_scale = 0;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // a cache row
};

// How the router turns its logits into top-k experts and weights.
enum class TopkMethod {
  kSoftmax,             // softmax, top-k, optional renormalisation (Mixtral, Qwen-MoE, OLMoE)
  kGreedy,              // DeepSeek-V2 "greedy": softmax, top-k, x routed_scaling_factor
  kGroupLimitedGreedy,  // DeepSeek-V2: top-k among the topk_group groups of highest max score
  kNoauxTc,  // DeepSeek-V3: sigmoid; groups ranked by the sum of their top-2 biased scores
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
  // Renormalise the top-k routing weights to sum to 1 (Mixtral always; Qwen-MoE, OLMoE and
  // DeepSeek by `norm_topk_prob`).
  bool norm_topk_prob = true;
  // The p of that renormalisation: the top-k weights divided by their p-norm (sum w^p)^(1/p)
  // (DBRX's moe_normalize_expert_weights, torch.norm(p=...)); 1 divides by their sum.
  double topk_norm_p = 1.0;
  // Whether the shared expert has Qwen2-MoE's sigmoid gate (DeepSeek's shared experts have none:
  // added as they are).
  bool shared_expert_gated = true;
  // Routing variants (DeepSeek): the method, the expert groups, the factor the weights are
  // multiplied by, and whether the router has e_score_correction_bias [experts] (noaux_tc).
  TopkMethod topk_method = TopkMethod::kSoftmax;
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  // Multi-head latent attention (DeepSeek-V2 / V3). When set, the attention the CPU computes is
  // MQA over the latent cache: num_key_value_heads is 1, head_dim is mla->latent_dim()
  // (kv_lora_rank + qk_rope_head_dim), q holds each head's absorbed query, and the attention
  // output of a head is its first kv_lora_rank values (attention_value_dim()).
  std::optional<MlaConfig> mla;
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
  // Per layer, whether it attends within sliding_window (gpt-oss's layer_types:
  // "sliding_attention" / "full_attention"). Empty: every layer does when sliding_window is set
  // (Mistral, Mixtral). Read through LayerSlidingWindow.
  std::vector<bool> sliding_layers;
  // gpt-oss (GptOssAttention.sinks): one learned logit per query head [num_attention_heads] that
  // joins the softmax's denominator as exp(sink - max) with no value (eager_attention_forward).
  bool attention_sinks = false;
  // gpt-oss (GptOssTopKRouter): the router is a Linear with bias [experts]; top-k on the biased
  // logits, then softmax over the k selected.
  bool router_linear_bias = false;
  // gpt-oss (GptOssExperts): biases on the experts' gate/up [experts, 2 * inter] and down
  // [experts, hidden] projections, and the clamped SwiGLU: gate = min(gate, limit),
  // up = clamp(up, -limit, limit), out = (up + 1) * gate * sigmoid(1.702 gate). nullopt: SiLU-mul.
  bool expert_bias = false;
  std::optional<double> swiglu_limit;
  // The routed experts' weights are stored as MXFP4 (quantization_config.quant_method "mxfp4":
  // gpt-oss's *_blocks / *_scales tensors), repacked at load into ggml's MXFP4 blocks.
  bool mxfp4_experts = false;
  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 2;  // the first of config.json's eos_token_id (an id or a list)
  // Every id that ends a sequence: config.json's eos_token_id list, then generation_config.json's
  // (LoadModelConfig) not already in it. Never empty after parsing.
  std::vector<int32_t> eos_token_ids = {2};
  DType torch_dtype = DType::kBF16;  // `torch_dtype` (or transformers >= 4.56 `dtype`) key

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // The values of a head's attention output that count: head_dim, or kv_lora_rank under MLA.
  int64_t attention_value_dim() const { return mla ? mla->kv_lora_rank : head_dim; }
  // The softmax scale of the attention the CPU computes: head_dim^-0.5, or MLA's softmax_scale.
  float attention_scale() const {
    return mla ? static_cast<float>(mla->softmax_scale)
               : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  // RoPE's rotated dimension: head_dim, or qk_rope_head_dim under MLA.
  int64_t rope_dim() const { return mla ? mla->qk_rope_head_dim : head_dim; }
  // Whether layer l's FFN is the routed MoE (else one dense FFN of dense_intermediate_size).
  bool IsMoeLayer(int64_t layer) const;
  // The window layer l attends within: sliding_window for a sliding layer (every layer when
  // sliding_layers is empty), nullopt (full causal attention) otherwise.
  std::optional<int64_t> LayerSlidingWindow(int64_t layer) const {
    if (!sliding_window) return std::nullopt;
    if (sliding_layers.empty()) return sliding_window;
    if (layer < 0 || layer >= static_cast<int64_t>(sliding_layers.size())) return std::nullopt;
    return sliding_layers[layer] ? sliding_window : std::nullopt;
  }
  // Layers l < num_hidden_layers with a LayerSlidingWindow (all of them, or none, unless
  // sliding_layers says which).
  int64_t NumSlidingLayers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < num_hidden_layers; ++l) n += LayerSlidingWindow(l) ? 1 : 0;
    return n;
  }
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
// top-4), "deepseek-v2-lite" (deepseek-ai/DeepSeek-V2-Lite: MLA, kv_lora_rank 512), "gpt-oss-20b"
// (openai/gpt-oss-20b: 32 experts top-4 in MXFP4, sinks, sliding layers of 128). nullopt for any
// other name.
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
