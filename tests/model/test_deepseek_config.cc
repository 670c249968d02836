// config.json of the DeepSeek-V2 / V3 families (engine/model/families/deepseek.cc): the MLA
// shape, routing and dense layers read from real configs, and bad values refused with the key
// named.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "tests/support/checkpoint_test_util.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;

// deepseek-ai/DeepSeek-V3's config.json, its modeling keys.
Json V3() {
  return Json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
    "type": "yarn"}, "attention_bias": false, "torch_dtype": "bfloat16"})");
}

TEST_CASE("DeepSeek config: V2-Lite and V3 shapes, routing, dense layers", "[config][deepseek]") {
  const std::optional<ModelConfig> lite = KnownModelConfig("deepseek-v2-lite");
  REQUIRE(lite.has_value());
  REQUIRE(lite->mla.has_value());
  CHECK(lite->model_type == "deepseek_v2");
  CHECK(lite->mla->q_lora_rank == 0);
  CHECK(lite->mla->kv_lora_rank == 512);
  CHECK(lite->mla->latent_dim() == 576);
  CHECK(lite->mla->rope_interleave);
  CHECK(lite->num_key_value_heads == 1);  // the CPU's attention: MQA over the latent rows
  CHECK(lite->head_dim == 576);
  CHECK(lite->attention_value_dim() == 512);
  CHECK(lite->rope_dim() == 64);
  // transformers 4.57's DeepseekV2Attention: qk_head_dim^-0.5, no mscale.
  CHECK(lite->attention_scale() == Approx(1.0 / std::sqrt(192.0)));
  CHECK(lite->topk_method == TopkMethod::kGreedy);
  CHECK(lite->num_local_experts == 64);
  CHECK(lite->num_experts_per_tok == 6);
  CHECK(lite->intermediate_size == 1408);
  CHECK(lite->dense_intermediate_size == 10944);
  CHECK(lite->shared_expert_intermediate_size == 2 * 1408);
  CHECK(!lite->shared_expert_gated);
  CHECK(!lite->norm_topk_prob);
  CHECK(!lite->IsMoeLayer(0));
  CHECK(lite->IsMoeLayer(1));
  CHECK(lite->IsMoeLayer(26));
  // yarn with mscale == mscale_all_dim: attention factor 1.
  CHECK(ComputeRope(*lite).attention_scaling == 1.0f);
  CHECK(ComputeRope(*lite).inv_freq.size() == 32);

  auto v3 = ParseModelConfig(V3().dump());
  INFO(v3.status().ToString());
  REQUIRE(v3.ok());
  CHECK(v3->mla->q_lora_rank == 1536);
  CHECK(v3->topk_method == TopkMethod::kNoauxTc);
  CHECK(v3->n_group == 8);
  CHECK(v3->topk_group == 4);
  CHECK(v3->routed_scaling_factor == 2.5);
  CHECK(v3->norm_topk_prob);
  CHECK(v3->mlp_only_layers == std::vector<int64_t>{0, 1, 2});
  // DeepseekV3Attention.scaling: 192^-0.5 * (0.1 * 1.0 * ln 40 + 1)^2.
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  CHECK(v3->attention_scale() == Approx(mscale * mscale / std::sqrt(192.0)));

  // V2's moe_layer_freq: layers l % freq != 0 are dense too.
  Json j = V3();
  j["model_type"] = "deepseek_v2";
  j["topk_method"] = "group_limited_greedy";
  j["moe_layer_freq"] = 2;
  j["first_k_dense_replace"] = 1;
  j["num_hidden_layers"] = 6;
  auto v2 = ParseModelConfig(j.dump());
  REQUIRE(v2.ok());
  CHECK(v2->topk_method == TopkMethod::kGroupLimitedGreedy);
  CHECK(v2->mlp_only_layers == std::vector<int64_t>{0, 1, 3, 5});
  CHECK(v2->attention_scale() == Approx(1.0 / std::sqrt(192.0)));
}

TEST_CASE("DeepSeek config: invalid values are rejected by key", "[config][deepseek][errors]") {
  struct Bad {
    const char* key;  // a top-level key, or "rope_scaling.mscale"
    Json value;
    std::string expected;
  };
  const Bad cases[] = {
      {"attention_bias", true, "key \"attention_bias\" is true"},
      {"qk_rope_head_dim", 63, "key \"qk_rope_head_dim\" must be even for RoPE, got 63"},
      {"kv_lora_rank", 0, "key \"kv_lora_rank\""},
      {"n_group", 7, "key \"n_group\" (7) must divide n_routed_experts (256)"},
      {"topk_group", 9, "key \"topk_group\" (9) exceeds n_group (8)"},
      {"num_experts_per_tok", 200,
       "key \"num_experts_per_tok\" (200) exceeds the experts of the 4 groups kept"},
      {"routed_scaling_factor", -1, "key \"routed_scaling_factor\" must be a positive number"},
      {"hidden_act", "gelu", "key \"hidden_act\" is \"gelu\""},
      {"rope_scaling.mscale", -1, "key \"rope_scaling\" mscale must be a non-negative number"},
  };
  for (const Bad& bad : cases) {
    Json j = V3();
    if (std::string(bad.key) == "rope_scaling.mscale") {
      j["rope_scaling"]["mscale"] = bad.value;
    } else {
      j[bad.key] = bad.value;
    }
    INFO(bad.key);
    CHECK_ERROR(ParseModelConfig(j.dump()).status(), absl::StatusCode::kInvalidArgument,
                "config.json: ", bad.expected);
  }
  Json v2 = V3();  // V2 names its router
  v2["model_type"] = "deepseek_v2";
  v2["topk_method"] = "random";
  CHECK_ERROR(ParseModelConfig(v2.dump()).status(), absl::StatusCode::kInvalidArgument,
              "config.json: ", "key \"topk_method\" is \"random\"");
}

}  // namespace
}  // namespace moebatch
