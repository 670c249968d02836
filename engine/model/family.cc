#include "engine/model/family.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace moebatch {
namespace {

// Multi-head latent attention's tensors (DeepseekV2Attention / DeepseekV3Attention), below
// "model.layers.<l>.self_attn.".
void MlaTensors(const ModelConfig& c, const std::string& a, LayerWeights* lw,
                std::vector<TensorSpec>* r) {
  const MlaConfig& m = *c.mla;
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads;
  if (m.q_lora_rank == 0) {
    r->push_back({a + "q_proj.weight", {heads * m.qk_head_dim(), hidden}, &lw->q_proj});
  } else {
    r->push_back({a + "q_a_proj.weight", {m.q_lora_rank, hidden}, &lw->q_a_proj});
    r->push_back({a + "q_a_layernorm.weight", {m.q_lora_rank}, &lw->q_a_layernorm});
    r->push_back({a + "q_b_proj.weight", {heads * m.qk_head_dim(), m.q_lora_rank}, &lw->q_b_proj});
  }
  r->push_back({a + "kv_a_proj_with_mqa.weight", {m.latent_dim(), hidden}, &lw->kv_a_proj});
  r->push_back({a + "kv_a_layernorm.weight", {m.kv_lora_rank}, &lw->kv_a_layernorm});
  r->push_back({a + "kv_b_proj.weight",
                {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
                &lw->kv_b_proj});
  r->push_back({a + "o_proj.weight", {hidden, heads * m.v_head_dim}, &lw->o_proj});
}

const ModelFamily* const kFamilies[] = {
    &families::kDbrx,  &families::kDeepseekV2, &families::kDeepseekV3, &families::kGptOss,
    &families::kLlama, &families::kMistral,    &families::kMixtral,    &families::kOlmoe,
    &families::kQwen2, &families::kQwen2Moe,   &families::kQwen3,      &families::kQwen3Moe,
};

}  // namespace

bool SplitLayerName(const std::string& name, int64_t* layer, std::string* rest) {
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::StartsWith(name, kPrefix)) return false;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return false;
  if (!absl::SimpleAtoi(name.substr(kPrefix.size(), dot - kPrefix.size()), layer)) return false;
  *rest = name.substr(dot + 1);
  return true;
}

const ModelFamily* FindModelFamily(std::string_view model_type) {
  for (const ModelFamily* family : kFamilies) {
    if (model_type == family->model_type) return family;
  }
  return nullptr;
}

const ModelFamily* FindModelFamilyByArchitecture(std::string_view architecture) {
  for (const ModelFamily* family : kFamilies) {
    if (architecture == family->architecture) return family;
  }
  return nullptr;
}

std::string SupportedModelTypes() {
  std::vector<std::string> names;
  for (const ModelFamily* family : kFamilies) names.emplace_back(family->model_type);
  return absl::StrJoin(names, ", ");
}

