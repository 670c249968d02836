#include "engine/model/gguf_tensors.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moebatch {
namespace {

// Layer-local Hugging Face names (after "model.layers.L.") with one GGUF name each.
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
};

// An expert projection's GGUF stem ("gate", "up", "down") from its Hugging Face name.
const char* ExpertStem(const std::string& projection) {
  if (projection == "w1" || projection == "gate_proj") return "gate";
  if (projection == "w3" || projection == "up_proj") return "up";
  if (projection == "w2" || projection == "down_proj") return "down";
  return nullptr;
}

std::string Dims(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i ? ", " : "", v[i]);
  return out + "]";
}

}  // namespace

int64_t GgufRowOf(int64_t row, int64_t rows, int64_t heads) {
  const int64_t d = rows / heads, half = d / 2;
  const int64_t h = row / d, j = row % d, s = j / half, i = j % half;
  return h * d + 2 * i + s;
}

absl::StatusOr<GgufTensorSource> FindGgufSource(const GgufFile& file, const ModelConfig& config,
                                                const TensorSpec& spec) {
  const std::string& name = spec.name;
  std::string gguf;
  int64_t expert = -1;
  std::string per_expert;  // the older one-tensor-per-expert name
  bool rope_permuted = false;
  if (name == "model.embed_tokens.weight") {
    gguf = "token_embd.weight";
  } else if (name == "model.norm.weight") {
    gguf = "output_norm.weight";
  } else if (name == "lm_head.weight") {
    gguf = "output.weight";
  } else if (absl::StartsWith(name, "model.layers.")) {
    const std::vector<std::string> parts = absl::StrSplit(name, absl::MaxSplits('.', 3));
    int64_t layer = -1;
    if (parts.size() == 4 && absl::SimpleAtoi(parts[2], &layer)) {
      const std::string& rest = parts[3];
      const std::string blk = absl::StrCat("blk.", layer, ".");
      for (const auto& [hf, g] : kLayerNames) {
        if (rest == hf) gguf = blk + g;
      }
      // <moe>.experts.E.<projection>.weight
      const std::vector<std::string> e = absl::StrSplit(rest, '.');
      if (gguf.empty() && e.size() == 5 && e[1] == "experts" && e[4] == "weight" &&
          absl::SimpleAtoi(e[2], &expert)) {
        if (const char* stem = ExpertStem(e[3])) {
          gguf = absl::StrCat(blk, "ffn_", stem, "_exps.weight");
          per_expert = absl::StrCat(blk, "ffn_", stem, ".", expert, ".weight");
        }
      }
      // convert_hf_to_gguf.py permutes llama-architecture (Llama, Mistral, Mixtral) q and k.
      const bool llama_rope = config.model_type == "llama" || config.model_type == "mistral" ||
                              config.model_type == "mixtral";
      rope_permuted = llama_rope && (absl::StartsWith(rest, "self_attn.q_proj.") ||
                                     absl::StartsWith(rest, "self_attn.k_proj."));
    }
  }
  if (gguf.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": no GGUF name for tensor \"", name, "\""));
  }
  GgufTensorSource src;
  src.rows = spec.shape.size() == 2 ? spec.shape[0] : 1;
  src.cols = spec.shape.empty() ? 1 : spec.shape.back();
  std::vector<int64_t> want = {src.cols};  // ne, the GGUF order
  if (spec.shape.size() == 2) want.push_back(src.rows);
  const GgufTensor* t = nullptr;
  if (expert >= 0 && (t = file.FindTensor(gguf)) != nullptr) {
    src.expert = expert;
    want.push_back(config.num_local_experts);
  } else if (expert >= 0) {
    t = file.FindTensor(per_expert);
    gguf = per_expert;
  } else {
    t = file.FindTensor(gguf);
  }
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(file.path(), ": no tensor \"", gguf, "\" (for \"", name, "\")"));
  }
  // A [1, n] tensor may be stored 1-D (the shared expert gate).
  std::vector<int64_t> got = t->ne;
  if (got.size() == 1 && want.size() == 2 && want[1] == 1) got.push_back(1);
  if (got != want) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor \"", gguf, "\" (for \"",
                                                   name, "\") has ne ", Dims(t->ne), ", expected ",
                                                   Dims(want)));
  }
  src.tensor = t;
  if (rope_permuted) {
    src.rope_heads = absl::StrContains(name, ".q_proj.") ? config.num_attention_heads
                                                         : config.num_key_value_heads;
  }
  return src;
}

absl::StatusOr<GgufModelBytes> GgufTensorBytes(const GgufFile& file, const ModelConfig& config) {
  GgufModelBytes out;
  ModelWeights scratch;
  const auto regions = ModelTensors(config, config.num_hidden_layers, &scratch);
  std::map<std::string, int64_t> by_type;
  for (size_t r = 0; r < regions.size(); ++r) {
    int64_t bytes = 0;
    for (const TensorSpec& spec : regions[r]) {
      auto src = FindGgufSource(file, config, spec);
      if (!src.ok()) return src.status();
      const int64_t b = src->rows * GgmlRowBytes(src->tensor->type, src->cols);
      bytes += b;
      by_type[src->tensor->type.name] += b;
      out.params += src->rows * src->cols;
    }
    out.total += bytes;
    if (r > 0) out.max_layer = std::max(out.max_layer, bytes);
  }
  int64_t most = -1;
  for (const auto& [type, b] : by_type) {
    if (b > most) {
      most = b;
      out.main_type = type;
    }
  }
  return out;
}

}  // namespace moebatch
