// DeepSeek-V2 and DeepSeek-V3 (transformers models/deepseek_v2: DeepseekV2Config,
// DeepseekV2ForCausalLM; models/deepseek_v3: DeepseekV3Config, DeepseekV3ForCausalLM;
// DeepSeek-V2-Lite, DeepSeek-V2, DeepSeek-V3, Kimi-K2-style configs of the same classes).
//
// Attention: multi-head latent attention (ModelConfig::mla, engine/model/mla.h), with q_proj
// (q_lora_rank null) or q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
// kv_b_proj, o_proj; RoPE on qk_rope_head_dim values, interleaved pairs (V2 always, V3 with
// rope_interleave) or halves; yarn with mscale / mscale_all_dim.
// FFN: the first first_k_dense_replace layers (and, V2, layers not a multiple of moe_layer_freq)
// are a dense MLP of intermediate_size; the others n_routed_experts experts of
// moe_intermediate_size (mlp.experts.{e}.gate_proj/up_proj/down_proj), plus
// n_shared_experts x moe_intermediate_size of shared experts (mlp.shared_experts.*, ungated),
// routed by mlp.gate: V2 topk_method greedy / group_limited_greedy (softmax scores), V3 noaux_tc
// (sigmoid scores plus mlp.gate.e_score_correction_bias), weights x routed_scaling_factor.
//
// Differences from transformers 4.57 that no released checkpoint meets: V2's norm_topk_prob is
// honoured as DeepSeek's own modeling code does (transformers ignores it; V2 and V2-Lite set it
// false, where both agree).
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/model/config_keys.h"
#include "engine/model/family.h"

namespace moebatch::families {
namespace {

using config_keys::KeyError;
using config_keys::ReadInt;
using config_keys::ReadPositiveInt;

double GetMscale(double scale, double mscale) {  // yarn_get_mscale
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// Reads a positive integer that may be null (q_lora_rank, n_group, topk_group): 0 when null or
// absent and there is no fallback.
absl::Status ReadOptionalPositive(const nlohmann::json& j, const char* key, int64_t fallback,
                                  int64_t* out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = fallback;
    return absl::OkStatus();
  }
  return ReadPositiveInt(j, key, std::nullopt, out);
}

// The keys DeepseekV2Config and DeepseekV3Config share. `v3` picks V3's defaults and routing.
absl::Status ParseDeepseek(const nlohmann::json& j, ModelConfig* c, bool v3) {
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    if (absl::Status s = config_keys::ReadBool(j, key, false, &bias); !s.ok()) return s;
    if (bias) return KeyError(key, "is true: biases in DeepSeek's projections are not computed");
  }
  if (const auto it = j.find("hidden_act"); it != j.end() && !it->is_null() && *it != "silu") {
    return KeyError("hidden_act", absl::StrCat("is ", it->dump(), "; moebatch computes silu"));
  }
  MlaConfig m;
  // q_lora_rank: null means q_proj (V2-Lite); absent, the config classes' default 1536.
  if (const auto it = j.find("q_lora_rank"); it != j.end() && it->is_null()) {
    m.q_lora_rank = 0;
  } else if (absl::Status s = ReadPositiveInt(j, "q_lora_rank", int64_t{1536}, &m.q_lora_rank);
             !s.ok()) {
    return s;
  }
  for (auto [key, fallback, field] :
       {std::tuple{"kv_lora_rank", int64_t{512}, &m.kv_lora_rank},
        std::tuple{"qk_nope_head_dim", int64_t{128}, &m.qk_nope_head_dim},
        std::tuple{"qk_rope_head_dim", int64_t{64}, &m.qk_rope_head_dim},
        std::tuple{"v_head_dim", int64_t{128}, &m.v_head_dim}}) {
    if (absl::Status s = ReadPositiveInt(j, key, fallback, field); !s.ok()) return s;
  }
  if (m.qk_rope_head_dim % 2 != 0) {
    return KeyError("qk_rope_head_dim",
                    absl::StrCat("must be even for RoPE, got ", m.qk_rope_head_dim));
  }
  m.rope_interleave = true;
  if (v3) {
    if (absl::Status s = config_keys::ReadBool(j, "rope_interleave", true, &m.rope_interleave);
        !s.ok()) {
      return s;
    }
  }
  m.softmax_scale = 1.0 / std::sqrt(static_cast<double>(m.qk_head_dim()));
  const RopeScaling& r = c->rope_scaling;
  if (v3 && r.type != RopeScaling::Type::kDefault && r.mscale_all_dim.value_or(0) != 0) {
    const double mscale = GetMscale(r.factor, *r.mscale_all_dim);
    m.softmax_scale *= mscale * mscale;
  }
  // The attention the CPU computes: MQA over the latent rows (ModelConfig::mla).
  c->num_key_value_heads = 1;
  c->head_dim = m.latent_dim();
  c->mla = m;
  c->sliding_window.reset();

