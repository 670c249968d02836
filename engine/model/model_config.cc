// config.json -> ModelConfig. The shared keys' optionality and defaults follow transformers'
// LlamaConfig / MixtralConfig (4.x; 5.x's renamed keys too); each family's own keys are read by
// engine/model/families/<family>.cc. Dimension keys are required: save_pretrained always writes
// them, and a silent default would describe a different model.
#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/config_keys.h"
#include "engine/model/family.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_config.h"
#include "engine/model/json_depth.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;
using config_keys::KeyError;
using config_keys::ReadInt;
using config_keys::ReadPositiveDouble;
using config_keys::ReadPositiveInt;

// A token id: an integer, or a list of them (Llama 3.1's eos_token_id: [128001, 128008, 128009])
// whose first element goes to `out` and all to `all` (when given). Null or absent keeps the
// default.
absl::Status ReadTokenId(const Json& j, const char* key, int32_t* out,
                         std::vector<int32_t>* all = nullptr) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  std::vector<const Json*> ids;
  if (it->is_array()) {
    if (it->empty()) return KeyError(key, "is an empty list");
    for (const Json& id : *it) ids.push_back(&id);
  } else {
    ids.push_back(&*it);
  }
  std::vector<int32_t> values;
  for (const Json* id : ids) {
    if (!id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return KeyError(
          key, absl::StrCat("must be a non-negative token id or a list of them, got ", it->dump()));
    }
    values.push_back(static_cast<int32_t>(id->get<int64_t>()));
  }
  *out = values[0];
  if (all != nullptr) *all = std::move(values);
  return absl::OkStatus();
}

// The family: config.json's model_type, else the first of `architectures` a family names.
absl::StatusOr<const ModelFamily*> FindFamily(const Json& j) {
  if (const auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return KeyError("model_type", "must be a string");
    const ModelFamily* family = FindModelFamily(it->get<std::string>());
    if (family == nullptr) {
      return KeyError("model_type", absl::StrCat("is ", it->dump(),
                                                 ", which moebatch does not run; "
                                                 "it runs ",
                                                 SupportedModelTypes()));
    }
    return family;
  }
  const auto it = j.find("architectures");
  if (it == j.end() || !it->is_array()) {
    return KeyError("model_type", "is required but missing (and no \"architectures\" list)");
  }
  for (const Json& name : *it) {
    if (!name.is_string()) continue;
    if (const ModelFamily* family = FindModelFamilyByArchitecture(name.get<std::string>())) {
      return family;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown architecture ", it->dump(),
                                                 "; moebatch runs the model types ",
                                                 SupportedModelTypes()));
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

// rope_theta: the 4.x top-level key; transformers 5 moves it into `rope_parameters`, with the
// scaling (4.x: `rope_scaling`). Types: default, linear, llama3, yarn (modeling_rope_utils.py);
// any other is refused rather than computed as a different model.
absl::Status ReadRope(const Json& j, ModelConfig* config) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) return KeyError(key, absl::StrCat("must be an object, got ", it->dump()));
    const std::string type = it->value("rope_type", it->value("type", std::string("default")));
    RopeScaling& r = config->rope_scaling;
    if (type == "default") {
      r.type = RopeScaling::Type::kDefault;
      continue;
    }
    if (type == "linear") {
      r.type = RopeScaling::Type::kLinear;
    } else if (type == "llama3") {
      r.type = RopeScaling::Type::kLlama3;
    } else if (type == "yarn") {
      r.type = RopeScaling::Type::kYarn;
    } else {
      return KeyError(key, absl::StrCat("asks for RoPE scaling \"", type,
                                        "\", which moebatch does not compute (it does default, "
                                        "linear, llama3 and yarn)"));
    }
    if (absl::Status s = ReadPositiveDouble(*it, "factor", 1.0, &r.factor); !s.ok()) return s;
    if (r.type == RopeScaling::Type::kLlama3) {
      for (auto [name, field] : {std::pair{"low_freq_factor", &r.low_freq_factor},
                                 {"high_freq_factor", &r.high_freq_factor}}) {
        if (absl::Status s = ReadPositiveDouble(*it, name, *field, field); !s.ok()) return s;
      }
      if (absl::Status s = ReadPositiveInt(*it, "original_max_position_embeddings", std::nullopt,
                                           &r.original_max_position_embeddings);
          !s.ok()) {
        return s;
      }
    }
    if (r.type == RopeScaling::Type::kYarn) {
      for (auto [name, field] :
           {std::pair{"beta_fast", &r.beta_fast}, {"beta_slow", &r.beta_slow}}) {
        if (absl::Status s = ReadPositiveDouble(*it, name, *field, field); !s.ok()) return s;
      }
      if (it->contains("attention_factor") && !(*it)["attention_factor"].is_null()) {
        double f = 0;
        if (absl::Status s = ReadPositiveDouble(*it, "attention_factor", 1.0, &f); !s.ok()) {
          return s;
        }
        r.attention_factor = f;
      }
      for (auto [name, field] :
           {std::pair{"mscale", &r.mscale}, {"mscale_all_dim", &r.mscale_all_dim}}) {
        if (const auto m = it->find(name); m != it->end() && !m->is_null()) {
          if (!m->is_number() || !(m->get<double>() >= 0)) {
            return KeyError(key,
                            absl::StrCat(name, " must be a non-negative number, got ", m->dump()));
          }
          *field = m->get<double>();
        }
      }
      if (absl::Status s = config_keys::ReadBool(*it, "truncate", true, &r.truncate); !s.ok()) {
        return s;
      }
      int64_t original = 0;
      if (absl::Status s = ReadInt(*it, "original_max_position_embeddings", int64_t{0}, &original);
          !s.ok()) {
        return s;
      }
      r.original_max_position_embeddings = original;
    }
  }
  const auto params = j.find("rope_parameters");
  if (!j.contains("rope_theta") && params != j.end() && params->is_object()) {
    return ReadPositiveDouble(*params, "rope_theta", 1e6, &config->rope_theta);
  }
  return ReadPositiveDouble(j, "rope_theta", 1e6, &config->rope_theta);
}

