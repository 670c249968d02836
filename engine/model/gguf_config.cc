#include "engine/model/gguf_config.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;

struct Arch {
  const char* gguf;        // general.architecture
  const char* model_type;  // config.json model_type
  const char* architecture;
  bool moe;
};

constexpr Arch kArchs[] = {
    {"llama", "llama", "LlamaForCausalLM", false},
    {"qwen2", "qwen2", "Qwen2ForCausalLM", false},
    {"qwen3", "qwen3", "Qwen3ForCausalLM", false},
    {"qwen2moe", "qwen2_moe", "Qwen2MoeForCausalLM", true},
    {"qwen3moe", "qwen3_moe", "Qwen3MoeForCausalLM", true},
    {"olmoe", "olmoe", "OlmoeForCausalLM", true},
};

// Copies metadata key `<arch>.<suffix>` into config key `to` when present (integers as integers,
// floats as floats); `required` makes its absence NotFound.
class Mapper {
 public:
  Mapper(const GgufFile& file, std::string arch, Json* out)
      : file_(file), arch_(std::move(arch)), out_(out) {}

  absl::Status Int(const std::string& suffix, const char* to, bool required = false) {
    const std::string key = arch_ + "." + suffix;
    if (file_.Find(key) == nullptr) return Absent(key, required);
    auto v = file_.GetInt(key);
    if (!v.ok()) return v.status();
    (*out_)[to] = *v;
    return absl::OkStatus();
  }
  absl::Status Float(const std::string& suffix, const char* to, bool required = false) {
    const std::string key = arch_ + "." + suffix;
    if (file_.Find(key) == nullptr) return Absent(key, required);
    auto v = file_.GetFloat(key);
    if (!v.ok()) return v.status();
    (*out_)[to] = *v;
    return absl::OkStatus();
  }
  bool Has(const std::string& suffix) const { return file_.Find(arch_ + "." + suffix) != nullptr; }

 private:
  absl::Status Absent(const std::string& key, bool required) const {
    if (!required) return absl::OkStatus();
    return absl::NotFoundError(
        absl::StrCat(file_.path(), ": GGUF: no metadata key \"", key, "\" (required)"));
  }
  const GgufFile& file_;
  std::string arch_;
  Json* out_;
};

}  // namespace

