// gpt-oss (transformers models/gpt_oss: GptOssConfig, GptOssForCausalLM; openai/gpt-oss-20b and
// gpt-oss-120b): config.json with the shared names plus head_dim (explicit, not hidden / heads),
// num_local_experts, num_experts_per_tok (the original release's experts_per_token), layer_types
// (one "sliding_attention" / "full_attention" per layer; absent: sliding on even layers, as
// GptOssConfig.__init__), sliding_window, swiglu_limit, rope_scaling (yarn with truncate false:
// _compute_yarn_parameters) and, for the official checkpoints, quantization_config
// {quant_method: "mxfp4", modules_to_not_convert}.
//
// The forward differs from Mixtral's in (modeling_gpt_oss.py):
//   - biases on q/k/v/o (GptOssConfig forces attention_bias = True);
//   - learned attention sinks, self_attn.sinks [heads]: one extra softmax logit per head with no
//     value (eager_attention_forward), in prefill and decode attention;
//   - per-layer sliding window (GptOssAttention.sliding_window from layer_types);
//   - the router, mlp.router: a Linear with bias, top-k on the logits, softmax over the k
//     (GptOssTopKRouter.forward);
//   - the experts (GptOssExperts.forward), fused per layer with biases:
//     gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e], gate = gate_up[..., ::2] and
//     up = gate_up[..., 1::2]; the clamped SwiGLU (up + 1) * gate * sigmoid(1.702 gate) after
//     gate = min(gate, 7), up = clamp(up, -7, 7); out = glu @ down_proj[e] + down_proj_bias[e].
//
// The checkpoint's tensors map onto the shared layout's (engine/model/family.h; "mlp." is the MoE
// prefix):
//   model.layers.{l}.mlp.router.{weight,bias}: mlp.gate.{weight,bias} (router [E, hidden], [E]).
//   model.layers.{l}.mlp.experts.gate_up_proj [E, hidden, 2 inter] (x @ W): expert e's
//       gate_proj (w1, [inter, hidden]) = the even columns of slice e transposed, up_proj (w3) the
//       odd ones; copied once at load into [out, in] rows (Checkpoint::Load), never kept twice.
//   model.layers.{l}.mlp.experts.down_proj          [E, inter, hidden]: expert e's down_proj (w2,
//       [hidden, inter]) = slice e transposed, copied at load.
//   model.layers.{l}.mlp.experts.{gate_up,down}_proj_bias  [E, 2 inter], [E, hidden]: read whole
//       (the backends split gate_up's interleaved halves).
// MXFP4 (quantization_config.quant_method "mxfp4"): the experts are gate_up_proj_blocks
// [E, 2 inter, hidden / 32, 16] and gate_up_proj_scales [E, 2 inter, hidden / 32] (U8, E8M0), and
// down_proj_{blocks,scales} [E, hidden, inter / 32, 16] / [E, hidden, inter / 32]: already [out,
// in] rows, repacked at load into ggml's MXFP4 blocks (4.25 bits per weight, never widened), the
// gate rows (even) and up rows (odd) of gate_up apart.
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

// GptOssExperts hard-codes limit 7.0 (and alpha 1.702) whatever the config says.
constexpr double kSwigluLimit = 7.0;

