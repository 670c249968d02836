// DBRX (transformers models/dbrx: DbrxConfig, DbrxForCausalLM; databricks/dbrx-base and
// dbrx-instruct, the second model MoE-Lens evaluates, §7): config.json with its own names (d_model,
// n_heads, n_layers, max_seq_len) and nested attn_config {kv_n_heads, clip_qkv, rope_theta} and
// ffn_config {ffn_hidden_size, moe_num_experts, moe_top_k, moe_normalize_expert_weights,
// ffn_act_fn}; LayerNorm without bias (nn.LayerNorm(d_model, bias=False), eps 1e-5) before
// attention, before the FFN and at the end; one fused Wqkv [q + 2 kv, d_model] whose output is
// clamped to +-clip_qkv (DbrxAttention.forward), no biases anywhere; the router's softmax over
// every expert, top-k, the top-k weights divided by their p-norm, p = moe_normalize_expert_weights
// (DbrxRouter.forward); the experts fused per layer (DbrxExpertGLU): w1 (gate) and v1 (up)
// [experts * ffn, d_model], w2 (down) [experts * ffn, d_model] used as x @ w2_e, i.e. each expert's
// down projection stored transposed.
//
// The checkpoint's tensors map onto the shared layout's (Mixtral's names, engine/model/family.h):
//   transformer.wte.weight                              model.embed_tokens.weight
//   transformer.blocks.{l}.norm_attn_norm.norm_1.weight model.layers.{l}.input_layernorm.weight
//   transformer.blocks.{l}.norm_attn_norm.attn.Wqkv.weight
//                                rows [0, q) q_proj, [q, q + kv) k_proj, [q + kv, q + 2 kv) v_proj
//   transformer.blocks.{l}.norm_attn_norm.attn.out_proj.weight   o_proj
//   transformer.blocks.{l}.norm_attn_norm.norm_2.weight          post_attention_layernorm
//   transformer.blocks.{l}.ffn.router.layer.weight               block_sparse_moe.gate (router)
//   transformer.blocks.{l}.ffn.experts.mlp.{w1,v1}  rows [e ffn, (e + 1) ffn): expert e's w1, w3
//   transformer.blocks.{l}.ffn.experts.mlp.w2       rows [e ffn, (e + 1) ffn) transposed: its w2
//   transformer.norm_f.weight                           model.norm.weight
//   lm_head.weight                                      lm_head.weight
// Every part is a view into the mapped file but the down projections, which are copied transposed
// at load (Checkpoint::Load).
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/model/config_keys.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

using Json = nlohmann::json;
using config_keys::KeyError;

// The nested object at `key` (attn_config, ffn_config); an empty one when absent or null (the
// transformers defaults).
absl::StatusOr<Json> SubConfig(const Json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Json::object();
  if (!it->is_object()) return KeyError(key, absl::StrCat("must be an object, got ", it->dump()));
  return *it;
}

// An error from reading a key of sub-config `sub`, named as "<sub>.<key>".
absl::Status InSub(const char* sub, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(sub, ": ", s.message()));
}

absl::Status Normalize(Json* j) {
  using config_keys::ReadPositiveDouble;
  using config_keys::ReadPositiveInt;
  auto attn = SubConfig(*j, "attn_config");
  if (!attn.ok()) return attn.status();
  auto ffn = SubConfig(*j, "ffn_config");
  if (!ffn.ok()) return ffn.status();
  int64_t d_model = 0, n_heads = 0, n_layers = 0, max_seq_len = 0, kv_heads = 0, ffn_size = 0;
  for (auto [key, field] :
       {std::pair{"d_model", &d_model}, {"n_heads", &n_heads}, {"n_layers", &n_layers}}) {
    if (absl::Status s = ReadPositiveInt(*j, key, std::nullopt, field); !s.ok()) return s;
  }
  if (d_model % n_heads != 0) {
    return KeyError("d_model",
                    absl::StrCat("(", d_model, ") is not divisible by n_heads (", n_heads, ")"));
  }
  // DbrxConfig defaults: max_seq_len 2048, kv_n_heads 1, rope_theta 10000.
  if (absl::Status s = ReadPositiveInt(*j, "max_seq_len", 2048, &max_seq_len); !s.ok()) return s;
  if (absl::Status s = InSub("attn_config", ReadPositiveInt(*attn, "kv_n_heads", 1, &kv_heads));
      !s.ok()) {
    return s;
  }
  double rope_theta = 0;
  if (absl::Status s =
          InSub("attn_config", ReadPositiveDouble(*attn, "rope_theta", 10000.0, &rope_theta));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          InSub("ffn_config", ReadPositiveInt(*ffn, "ffn_hidden_size", std::nullopt, &ffn_size));
      !s.ok()) {
    return s;
  }
  if (const auto it = j->find("tie_word_embeddings"); it != j->end() && *it == true) {
    return KeyError("tie_word_embeddings", "is true, which DBRX does not support (DbrxConfig)");
  }
  // The shared keys, as DbrxConfig's attribute_map names them; DbrxRotaryEmbedding has no
  // scaling and DbrxAttention no sliding window, so any such key is not the model's.
  (*j)["hidden_size"] = d_model;
  (*j)["num_attention_heads"] = n_heads;
  (*j)["num_hidden_layers"] = n_layers;
  (*j)["max_position_embeddings"] = max_seq_len;
  (*j)["num_key_value_heads"] = kv_heads;
  (*j)["intermediate_size"] = ffn_size;
  (*j)["rope_theta"] = rope_theta;
  (*j)["head_dim"] = d_model / n_heads;
  (*j)["rms_norm_eps"] = 1e-5;  // nn.LayerNorm's default eps
  for (const char* key : {"rope_scaling", "rope_parameters", "sliding_window"}) j->erase(key);
  return absl::OkStatus();
}