  // Experts. n_routed_experts null: a dense model (every layer the MLP).
  int64_t routed = 0;
  if (const auto it = j.find("n_routed_experts"); it == j.end() || !it->is_null()) {
    if (absl::Status s = ReadPositiveInt(j, "n_routed_experts", v3 ? 256 : 64, &routed); !s.ok()) {
      return s;
    }
  }
  if (routed == 0) {
    c->dense = true;
    return absl::OkStatus();
  }
  c->num_local_experts = routed;
  if (absl::Status s =
          ReadPositiveInt(j, "num_experts_per_tok", v3 ? std::optional<int64_t>(8) : std::nullopt,
                          &c->num_experts_per_tok);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ReadPositiveInt(j, "moe_intermediate_size", v3 ? 2048 : 1407, &c->intermediate_size);
      !s.ok()) {
    return s;
  }
  int64_t shared = 0;
  if (const auto it = j.find("n_shared_experts"); it == j.end() || !it->is_null()) {
    if (absl::Status s = ReadInt(j, "n_shared_experts", v3 ? 1 : 2, &shared); !s.ok()) return s;
    if (shared < 0) return KeyError("n_shared_experts", "must not be negative");
  }
  c->shared_expert_intermediate_size = shared * c->intermediate_size;
  c->shared_expert_gated = false;
  if (absl::Status s = config_keys::ReadBool(j, "norm_topk_prob", v3, &c->norm_topk_prob);
      !s.ok()) {
    return s;
  }
  if (const auto it = j.find("routed_scaling_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) return KeyError("routed_scaling_factor", "must be a number");
    c->routed_scaling_factor = it->get<double>();
  } else {
    c->routed_scaling_factor = v3 ? 2.5 : 1.0;
  }
  if (!(c->routed_scaling_factor > 0) || !std::isfinite(c->routed_scaling_factor)) {
    return KeyError("routed_scaling_factor", "must be a positive number");
  }
  if (v3) {
    c->topk_method = TopkMethod::kNoauxTc;
  } else {
    const std::string method = j.value("topk_method", std::string("greedy"));
    if (method == "greedy") {
      c->topk_method = TopkMethod::kGreedy;
    } else if (method == "group_limited_greedy") {
      c->topk_method = TopkMethod::kGroupLimitedGreedy;
    } else if (method == "noaux_tc") {
      c->topk_method = TopkMethod::kNoauxTc;
    } else {
      return KeyError(
          "topk_method",
          absl::StrCat("is \"", method,
                       "\"; moebatch computes greedy, group_limited_greedy and noaux_tc"));
    }
  }
  if (c->topk_method != TopkMethod::kGreedy) {
    if (absl::Status s = ReadOptionalPositive(j, "n_group", v3 ? 8 : 1, &c->n_group); !s.ok()) {
      return s;
    }
    if (absl::Status s = ReadOptionalPositive(j, "topk_group", v3 ? 4 : 1, &c->topk_group);
        !s.ok()) {
      return s;
    }
    if (c->num_local_experts % c->n_group != 0) {
      return KeyError("n_group", absl::StrCat("(", c->n_group, ") must divide n_routed_experts (",
                                              c->num_local_experts, ")"));
    }
    if (c->topk_group > c->n_group) {
      return KeyError("topk_group",
                      absl::StrCat("(", c->topk_group, ") exceeds n_group (", c->n_group, ")"));
    }
    if (c->topk_method == TopkMethod::kNoauxTc && c->num_local_experts / c->n_group < 2) {
      return KeyError("n_group", "leaves fewer than 2 experts per group (noaux_tc sums the top 2)");
    }
    if (c->num_experts_per_tok > c->topk_group * (c->num_local_experts / c->n_group)) {
      return KeyError("num_experts_per_tok",
                      absl::StrCat("(", c->num_experts_per_tok, ") exceeds the experts of the ",
                                   c->topk_group, " groups kept (topk_group)"));
    }
  }
  // Dense layers: the first first_k_dense_replace, and (V2's moe_layer_freq) layers l with
  // l % moe_layer_freq != 0.
  int64_t first_dense = 0, freq = 1;
  if (absl::Status s = ReadInt(j, "first_k_dense_replace", v3 ? 3 : 0, &first_dense); !s.ok()) {
    return s;
  }
  if (first_dense < 0) return KeyError("first_k_dense_replace", "must not be negative");
  if (absl::Status s = ReadPositiveInt(j, "moe_layer_freq", int64_t{1}, &freq); !s.ok()) return s;
  c->decoder_sparse_step = 1;
  c->mlp_only_layers.clear();
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
    if (l < first_dense || l % freq != 0) c->mlp_only_layers.push_back(l);
  }
  return absl::OkStatus();
}

absl::Status ParseV2(const nlohmann::json& j, ModelConfig* c) { return ParseDeepseek(j, c, false); }
absl::Status ParseV3(const nlohmann::json& j, ModelConfig* c) { return ParseDeepseek(j, c, true); }

}  // namespace

const ModelFamily kDeepseekV2 = {
    "deepseek_v2", "DeepseekV2ForCausalLM", ParseV2, "mlp", "gate_proj", "up_proj", "down_proj"};
const ModelFamily kDeepseekV3 = {
    "deepseek_v3", "DeepseekV3ForCausalLM", ParseV3, "mlp", "gate_proj", "up_proj", "down_proj"};

}  // namespace moebatch::families