absl::Status Parse(const Json& j_in, ModelConfig* c) {
  if (!j_in.is_object()) return absl::InvalidArgumentError("not a JSON object");
  auto family = FindFamily(j_in);
  if (!family.ok()) return family.status();
  // A family with keys of its own names (DBRX) gets a copy with the shared ones added.
  Json normalized;
  if ((*family)->normalize_config != nullptr) {
    normalized = j_in;
    if (absl::Status s = (*family)->normalize_config(&normalized); !s.ok()) return s;
  }
  const Json& j = (*family)->normalize_config != nullptr ? normalized : j_in;
  c->model_type = (*family)->model_type;
  c->architecture = (*family)->architecture;

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
  c->eos_token_ids.clear();
  if (absl::Status s = ReadTokenId(j, "eos_token_id", &c->eos_token_id, &c->eos_token_ids);
      !s.ok()) {
    return s;
  }
  if (c->eos_token_ids.empty()) c->eos_token_ids.push_back(c->eos_token_id);
  if (absl::Status s = ReadDType(j, c); !s.ok()) return s;

  // The family's own keys: experts, biases, q/k norm, ...
  c->dense_intermediate_size = c->intermediate_size;
  if (absl::Status s = (*family)->parse_config(j, c); !s.ok()) return s;
  if (c->dense) {
    c->num_local_experts = 1;
    c->num_experts_per_tok = 1;
  }
  if (c->num_experts_per_tok > c->num_local_experts) {
    return KeyError("num_experts_per_tok",
                    absl::StrCat("(", c->num_experts_per_tok, ") exceeds the number of experts (",
                                 c->num_local_experts, ")"));
  }
  if (c->qk_norm == QkNorm::kPerHead && c->head_dim < 1) {
    return KeyError("head_dim", "must be positive");
  }
  if (c->rope_scaling.type == RopeScaling::Type::kLlama3 &&
      !(c->rope_scaling.high_freq_factor > c->rope_scaling.low_freq_factor)) {
    return KeyError("rope_scaling", "high_freq_factor must exceed low_freq_factor");
  }
  if (c->head_dim % 2 != 0) {
    return KeyError("head_dim", absl::StrCat("must be even for RoPE, got ", c->head_dim));
  }
  return absl::OkStatus();
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

// generation_config.json's eos_token_id (an id or a list; transformers' generate stops at any of
// them) added to config->eos_token_ids. No file, or no key: nothing. Errors: InvalidArgument
// naming the file (bad JSON, an id that is not a non-negative integer).
absl::Status AddGenerationConfigEos(const std::string& model_dir, ModelConfig* config) {
  const std::string path = model_dir + "/generation_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::OkStatus();
  std::ostringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  if (JsonNestsDeeperThan(s, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: nested too deep"));
  }
  const Json j = Json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON (expected an object)"));
  }
  int32_t first = 0;
  std::vector<int32_t> ids;
  if (absl::Status st = ReadTokenId(j, "eos_token_id", &first, &ids); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  }
  for (int32_t id : ids) {
    if (std::find(config->eos_token_ids.begin(), config->eos_token_ids.end(), id) ==
        config->eos_token_ids.end()) {
      config->eos_token_ids.push_back(id);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  return ParseFrom(json_text, "config.json");
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  if (IsGgufFile(model_dir)) {
    auto file = GgufFile::Open(model_dir);
    if (!file.ok()) return file.status();
    return GgufModelConfig(**file);
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(model_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, ": not a GGUF file (no \"GGUF\" magic) and not a model directory"));
  }
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": no such file (model config)"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  absl::StatusOr<ModelConfig> config = ParseFrom(text.str(), path);
  if (!config.ok()) return config.status();
  if (absl::Status s = AddGenerationConfigEos(model_dir, &*config); !s.ok()) return s;
  spdlog::debug("{}: {} layers, hidden {}, {} experts (top-{}), {} heads / {} KV heads, {}", path,
                config->num_hidden_layers, config->hidden_size, config->num_local_experts,
                config->num_experts_per_tok, config->num_attention_heads,
                config->num_key_value_heads, DTypeName(config->torch_dtype));
  return config;
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (dense) return false;
  for (int64_t l : mlp_only_layers) {
    if (l == layer) return false;
  }
  return decoder_sparse_step <= 1 || (layer + 1) % decoder_sparse_step == 0;
}

RopeTable ComputeRope(const ModelConfig& c) {
  // transformers' rotary embeddings compute inv_freq in f32: base ** (arange(0, d, 2) / d) with
  // the exponent a float32 tensor (modeling_rope_utils.py's _compute_*_parameters).
  const int64_t d = c.rope_dim(), half = d / 2;
  const float base = static_cast<float>(c.rope_theta);
  std::vector<float> pos_freq(half), inv(half);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
    pos_freq[i] = std::pow(base, exponent);
    inv[i] = 1.0f / pos_freq[i];
  }
  RopeTable table;
  const RopeScaling& r = c.rope_scaling;
  const float factor = static_cast<float>(r.factor);
  switch (r.type) {
    case RopeScaling::Type::kDefault:
      break;
    case RopeScaling::Type::kLinear:
      for (float& f : inv) f /= factor;
      break;
    case RopeScaling::Type::kLlama3: {  // _compute_llama3_parameters
      const float old_context = static_cast<float>(r.original_max_position_embeddings);
      const float low = static_cast<float>(r.low_freq_factor);
      const float high = static_cast<float>(r.high_freq_factor);
      const float low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
      constexpr float kPi = 3.141592653589793f;
      for (float& f : inv) {
        const float wavelen = 2 * kPi / f;
        float scaled = wavelen > low_freq_wavelen ? f / factor : f;
        const float smooth = (old_context / wavelen - low) / (high - low);
        const float smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
        const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        f = medium ? smoothed : scaled;
      }
      break;
    }
    case RopeScaling::Type::kYarn: {  // _compute_yarn_parameters
      double yarn_factor = r.factor;
      int64_t original = c.max_position_embeddings;
      if (r.original_max_position_embeddings > 0) {
        original = r.original_max_position_embeddings;
        yarn_factor = static_cast<double>(c.max_position_embeddings) / original;
      }
      table.attention_scaling = static_cast<float>(
          r.attention_factor.value_or(yarn_factor <= 1 ? 1.0 : 0.1 * std::log(yarn_factor) + 1.0));
      if (!r.attention_factor && r.mscale.value_or(0) != 0 && r.mscale_all_dim.value_or(0) != 0) {
        // DeepSeek's mscale pair, on the configured factor (transformers 4.57).
        auto get_mscale = [](double s, double m) {
          return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0;
        };
        table.attention_scaling = static_cast<float>(get_mscale(r.factor, *r.mscale) /
                                                     get_mscale(r.factor, *r.mscale_all_dim));
      }
      auto correction_dim = [&](double rotations) {
        return (d * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(c.rope_theta));
      };
      double lo = correction_dim(r.beta_fast), hi = correction_dim(r.beta_slow);
      if (r.truncate) {
        lo = std::floor(lo);
        hi = std::ceil(hi);
      }
      lo = std::max(lo, 0.0);
      hi = std::min(hi, static_cast<double>(d - 1));
      if (lo == hi) hi += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        const float ramp = std::clamp(
            (static_cast<float>(i) - static_cast<float>(lo)) / static_cast<float>(hi - lo), 0.0f,
            1.0f);
        const float extrapolation = 1 - ramp;
        const float interpolation_freq = 1.0f / (static_cast<float>(r.factor) * pos_freq[i]);
        inv[i] = interpolation_freq * (1 - extrapolation) + inv[i] * extrapolation;
      }
      break;
    }
  }
  table.inv_freq = std::move(inv);
  return table;
}