absl::StatusOr<Json> GgufConfigJson(const GgufFile& file) {
  auto arch_name = file.GetString("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  const Arch* arch = nullptr;
  std::string supported;
  for (const Arch& a : kArchs) {
    if (*arch_name == a.gguf) arch = &a;
    absl::StrAppend(&supported, supported.empty() ? "" : ", ", a.gguf);
  }
  if (arch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": GGUF: general.architecture is \"", *arch_name,
        "\", which moebatch does not run; it runs ", supported, " (llama with experts: Mixtral)"));
  }
  Json c = Json::object();
  Mapper m(file, arch->gguf, &c);
  for (const absl::Status& s :
       {m.Int("block_count", "num_hidden_layers", true),
        m.Int("embedding_length", "hidden_size", true),
        m.Int("attention.head_count", "num_attention_heads", true),
        m.Int("attention.head_count_kv", "num_key_value_heads"),
        m.Int("attention.key_length", "head_dim"),
        m.Int("context_length", "max_position_embeddings"), m.Float("rope.freq_base", "rope_theta"),
        m.Float("attention.layer_norm_rms_epsilon", "rms_norm_eps", true),
        m.Int("attention.sliding_window", "sliding_window"), m.Int("vocab_size", "vocab_size")}) {
    if (!s.ok()) return s;
  }
  if (!c.contains("rope_theta")) c["rope_theta"] = 10000.0;  // llama.cpp's default freq_base
  if (!c.contains("num_key_value_heads")) c["num_key_value_heads"] = c["num_attention_heads"];
  if (!c.contains("vocab_size")) {
    const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
    if (tokens == nullptr) {
      return absl::NotFoundError(absl::StrCat(file.path(), ": GGUF: neither \"", arch->gguf,
                                              ".vocab_size\" nor \"tokenizer.ggml.tokens\""));
    }
    c["vocab_size"] = tokens->elements.size();
  }
  for (const auto& [key, to] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"}}) {
    if (file.Find(key) == nullptr) continue;
    auto id = file.GetInt(key);
    if (!id.ok()) return id.status();
    c[to] = *id;
  }
  c["tie_word_embeddings"] = file.FindTensor("output.weight") == nullptr;
  // The weights' own types are the tensors'; the config's dtype is what the engine computes from.
  c["torch_dtype"] = "float32";
  if (const GgufValue* type = file.Find(absl::StrCat(arch->gguf, ".rope.scaling.type"))) {
    if (type->type != GgufValueType::kString) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": GGUF: key \"", arch->gguf,
                                                     ".rope.scaling.type\" is not a string"));
    }
    if (type->s != "none") {
      Json scaling = {{"rope_type", type->s}};
      Json* out = &scaling;
      Mapper rope(file, arch->gguf, out);
      for (const absl::Status& s :
           {rope.Float("rope.scaling.factor", "factor"),
            rope.Int("rope.scaling.original_context_length", "original_max_position_embeddings")}) {
        if (!s.ok()) return s;
      }
      c["rope_scaling"] = scaling;
    }
  }
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(),
                     ": GGUF: tensor \"rope_freqs.weight\" (llama3-style RoPE frequency factors) "
                     "is not read by moebatch yet; use the Hugging Face checkpoint"));
  }

  std::string model_type = arch->model_type;
  std::string architecture = arch->architecture;
  const bool llama_experts = std::string(arch->gguf) == "llama" && m.Has("expert_count") &&
                             file.GetInt(absl::StrCat(arch->gguf, ".expert_count")).value_or(0) > 0;
  if (llama_experts) {
    model_type = "mixtral";
    architecture = "MixtralForCausalLM";
  }
  if (arch->moe || llama_experts) {
    for (const absl::Status& s :
         {m.Int("expert_count", llama_experts ? "num_local_experts" : "num_experts", true),
          m.Int("expert_used_count", "num_experts_per_tok", true)}) {
      if (!s.ok()) return s;
    }
  }
  if (std::string(arch->gguf) == "qwen2moe" || std::string(arch->gguf) == "qwen3moe") {
    for (const absl::Status& s :
         {m.Int("expert_feed_forward_length", "moe_intermediate_size", true),
          m.Int("feed_forward_length", "intermediate_size"),
          m.Int("expert_shared_feed_forward_length", "shared_expert_intermediate_size")}) {
      if (!s.ok()) return s;
    }
    if (!c.contains("intermediate_size")) c["intermediate_size"] = c["moe_intermediate_size"];
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = Json::array();
    // llama.cpp renormalises Qwen3-MoE's top-k weights and not Qwen2-MoE's, unless the file says.
    bool norm = std::string(arch->gguf) == "qwen3moe";
    if (const GgufValue* v = file.Find(absl::StrCat(arch->gguf, ".expert_weights_norm"))) {
      norm = v->type == GgufValueType::kBool ? v->b : v->i != 0;
    }
    c["norm_topk_prob"] = norm;
  } else if (std::string(arch->gguf) == "olmoe") {
    if (absl::Status s = m.Int("expert_feed_forward_length", "intermediate_size"); !s.ok())
      return s;
    if (!c.contains("intermediate_size")) {
      if (absl::Status s = m.Int("feed_forward_length", "intermediate_size", true); !s.ok()) {
        return s;
      }
    }
    c["norm_topk_prob"] = false;
    if (absl::Status s = m.Float("attention.clamp_kqv", "clip_qkv"); !s.ok()) return s;
  } else {
    if (absl::Status s = m.Int("feed_forward_length", "intermediate_size", true); !s.ok()) return s;
  }
  if (std::string(arch->gguf) == "qwen2moe") {
    // Qwen2-MoE's shared expert gate [1, hidden]: its presence is the shared expert's.
    if (!c.contains("shared_expert_intermediate_size")) c["shared_expert_intermediate_size"] = 0;
  }
  c["model_type"] = model_type;
  c["architectures"] = Json::array({architecture});
  return c;
}

absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file) {
  auto json = GgufConfigJson(file);
  if (!json.ok()) return json.status();
  auto config = ParseModelConfig(json->dump());
  if (!config.ok()) {
    return absl::Status(
        config.status().code(),
        absl::StrCat(file.path(), ": GGUF metadata as config.json: ", config.status().message()));
  }
  return config;
}

}  // namespace moebatch