absl::Status Parse(const Json& j, ModelConfig* c) {
  using config_keys::ReadPositiveInt;
  auto attn = SubConfig(j, "attn_config");
  if (!attn.ok()) return attn.status();
  auto ffn = SubConfig(j, "ffn_config");
  if (!ffn.ok()) return ffn.status();
  c->norm = NormType::kLayerNorm;
  c->qkv_bias = c->o_bias = false;
  // DbrxFFNConfig defaults: 4 experts, top-1, moe_normalize_expert_weights 1.
  if (absl::Status s =
          InSub("ffn_config", ReadPositiveInt(*ffn, "moe_num_experts", 4, &c->num_local_experts));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          InSub("ffn_config", ReadPositiveInt(*ffn, "moe_top_k", 1, &c->num_experts_per_tok));
      !s.ok()) {
    return s;
  }
  c->norm_topk_prob = true;
  c->topk_norm_p = 1.0;
  if (const auto it = ffn->find("moe_normalize_expert_weights"); it != ffn->end()) {
    if (it->is_null()) {
      c->norm_topk_prob = false;  // the top-k softmax probabilities as they are
    } else if (absl::Status s = InSub(
                   "ffn_config", config_keys::ReadPositiveDouble(
                                     *ffn, "moe_normalize_expert_weights", 1.0, &c->topk_norm_p));
               !s.ok()) {
      return s;
    }
  }
  if (const auto it = ffn->find("ffn_act_fn"); it != ffn->end() && !it->is_null()) {
    const std::string name = it->is_object() && it->contains("name") && (*it)["name"].is_string()
                                 ? (*it)["name"].get<std::string>()
                                 : std::string();
    if (name != "silu") {
      return KeyError("ffn_config.ffn_act_fn",
                      absl::StrCat("is ", it->dump(),
                                   "; moebatch computes DBRX's experts with {\"name\": \"silu\"}"));
    }
  }
  c->clip_qkv.reset();
  if (const auto it = attn->find("clip_qkv"); it != attn->end() && !it->is_null()) {
    double clip = 0;
    if (absl::Status s =
            InSub("attn_config", config_keys::ReadPositiveDouble(*attn, "clip_qkv", 1.0, &clip));
        !s.ok()) {
      return s;
    }
    c->clip_qkv = clip;
  }
  return absl::OkStatus();
}

void MapTensors(const ModelConfig& c, std::vector<std::vector<TensorSpec>>* regions) {
  const int64_t hidden = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  const int64_t ffn = c.intermediate_size, experts = c.num_local_experts;
  for (auto& region : *regions) {
    for (TensorSpec& t : region) {
      if (t.name == "model.embed_tokens.weight") {
        t.source = "transformer.wte.weight";
      } else if (t.name == "model.norm.weight") {
        t.source = "transformer.norm_f.weight";
      }
      int64_t l = 0;
      std::string rest;
      if (!SplitLayerName(t.name, &l, &rest)) continue;
      const std::string p = absl::StrCat("transformer.blocks.", l, ".");
      const std::string attn = p + "norm_attn_norm.attn.";
      auto wqkv_rows = [&](int64_t row) {
        t.source = attn + "Wqkv.weight";
        t.source_shape = {q + 2 * kv, hidden};
        t.source_row = row;
      };
      if (rest == "input_layernorm.weight") {
        t.source = p + "norm_attn_norm.norm_1.weight";
      } else if (rest == "post_attention_layernorm.weight") {
        t.source = p + "norm_attn_norm.norm_2.weight";
      } else if (rest == "self_attn.q_proj.weight") {
        wqkv_rows(0);
      } else if (rest == "self_attn.k_proj.weight") {
        wqkv_rows(q);
      } else if (rest == "self_attn.v_proj.weight") {
        wqkv_rows(q + kv);
      } else if (rest == "self_attn.o_proj.weight") {
        t.source = attn + "out_proj.weight";
      } else if (rest == "block_sparse_moe.gate.weight") {
        t.source = p + "ffn.router.layer.weight";
      } else if (absl::StartsWith(rest, "block_sparse_moe.experts.")) {
        // "block_sparse_moe.experts.<e>.<w1|w2|w3>.weight"
        const std::string tail = rest.substr(std::string_view("block_sparse_moe.experts.").size());
        const size_t dot = tail.find('.');
        int64_t e = 0;
        if (dot == std::string::npos || !absl::SimpleAtoi(tail.substr(0, dot), &e)) continue;
        const std::string proj = tail.substr(dot + 1);
        const char* fused = proj == "w1.weight"   ? "w1"
                            : proj == "w3.weight" ? "v1"
                            : proj == "w2.weight" ? "w2"
                                                  : nullptr;
        if (fused == nullptr) continue;
        t.source = absl::StrCat(p, "ffn.experts.mlp.", fused);
        t.source_shape = {experts * ffn, hidden};
        t.source_row = e * ffn;
        t.transposed = proj == "w2.weight";  // x @ w2_e: stored [ffn, hidden], used [hidden, ffn]
      }
    }
  }
}

}  // namespace

const ModelFamily kDbrx = {"dbrx", "DbrxForCausalLM", Parse,     "block_sparse_moe", "w1", "w3",
                           "w2",   Normalize,         MapTensors};

}  // namespace moebatch::families
