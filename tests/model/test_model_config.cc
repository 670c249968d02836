// config.json parsing (engine/model/model_config.h): transformers' MixtralConfig defaults, explicit
// values, and each invalid value refused with the key named.
#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "tests/support/checkpoint_test_util.h"

namespace moebatch {
namespace {

using testing::TinyConfig;
using Json = nlohmann::json;

TEST_CASE("config.json: optional keys take transformers' MixtralConfig defaults", "[config]") {
  Json j = TinyConfig();
  for (const char* key : {"rope_theta", "rms_norm_eps", "tie_word_embeddings",
                          "max_position_embeddings", "num_experts_per_tok", "num_local_experts",
                          "sliding_window", "bos_token_id", "eos_token_id", "torch_dtype"}) {
    j.erase(key);
  }
  auto c = ParseModelConfig(j.dump());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->rope_theta == 1e6);
  CHECK(c->rms_norm_eps == 1e-5);
  CHECK(!c->tie_word_embeddings);
  CHECK(c->max_position_embeddings == 4096 * 32);
  CHECK(c->num_experts_per_tok == 2);
  CHECK(c->num_local_experts == 8);
  CHECK(!c->sliding_window.has_value());
  CHECK(c->bos_token_id == 1);
  CHECK(c->eos_token_id == 2);
  CHECK(c->torch_dtype == DType::kBF16);
  CHECK(c->head_dim == 2);
}

TEST_CASE("config.json: explicit values, lists and nulls", "[config]") {
  Json j = TinyConfig();
  j["sliding_window"] = 4096;
  j["head_dim"] = 16;
  j["eos_token_id"] = {7, 2};
  j["bos_token_id"] = 0;
  j["rope_theta"] = 10000;  // an integer is a number too
  j["torch_dtype"] = "float16";
  j["num_key_value_heads"] = nullptr;  // MixtralConfig: None -> num_attention_heads
  auto c = ParseModelConfig(j.dump());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->sliding_window == 4096);
  CHECK(c->head_dim == 16);
  CHECK(c->q_size() == 64);
  CHECK(c->eos_token_id == 7);
  CHECK(c->bos_token_id == 0);
  CHECK(c->rope_theta == 10000.0);
  CHECK(c->torch_dtype == DType::kF16);
  CHECK(c->num_key_value_heads == 4);

  j["head_dim"] = nullptr;
  j["dtype"] = "float32";
  j.erase("torch_dtype");
  c = ParseModelConfig(j.dump());
  REQUIRE(c.ok());
  CHECK(c->head_dim == 2);
  CHECK(c->torch_dtype == DType::kF32);
}

