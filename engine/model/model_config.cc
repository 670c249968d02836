// config.json -> ModelConfig. Keys, optionality and defaults follow transformers' MixtralConfig
// (src/transformers/models/mixtral/configuration_mixtral.py, 4.x). Dimension keys are required:
// save_pretrained always writes them, and a silent default would describe a different model.
#include "engine/model/model_config.h"

#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/json_depth.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;

constexpr char kArchitecture[] = "MixtralForCausalLM";

absl::Status KeyError(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("key \"", key, "\" ", why));
}

// `*out` <- the integer at `key`; when absent, `fallback`, or an error when there is none (a
// required key).
absl::Status ReadInt(const Json& j, const char* key, std::optional<int64_t> fallback,
                     int64_t* out) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (!fallback) return KeyError(key, "is required but missing");
    *out = *fallback;
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return KeyError(key, absl::StrCat("must be an integer, got ", it->dump()));
  }
  if (it->is_number_unsigned() &&
      it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return KeyError(key, absl::StrCat("is out of range: ", it->dump()));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadPositiveInt(const Json& j, const char* key, std::optional<int64_t> fallback,
                             int64_t* out) {
  if (absl::Status s = ReadInt(j, key, fallback, out); !s.ok()) return s;
  if (*out <= 0) return KeyError(key, absl::StrCat("must be positive, got ", *out));
  return absl::OkStatus();
}

absl::Status ReadPositiveDouble(const Json& j, const char* key, double fallback, double* out) {
  const auto it = j.find(key);
  if (it == j.end()) {
    *out = fallback;
    return absl::OkStatus();
  }
  if (!it->is_number()) return KeyError(key, absl::StrCat("must be a number, got ", it->dump()));
  *out = it->get<double>();
  if (!(*out > 0)) return KeyError(key, absl::StrCat("must be positive, got ", it->dump()));
  return absl::OkStatus();
}

// A token id: an integer, or (eos_token_id) a list whose first element is used. Null or absent
// keeps the MixtralConfig default.
absl::Status ReadTokenId(const Json& j, const char* key, int32_t* out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const Json* id = &*it;
  if (it->is_array()) {
    if (it->empty()) return KeyError(key, "is an empty list");
    id = &(*it)[0];
  }
  if (!id->is_number_integer() || id->get<int64_t>() < 0 ||
      id->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return KeyError(key, absl::StrCat("must be a non-negative token id, got ", it->dump()));
  }
  *out = static_cast<int32_t>(id->get<int64_t>());
  return absl::OkStatus();
}

absl::Status CheckArchitecture(const Json& j, ModelConfig* config) {
  const auto it = j.find("architectures");
  if (it == j.end()) return KeyError("architectures", "is required but missing");
  if (!it->is_array()) return KeyError("architectures", "must be a list of class names");
  for (const Json& name : *it) {
    if (name.is_string() && name.get<std::string>() == kArchitecture) {
      config->architecture = kArchitecture;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown architecture ", it->dump(), "; moebatch supports ", kArchitecture));
}

// `torch_dtype`, renamed `dtype` in transformers 4.56; bfloat16 when neither is given.
absl::Status ReadDType(const Json& j, ModelConfig* config) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    std::optional<DType> dtype;
    if (it->is_string()) dtype = DTypeFromString(it->get<std::string>());
    if (!dtype) {
      return KeyError(
          key, absl::StrCat("must be \"bfloat16\", \"float16\" or \"float32\", got ", it->dump()));
    }
    config->torch_dtype = *dtype;
    return absl::OkStatus();
  }
  config->torch_dtype = DType::kBF16;
  return absl::OkStatus();
}

// rope_theta: the 4.x top-level key; transformers 5 moves it into `rope_parameters`. Scaled RoPE
// (a `rope_scaling`, or a rope_type other than "default") is outside what moebatch computes: reject
// it rather than compute a different model.
absl::Status ReadRope(const Json& j, ModelConfig* config) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object() || it->value("rope_type", it->value("type", std::string())) != "default") {
      return KeyError(key, absl::StrCat("asks for unsupported RoPE scaling ", it->dump()));
    }
  }
  const auto params = j.find("rope_parameters");
  if (!j.contains("rope_theta") && params != j.end() && params->is_object()) {
    return ReadPositiveDouble(*params, "rope_theta", 1e6, &config->rope_theta);
  }
  return ReadPositiveDouble(j, "rope_theta", 1e6, &config->rope_theta);
}

