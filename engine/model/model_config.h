// Model hyper-parameters read from a Hugging Face `config.json` (MixtralForCausalLM keys, as
// transformers' MixtralConfig, 4.x, names and defaults them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/model/dtype.h"

namespace moebatch {

struct ModelConfig {
  std::string architecture;  // "MixtralForCausalLM" (the only one supported so far)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // per expert FFN width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA: num_attention_heads % num_key_value_heads == 0
  int64_t head_dim = 0;             // `head_dim` key, else hidden_size / num_attention_heads
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;  // top-k of the router
  int64_t max_position_embeddings = 0;
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-5;
  std::optional<int64_t> sliding_window;  // null/absent: full causal attention
  bool tie_word_embeddings = false;       // lm_head shares model.embed_tokens.weight
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 2;
  DType torch_dtype = DType::kBF16;  // `torch_dtype` (or transformers >= 4.56 `dtype`) key

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
};

// Parses and validates config.json text. Errors (InvalidArgument) name the key and the reason:
// bad JSON, missing or mistyped required key, non-positive sizes, heads not divisible by KV heads,
// top-k larger than the number of experts, an architecture other than MixtralForCausalLM.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);

// The config.json of well-known models, for planning, benchmarks and tests without their files:
// "mixtral-8x7b" (mistralai Mixtral-8x7B-v0.1 and -Instruct-v0.1, the same shapes as
// bench/models/mixtral-8x7b/config.json) and "mixtral-8x22b" (Mixtral-8x22B-Instruct-v0.1: vocab
// 32768; the base v0.1 has 32000). nullopt for any other name.
std::optional<ModelConfig> KnownModelConfig(std::string_view name);

// Reads `<model_dir>/config.json` (NotFound when absent) and parses it.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace moebatch