TEST_CASE("config.json: invalid values are rejected by key", "[config][errors]") {
  const auto check = [](Json j, const std::string& expected) {
    CHECK_ERROR(ParseModelConfig(j.dump()).status(), absl::StatusCode::kInvalidArgument,
                "config.json: ", expected);
  };
  Json j = TinyConfig();
  SECTION("not JSON") {
    CHECK_ERROR(ParseModelConfig("{\"vocab_size\": ").status(), absl::StatusCode::kInvalidArgument,
                "config.json: invalid JSON");
  }
  SECTION("no model_type and no architectures") {
    j.erase("architectures");
    j.erase("model_type");
    check(j, "key \"model_type\" is required but missing (and no \"architectures\" list)");
  }
  SECTION("a model type moebatch does not run") {
    j["model_type"] = "gpt_neox";
    check(j,
          "key \"model_type\" is \"gpt_neox\", which moebatch does not run; it runs dbrx, "
          "deepseek_v2, deepseek_v3, gpt_oss, llama, ");
  }
  SECTION("no model_type and an unknown architecture") {
    j.erase("model_type");
    j["architectures"] = {"GPTNeoXForCausalLM"};
    check(j, "unknown architecture [\"GPTNeoXForCausalLM\"]; moebatch runs the model types ");
  }
  SECTION("mistyped size") {
    j["hidden_size"] = "8";
    check(j, "key \"hidden_size\" must be an integer, got \"8\"");
  }
  SECTION("non-integral size") {
    j["vocab_size"] = 32.5;
    check(j, "key \"vocab_size\" must be an integer");
  }
  SECTION("non-positive size") {
    j["intermediate_size"] = 0;
    check(j, "key \"intermediate_size\" must be positive, got 0");
  }
  SECTION("top-k larger than the number of experts") {
    j["num_experts_per_tok"] = 5;
    check(j, "key \"num_experts_per_tok\" (5) exceeds the number of experts (4)");
  }
  SECTION("hidden size not divisible by heads without head_dim") {
    j["hidden_size"] = 10;
    check(j, "key \"hidden_size\" (10) is not divisible by num_attention_heads (4)");
  }
  SECTION("unknown torch_dtype") {
    j["torch_dtype"] = "int8";
    check(j, "key \"torch_dtype\" must be \"bfloat16\", \"float16\" or \"float32\", got \"int8\"");
  }
  SECTION("empty eos list") {
    j["eos_token_id"] = Json::array();
    check(j, "key \"eos_token_id\" is an empty list");
  }
  SECTION("bad sliding window") {
    j["sliding_window"] = -1;
    check(j, "key \"sliding_window\" must be positive, got -1");
  }
  SECTION("RoPE scaling moebatch does not compute") {
    j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
    check(j,
          "key \"rope_scaling\" asks for RoPE scaling \"longrope\", which moebatch does not "
          "compute (it does default, linear, llama3 and yarn)");
  }
  SECTION("llama3 RoPE without original_max_position_embeddings") {
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
    check(j, "original_max_position_embeddings");
  }
  SECTION("mistyped tie_word_embeddings") {
    j["tie_word_embeddings"] = 1;
    check(j, "key \"tie_word_embeddings\" must be true or false");
  }
}

TEST_CASE("fuzz regression: head_dim times num_attention_heads must fit int64",
          "[config][errors]") {
  // ModelConfig::q_size() multiplied these: signed overflow (undefined behavior) for a config that
  // passed every check.
  Json j = TinyConfig();
  j["num_attention_heads"] = int64_t{1} << 32;
  j["num_key_value_heads"] = int64_t{1} << 32;
  j["head_dim"] = int64_t{1} << 32;
  CHECK_ERROR(ParseModelConfig(j.dump()).status(), absl::StatusCode::kInvalidArgument,
              "config.json: key \"head_dim\" (4294967296) times num_attention_heads (4294967296) "
              "overflows");
  j["head_dim"] = int64_t{1} << 30;  // 2^62: fits
  auto c = ParseModelConfig(j.dump());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->q_size() == int64_t{1} << 62);
}

// DBRX's config.json (DbrxConfig.to_dict, as tests/fixtures/tiny-dbrx): its own top-level names and
// the nested attn_config / ffn_config.
Json DbrxConfigJson() {
  return Json::parse(R"({
    "architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 72, "n_heads": 9,
    "n_layers": 3, "max_seq_len": 4096, "vocab_size": 32000, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "attn_config": {"clip_qkv": 1.2, "kv_n_heads": 3, "rope_theta": 500000.0, "attn_pdrop": 0.0},
    "ffn_config": {"ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 28, "moe_num_experts": 5,
                   "moe_top_k": 3, "moe_normalize_expert_weights": 2.0, "moe_jitter_eps": null}
  })");
}