absl::Status Parse(const Json& j, ModelConfig* c) {
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (absl::Status s = CheckArchitecture(j, c); !s.ok()) return s;

  for (auto [key, field] : {std::pair{"vocab_size", &c->vocab_size},
                            {"hidden_size", &c->hidden_size},
                            {"intermediate_size", &c->intermediate_size},
                            {"num_hidden_layers", &c->num_hidden_layers},
                            {"num_attention_heads", &c->num_attention_heads}}) {
    if (absl::Status s = ReadPositiveInt(j, key, std::nullopt, field); !s.ok()) return s;
  }
  // MixtralConfig: num_key_value_heads=None means multi-head attention (as many as query heads).
  if (const auto it = j.find("num_key_value_heads"); it != j.end() && it->is_null()) {
    c->num_key_value_heads = c->num_attention_heads;
  } else if (absl::Status s =
                 ReadPositiveInt(j, "num_key_value_heads", std::nullopt, &c->num_key_value_heads);
             !s.ok()) {
    return s;
  }
  if (c->num_attention_heads % c->num_key_value_heads != 0) {
    return KeyError("num_key_value_heads",
                    absl::StrCat("must divide num_attention_heads (", c->num_attention_heads,
                                 " heads, ", c->num_key_value_heads, " KV heads)"));
  }

  // head_dim: optional; null or absent means hidden_size // num_attention_heads.
  if (const auto it = j.find("head_dim"); it != j.end() && !it->is_null()) {
    if (absl::Status s = ReadPositiveInt(j, "head_dim", std::nullopt, &c->head_dim); !s.ok()) {
      return s;
    }
    // q_size() = num_attention_heads * head_dim (kv_size() is at most that) must be an int64.
    int64_t q_size;
    if (__builtin_mul_overflow(c->num_attention_heads, c->head_dim, &q_size)) {
      return KeyError("head_dim", absl::StrCat("(", c->head_dim, ") times num_attention_heads (",
                                               c->num_attention_heads, ") overflows"));
    }
  } else if (c->hidden_size % c->num_attention_heads != 0) {
    return KeyError("hidden_size",
                    absl::StrCat("(", c->hidden_size, ") is not divisible by num_attention_heads (",
                                 c->num_attention_heads, ") and head_dim is not given"));
  } else {
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }

  // MoE: MixtralConfig defaults num_local_experts=8, num_experts_per_tok=2.
  if (absl::Status s = ReadPositiveInt(j, "num_local_experts", 8, &c->num_local_experts); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadPositiveInt(j, "num_experts_per_tok", 2, &c->num_experts_per_tok);
      !s.ok()) {
    return s;
  }
  if (c->num_experts_per_tok > c->num_local_experts) {
    return KeyError("num_experts_per_tok",
                    absl::StrCat("(", c->num_experts_per_tok, ") exceeds num_local_experts (",
                                 c->num_local_experts, ")"));
  }

  if (absl::Status s = ReadPositiveInt(j, "max_position_embeddings", int64_t{4096} * 32,
                                       &c->max_position_embeddings);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadRope(j, c); !s.ok()) return s;
  if (absl::Status s = ReadPositiveDouble(j, "rms_norm_eps", 1e-5, &c->rms_norm_eps); !s.ok()) {
    return s;
  }

  // sliding_window: null (the Mixtral hub default) or absent means full causal attention.
  c->sliding_window.reset();
  if (const auto it = j.find("sliding_window"); it != j.end() && !it->is_null()) {
    int64_t window = 0;
    if (absl::Status s = ReadPositiveInt(j, "sliding_window", std::nullopt, &window); !s.ok()) {
      return s;
    }
    c->sliding_window = window;
  }

  if (const auto it = j.find("tie_word_embeddings"); it != j.end()) {
    if (!it->is_boolean()) return KeyError("tie_word_embeddings", "must be true or false");
    c->tie_word_embeddings = it->get<bool>();
  }
  if (absl::Status s = ReadTokenId(j, "bos_token_id", &c->bos_token_id); !s.ok()) return s;
  if (absl::Status s = ReadTokenId(j, "eos_token_id", &c->eos_token_id); !s.ok()) return s;
  return ReadDType(j, c);
}

// Parses `text`; errors are prefixed with `source` (the file, for the user).
absl::StatusOr<ModelConfig> ParseFrom(std::string_view text, absl::string_view source) {
  ModelConfig config;
  absl::Status status;
  try {
    if (JsonNestsDeeperThan(text, kMaxJsonDepth)) {
      status = absl::InvalidArgumentError(
          absl::StrCat("invalid JSON: nested deeper than ", kMaxJsonDepth, " levels"));
    } else {
      status = Parse(Json::parse(text.begin(), text.end()), &config);
    }
  } catch (const Json::parse_error& e) {
    status = absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  } catch (const Json::exception& e) {  // a value of an unexpected type deep in an object
    status = absl::InvalidArgumentError(absl::StrCat("unexpected value: ", e.what()));
  }
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(source, ": ", status.message()));
  }
  return config;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  return ParseFrom(json_text, "config.json");
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": no such file (model config)"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  absl::StatusOr<ModelConfig> config = ParseFrom(text.str(), path);
  if (!config.ok()) return config.status();
  spdlog::debug("{}: {} layers, hidden {}, {} experts (top-{}), {} heads / {} KV heads, {}", path,
                config->num_hidden_layers, config->hidden_size, config->num_local_experts,
                config->num_experts_per_tok, config->num_attention_heads,
                config->num_key_value_heads, DTypeName(config->torch_dtype));
  return config;
}

std::optional<ModelConfig> KnownModelConfig(std::string_view name) {
  ModelConfig c;
  c.architecture = "MixtralForCausalLM";
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.num_local_experts = 8;
  c.num_experts_per_tok = 2;
  c.max_position_embeddings = 32768;
  if (name == "mixtral-8x7b") return c;
  if (name == "mixtral-8x22b") {
    // 140.6B parameters, 281.3 GB in bf16 (MoE-Lens §7: 141B, 282 GB).
    c.vocab_size = 32768;
    c.hidden_size = 6144;
    c.intermediate_size = 16384;
    c.num_hidden_layers = 56;
    c.num_attention_heads = 48;
    c.max_position_embeddings = 65536;
    return c;
  }
  return std::nullopt;
}

}  // namespace moebatch