// deepseek-ai/DeepSeek-V2-Lite's config.json (its modeling keys; auto_map and the like left out).
constexpr char kDeepseekV2LiteConfig[] = R"json({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
  "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
  "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
  "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": null,
  "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "greedy",
  "n_group": 1, "topk_group": 1, "num_experts_per_tok": 6, "moe_layer_freq": 1,
  "first_k_dense_replace": 1, "norm_topk_prob": false, "scoring_func": "softmax",
  "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
  "bos_token_id": 100000, "eos_token_id": 100001, "tie_word_embeddings": false,
  "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
  "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
  "type": "yarn"}, "attention_bias": false, "torch_dtype": "bfloat16"})json";

// openai/gpt-oss-20b's config.json (its modeling keys; layer_types left to GptOssConfig's default,
// which is the file's: sliding on even layers, full on odd ones; bos from generation_config.json).
constexpr char kGptOss20bConfig[] = R"json({
  "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
  "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
  "num_experts_per_tok": 4, "sliding_window": 128, "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05, "rope_theta": 150000, "rope_scaling": {"beta_fast": 32.0,
  "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096, "rope_type": "yarn",
  "truncate": false}, "swiglu_limit": 7.0, "attention_bias": true, "tie_word_embeddings": false,
  "bos_token_id": 199998, "eos_token_id": 200002, "quantization_config": {"quant_method": "mxfp4",
  "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
  "model.embed_tokens", "lm_head"]}, "torch_dtype": "bfloat16"})json";