TEST_CASE("config.json: DBRX's names and nested attn_config / ffn_config", "[config][dbrx]") {
  Json j = DbrxConfigJson();
  auto c = ParseModelConfig(j.dump());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->model_type == "dbrx");
  CHECK(c->architecture == "DbrxForCausalLM");
  CHECK(c->hidden_size == 72);
  CHECK(c->num_attention_heads == 9);
  CHECK(c->num_key_value_heads == 3);
  CHECK(c->head_dim == 8);
  CHECK(c->num_hidden_layers == 3);
  CHECK(c->max_position_embeddings == 4096);
  CHECK(c->intermediate_size == 28);
  CHECK(c->num_local_experts == 5);
  CHECK(c->num_experts_per_tok == 3);
  CHECK(c->norm_topk_prob);
  CHECK(c->topk_norm_p == 2.0);
  REQUIRE(c->clip_qkv.has_value());
  CHECK(*c->clip_qkv == 1.2);
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->norm == NormType::kLayerNorm);
  CHECK(c->rms_norm_eps == 1e-5);
  CHECK(!c->qkv_bias);
  CHECK(!c->o_bias);
  CHECK(!c->sliding_window.has_value());

  // DbrxConfig's defaults: 1 KV head, rope_theta 1e4, no clipping, 4 experts top-1 divided by
  // their sum (p = 1), max_seq_len 2048; moe_normalize_expert_weights null: no renormalisation.
  j["attn_config"] = Json::object();
  j["ffn_config"] = {{"ffn_hidden_size", 28}};
  j.erase("max_seq_len");
  c = ParseModelConfig(j.dump());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->num_key_value_heads == 1);
  CHECK(c->rope_theta == 10000.0);
  CHECK(!c->clip_qkv.has_value());
  CHECK(c->num_local_experts == 4);
  CHECK(c->num_experts_per_tok == 1);
  CHECK(c->norm_topk_prob);
  CHECK(c->topk_norm_p == 1.0);
  CHECK(c->max_position_embeddings == 2048);
  j["ffn_config"]["moe_normalize_expert_weights"] = nullptr;
  c = ParseModelConfig(j.dump());
  REQUIRE(c.ok());
  CHECK(!c->norm_topk_prob);

  const std::optional<ModelConfig> known = KnownModelConfig("dbrx");
  REQUIRE(known.has_value());
  CHECK(known->q_size() == known->hidden_size);
  CHECK(known->norm == NormType::kLayerNorm);
}

TEST_CASE("config.json: DBRX's invalid values are rejected by key", "[config][dbrx][errors]") {
  const auto check = [](Json j, const std::string& expected) {
    CHECK_ERROR(ParseModelConfig(j.dump()).status(), absl::StatusCode::kInvalidArgument,
                "config.json: ", expected);
  };
  Json j = DbrxConfigJson();
  SECTION("no d_model") {
    j.erase("d_model");
    check(j, "key \"d_model\" is required but missing");
  }
  SECTION("d_model not divisible by n_heads") {
    j["d_model"] = 70;
    check(j, "key \"d_model\" (70) is not divisible by n_heads (9)");
  }
  SECTION("attn_config not an object") {
    j["attn_config"] = 3;
    check(j, "key \"attn_config\" must be an object, got 3");
  }
  SECTION("kv_n_heads not dividing n_heads") {
    j["attn_config"]["kv_n_heads"] = 2;
    check(j, "key \"num_key_value_heads\" must divide num_attention_heads (9 heads, 2 KV heads)");
  }
  SECTION("no ffn_hidden_size") {
    j["ffn_config"].erase("ffn_hidden_size");
    check(j, "ffn_config: key \"ffn_hidden_size\" is required but missing");
  }
  SECTION("top-k beyond the experts") {
    j["ffn_config"]["moe_top_k"] = 6;
    check(j, "key \"num_experts_per_tok\" (6) exceeds the number of experts (5)");
  }
  SECTION("a negative p") {
    j["ffn_config"]["moe_normalize_expert_weights"] = -1.0;
    check(j, "ffn_config: key \"moe_normalize_expert_weights\"");
  }
  SECTION("another activation") {
    j["ffn_config"]["ffn_act_fn"] = {{"name", "gelu"}};
    check(j,
          "key \"ffn_config.ffn_act_fn\" is {\"name\":\"gelu\"}; moebatch computes DBRX's "
          "experts with {\"name\": \"silu\"}");
  }
  SECTION("clip_qkv not positive") {
    j["attn_config"]["clip_qkv"] = 0;
    check(j, "attn_config: key \"clip_qkv\"");
  }
  SECTION("tied embeddings") {
    j["tie_word_embeddings"] = true;
    check(j, "key \"tie_word_embeddings\" is true, which DBRX does not support");
  }
}

}  // namespace
}  // namespace moebatch