std::vector<std::vector<TensorSpec>> ModelTensors(const ModelConfig& c, int64_t num_layers,
                                                  ModelWeights* w) {
  const ModelFamily* family = FindModelFamily(c.model_type);
  if (family == nullptr) family = &families::kMixtral;  // a config made in code (tests)
  const int64_t hidden = c.hidden_size;
  std::vector<std::vector<TensorSpec>> regions(1 + num_layers);
  regions[0].push_back({"model.embed_tokens.weight", {c.vocab_size, hidden}, &w->embed_tokens});
  regions[0].push_back({"model.norm.weight", {hidden}, &w->norm});
  if (!c.tie_word_embeddings) {
    regions[0].push_back({"lm_head.weight", {c.vocab_size, hidden}, &w->lm_head});
  }
  w->layers.assign(num_layers, LayerWeights{});
  for (int64_t l = 0; l < num_layers; ++l) {
    LayerWeights& lw = w->layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    auto& r = regions[1 + l];
    r.push_back({p + "input_layernorm.weight", {hidden}, &lw.input_layernorm});
    const std::string a = p + "self_attn.";
    if (c.mla) {
      MlaTensors(c, a, &lw, &r);
    } else {
      r.push_back({a + "q_proj.weight", {c.q_size(), hidden}, &lw.q_proj});
      r.push_back({a + "k_proj.weight", {c.kv_size(), hidden}, &lw.k_proj});
      r.push_back({a + "v_proj.weight", {c.kv_size(), hidden}, &lw.v_proj});
      r.push_back({a + "o_proj.weight", {hidden, c.q_size()}, &lw.o_proj});
      if (c.qkv_bias) {
        r.push_back({a + "q_proj.bias", {c.q_size()}, &lw.q_bias});
        r.push_back({a + "k_proj.bias", {c.kv_size()}, &lw.k_bias});
        r.push_back({a + "v_proj.bias", {c.kv_size()}, &lw.v_bias});
      }
      if (c.o_bias) r.push_back({a + "o_proj.bias", {hidden}, &lw.o_bias});
      if (c.attention_sinks) {
        r.push_back({a + "sinks", {c.num_attention_heads}, &lw.sinks});
      }
      if (c.qk_norm == QkNorm::kPerHead) {
        r.push_back({a + "q_norm.weight", {c.head_dim}, &lw.q_norm});
        r.push_back({a + "k_norm.weight", {c.head_dim}, &lw.k_norm});
      } else if (c.qk_norm == QkNorm::kPerProjection) {
        r.push_back({a + "q_norm.weight", {c.q_size()}, &lw.q_norm});
        r.push_back({a + "k_norm.weight", {c.kv_size()}, &lw.k_norm});
      }
    }
    r.push_back({p + "post_attention_layernorm.weight", {hidden}, &lw.post_attention_layernorm});
    auto ffn = [&](const std::string& prefix, const char* gate, const char* up, const char* down,
                   int64_t width, ExpertWeights* e) {
      r.push_back({prefix + gate + ".weight", {width, hidden}, &e->w1});
      r.push_back({prefix + up + ".weight", {width, hidden}, &e->w3});
      r.push_back({prefix + down + ".weight", {hidden, width}, &e->w2});
    };
    if (!c.IsMoeLayer(l)) {
      lw.experts.resize(1);
      ffn(p + "mlp.", "gate_proj", "up_proj", "down_proj", c.dense_intermediate_size,
          &lw.experts[0]);
      continue;
    }
    const std::string m = absl::StrCat(p, family->moe_prefix, ".");
    r.push_back({m + "gate.weight", {c.num_local_experts, hidden}, &lw.router});
    if (c.router_linear_bias) {
      r.push_back({m + "gate.bias", {c.num_local_experts}, &lw.router_linear_bias});
    }
    if (c.expert_bias) {  // gpt-oss: the fused experts' biases, read whole
      r.push_back({m + "experts.gate_up_proj_bias",
                   {c.num_local_experts, 2 * c.intermediate_size},
                   &lw.experts_gate_up_bias});
      r.push_back(
          {m + "experts.down_proj_bias", {c.num_local_experts, hidden}, &lw.experts_down_bias});
    }
    if (c.topk_method == TopkMethod::kNoauxTc) {
      r.push_back({m + "gate.e_score_correction_bias", {c.num_local_experts}, &lw.router_bias});
    }
    lw.experts.resize(c.num_local_experts);
    for (int64_t e = 0; e < c.num_local_experts; ++e) {
      ffn(absl::StrCat(m, "experts.", e, "."), family->expert_gate, family->expert_up,
          family->expert_down, c.intermediate_size, &lw.experts[e]);
    }
    if (c.shared_expert_intermediate_size > 0 && !c.shared_expert_gated) {  // DeepSeek
      ffn(m + "shared_experts.", "gate_proj", "up_proj", "down_proj",
          c.shared_expert_intermediate_size, &lw.shared_expert);
    } else if (c.shared_expert_intermediate_size > 0) {
      ffn(m + "shared_expert.", "gate_proj", "up_proj", "down_proj",
          c.shared_expert_intermediate_size, &lw.shared_expert);
      r.push_back({m + "shared_expert_gate.weight", {1, hidden}, &lw.shared_expert_gate});
    }
  }
  if (family->map_tensors != nullptr) family->map_tensors(c, &regions);
  return regions;
}

}  // namespace moebatch