std::optional<ModelConfig> KnownModelConfig(std::string_view name) {
  for (auto [known, json] : {std::pair{"deepseek-v2-lite", kDeepseekV2LiteConfig},
                             // 21B parameters, 3.6B active; 32 MXFP4 experts top-4, sinks
                             std::pair{"gpt-oss-20b", kGptOss20bConfig}}) {
    if (name != known) continue;
    absl::StatusOr<ModelConfig> c = ParseModelConfig(json);
    if (c.ok()) return *c;
    return std::nullopt;
  }
  ModelConfig c;
  c.model_type = "mixtral";
  c.architecture = "MixtralForCausalLM";
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.dense_intermediate_size = 14336;
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
    c.intermediate_size = c.dense_intermediate_size = 16384;
    c.num_hidden_layers = 56;
    c.num_attention_heads = 48;
    c.max_position_embeddings = 65536;
    return c;
  }
  if (name == "qwen3-30b-a3b") {  // Qwen/Qwen3-30B-A3B config.json
    c.model_type = "qwen3_moe";
    c.architecture = "Qwen3MoeForCausalLM";
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.intermediate_size = 768;  // moe_intermediate_size
    c.dense_intermediate_size = 6144;
    c.num_hidden_layers = 48;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.num_local_experts = 128;
    c.num_experts_per_tok = 8;
    c.qk_norm = QkNorm::kPerHead;
    c.norm_topk_prob = true;
    c.max_position_embeddings = 40960;
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    c.bos_token_id = 151643;
    c.eos_token_id = 151645;
    c.eos_token_ids = {151645};
    return c;
  }
  if (name == "qwen2-57b-a14b") {  // Qwen/Qwen2-57B-A14B config.json
    c.model_type = "qwen2_moe";
    c.architecture = "Qwen2MoeForCausalLM";
    c.vocab_size = 151936;
    c.hidden_size = 3584;
    c.intermediate_size = 2560;  // moe_intermediate_size
    c.dense_intermediate_size = 18944;
    c.shared_expert_intermediate_size = 20480;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 28;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.num_local_experts = 64;
    c.num_experts_per_tok = 8;
    c.norm_topk_prob = false;
    c.qkv_bias = true;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    c.bos_token_id = 151643;
    c.eos_token_id = 151643;
    c.eos_token_ids = {151643};
    return c;
  }
  if (name == "olmoe-1b-7b") {  // allenai/OLMoE-1B-7B-0924 config.json
    c.model_type = "olmoe";
    c.architecture = "OlmoeForCausalLM";
    c.vocab_size = 50304;
    c.hidden_size = 2048;
    c.intermediate_size = c.dense_intermediate_size = 1024;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 16;
    c.head_dim = 128;
    c.num_local_experts = 64;
    c.num_experts_per_tok = 8;
    c.norm_topk_prob = false;
    c.qk_norm = QkNorm::kPerProjection;
    c.max_position_embeddings = 4096;
    c.rope_theta = 10000;
    c.bos_token_id = 50279;  // none in the file; the tokenizer's
    c.eos_token_id = 50279;
    c.eos_token_ids = {50279};
    return c;
  }
  if (name == "llama-3.1-8b") {  // meta-llama/Llama-3.1-8B-Instruct config.json
    c.model_type = "llama";
    c.architecture = "LlamaForCausalLM";
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = c.dense_intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.dense = true;
    c.num_local_experts = c.num_experts_per_tok = 1;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000;
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_position_embeddings = 8192;
    c.bos_token_id = 128000;
    c.eos_token_id = 128009;
    c.eos_token_ids = {128009};
    return c;
  }
  if (name == "dbrx") {  // databricks/dbrx-instruct config.json (MoE-Lens §7's second model)
    c.model_type = "dbrx";
    c.architecture = "DbrxForCausalLM";
    c.vocab_size = 100352;
    c.hidden_size = 6144;
    c.intermediate_size = c.dense_intermediate_size = 10752;  // ffn_config.ffn_hidden_size
    c.num_hidden_layers = 40;
    c.num_attention_heads = 48;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.num_local_experts = 16;
    c.num_experts_per_tok = 4;
    c.norm_topk_prob = true;  // moe_normalize_expert_weights 1
    c.topk_norm_p = 1.0;
    c.clip_qkv = 8.0;
    c.norm = NormType::kLayerNorm;
    c.max_position_embeddings = 32768;
    c.rope_theta = 500000;
    c.bos_token_id = 100257;  // none in the file; the tokenizer's <|endoftext|>
    c.eos_token_id = 100257;
    c.eos_token_ids = {100257};
    return c;
  }
  return std::nullopt;
}

std::vector<std::string> KnownModelConfigNames() {
  return {"mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b",    "qwen2-57b-a14b", "olmoe-1b-7b",
          "llama-3.1-8b", "dbrx",          "deepseek-v2-lite", "gpt-oss-20b"};
}

}  // namespace moebatch