absl::Status ReadLayerTypes(const Json& j, ModelConfig* c) {
  const int64_t layers = c->num_hidden_layers;
  c->sliding_layers.assign(static_cast<size_t>(layers), false);
  const auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) {
    // GptOssConfig: "sliding_attention" if bool((i + 1) % 2) else "full_attention".
    for (int64_t l = 0; l < layers; ++l) c->sliding_layers[l] = (l + 1) % 2 != 0;
    return absl::OkStatus();
  }
  if (!it->is_array() || static_cast<int64_t>(it->size()) != layers) {
    return KeyError("layer_types",
                    absl::StrCat("must be a list of num_hidden_layers (", layers, ") strings"));
  }
  for (int64_t l = 0; l < layers; ++l) {
    const Json& t = (*it)[l];
    if (t == "sliding_attention") {
      c->sliding_layers[l] = true;
    } else if (t != "full_attention") {
      return KeyError("layer_types", absl::StrCat("[", l, "] is ", t.dump(),
                                                  "; gpt_oss layers are \"sliding_attention\" or "
                                                  "\"full_attention\""));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadQuantization(const Json& j, ModelConfig* c) {
  c->mxfp4_experts = false;
  const auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return KeyError("quantization_config", "must be an object");
  const auto method = it->find("quant_method");
  if (method == it->end() || *method != "mxfp4") {
    return KeyError(
        "quantization_config",
        absl::StrCat("quant_method is ", method == it->end() ? "missing" : method->dump(),
                     "; moebatch reads gpt_oss checkpoints in bf16/f16/f32 or with "
                     "\"mxfp4\" experts"));
  }
  if (const auto skip = it->find("modules_to_not_convert"); skip != it->end() && !skip->is_null()) {
    if (!skip->is_array()) {
      return KeyError("quantization_config", "modules_to_not_convert must be a list of names");
    }
    for (const Json& m : *skip) {
      // Only the experts are MXFP4 in moebatch's reading: a checkpoint that keeps them in bf16
      // while naming itself mxfp4 is not one it knows.
      if (!m.is_string()) {
        return KeyError("quantization_config", "modules_to_not_convert must be a list of names");
      }
      if (absl::StrContains(m.get<std::string>(), "experts")) {
        return KeyError("quantization_config",
                        absl::StrCat("modules_to_not_convert names ", m.dump(),
                                     ": moebatch reads MXFP4 checkpoints whose experts are MXFP4"));
      }
    }
  }
  c->mxfp4_experts = true;
  return absl::OkStatus();
}

absl::Status Parse(const Json& j, ModelConfig* c) {
  using config_keys::ReadPositiveInt;
  // GptOssConfig defaults: 128 experts, top-4 (the original config's experts_per_token).
  if (absl::Status s = ReadPositiveInt(j, "num_local_experts", 128, &c->num_local_experts);
      !s.ok()) {
    return s;
  }
  int64_t top_k = 4;
  if (j.contains("experts_per_token") && !j.contains("num_experts_per_tok")) {
    if (absl::Status s = ReadPositiveInt(j, "experts_per_token", 4, &top_k); !s.ok()) return s;
  } else if (absl::Status s = ReadPositiveInt(j, "num_experts_per_tok", 4, &top_k); !s.ok()) {
    return s;
  }
  c->num_experts_per_tok = top_k;
  // softmax over the top-k logits = the top-k of the softmax over all, renormalised.
  c->norm_topk_prob = true;
  c->router_linear_bias = true;
  c->expert_bias = true;
  c->attention_sinks = true;
  if (const auto it = j.find("attention_bias"); it != j.end() && *it == false) {
    return KeyError("attention_bias", "is false; GptOssAttention always has q/k/v/o biases");
  }
  c->qkv_bias = c->o_bias = true;
  double limit = kSwigluLimit;
  if (absl::Status s = config_keys::ReadPositiveDouble(j, "swiglu_limit", kSwigluLimit, &limit);
      !s.ok()) {
    return s;
  }
  if (limit != kSwigluLimit) {
    return KeyError("swiglu_limit", absl::StrCat("is ", limit,
                                                 "; transformers' GptOssExperts computes with 7.0 "
                                                 "whatever the config says, and so does moebatch"));
  }
  c->swiglu_limit = limit;
  if (absl::Status s = ReadLayerTypes(j, c); !s.ok()) return s;
  if (!c->sliding_window) {
    for (bool sliding : c->sliding_layers) {
      if (sliding)
        return KeyError("sliding_window", "is missing but layer_types has sliding layers");
    }
  }
  return ReadQuantization(j, c);
}

void MapTensors(const ModelConfig& c, std::vector<std::vector<TensorSpec>>* regions) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, experts = c.num_local_experts;
  for (auto& region : *regions) {
    for (TensorSpec& t : region) {
      int64_t l = 0;
      std::string rest;
      if (!SplitLayerName(t.name, &l, &rest)) continue;
      const std::string p = absl::StrCat("model.layers.", l, ".mlp.");
      if (rest == "mlp.gate.weight") {
        t.source = p + "router.weight";
        continue;
      }
      if (rest == "mlp.gate.bias") {
        t.source = p + "router.bias";
        continue;
      }
      constexpr absl::string_view kExperts = "mlp.experts.";
      if (!absl::StartsWith(rest, kExperts)) continue;
      // "mlp.experts.<e>.<gate_proj|up_proj|down_proj>.weight"
      const std::string tail = rest.substr(kExperts.size());
      const size_t dot = tail.find('.');
      int64_t e = 0;
      if (dot == std::string::npos || !absl::SimpleAtoi(tail.substr(0, dot), &e)) continue;
      const std::string proj = tail.substr(dot + 1);
      const bool down = proj == "down_proj.weight";
      if (!down && proj != "gate_proj.weight" && proj != "up_proj.weight") continue;
      t.source = p + (down ? "experts.down_proj" : "experts.gate_up_proj");
      t.source_expert = e;
      t.row_start = proj == "up_proj.weight" ? 1 : 0;  // gate_up: gate [..., ::2], up [..., 1::2]
      t.row_step = down ? 1 : 2;
      const int64_t out = down ? hidden : 2 * inter, in = down ? inter : hidden;
      if (c.mxfp4_experts) {
        t.mxfp4 = true;
        t.source_shape = {experts, out, in};  // logical [out, in]; the file's blocks and scales
      } else {
        t.transposed = true;
        t.source_shape = {experts, in, out};  // x @ W
      }
    }
  }
}

}  // namespace

const ModelFamily kGptOss = {"gpt_oss", "GptOssForCausalLM", Parse,   "mlp",     "gate_proj",
                             "up_proj", "down_proj",         nullptr, MapTensors};

}  // namespace moebatch::families
