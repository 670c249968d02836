// gpt-oss (engine/model/families/gpt_oss.cc): config.json keys and errors, and the fixtures'
// tensors as the shared layout holds them: each expert's gate / up rows taken from the
// interleaved columns of mlp.experts.gate_up_proj (x @ W) and its down projection transposed
// (tiny-gpt-oss, bf16), and the MXFP4 experts repacked into ggml blocks that decode to exactly the
// values transformers' convert_moe_packed_tensors gives (tiny-gpt-oss-mxfp4, whose
// reference_experts.safetensors holds layer 0's experts dequantized by transformers in f32).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/ggml_quants.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "tests/support/checkpoint_test_util.h"
#include "tests/support/safetensors_writer.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;

Json GptOssConfig() {
  return Json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
    "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 4,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "experts_per_token": 4, "sliding_window": 128,
    "rms_norm_eps": 1e-05, "rope_theta": 150000, "max_position_embeddings": 131072,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": false},
    "swiglu_limit": 7.0, "attention_bias": true, "tie_word_embeddings": false,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert":
        ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
         "lm_head"]}})");
}

absl::Status ParseStatus(const Json& j) { return ParseModelConfig(j.dump()).status(); }

TEST_CASE("gpt_oss config: the official keys", "[model_config][gpt_oss]") {
  auto c = ParseModelConfig(GptOssConfig().dump());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->architecture == "GptOssForCausalLM");
  CHECK(c->head_dim == 64);
  CHECK(c->q_size() == 4096);  // not hidden_size
  CHECK(c->num_local_experts == 32);
  CHECK(c->num_experts_per_tok == 4);  // experts_per_token
  CHECK(c->qkv_bias);
  CHECK(c->o_bias);
  CHECK(c->attention_sinks);
  CHECK(c->router_linear_bias);
  CHECK(c->expert_bias);
  CHECK(c->mxfp4_experts);
  REQUIRE(c->swiglu_limit);
  CHECK(*c->swiglu_limit == 7.0);
  CHECK(c->rope_scaling.type == RopeScaling::Type::kYarn);
  CHECK_FALSE(c->rope_scaling.truncate);
  CHECK(c->LayerSlidingWindow(0) == std::optional<int64_t>(128));
  CHECK(c->LayerSlidingWindow(1) == std::nullopt);
  CHECK(c->LayerSlidingWindow(2) == std::optional<int64_t>(128));
  CHECK(c->LayerSlidingWindow(3) == std::nullopt);
  // YaRN as _compute_yarn_parameters: attention factor 0.1 ln(32) + 1.
  CHECK(ComputeRope(*c).attention_scaling == Approx(0.1 * std::log(32.0) + 1.0));
}

TEST_CASE("gpt_oss config: layer_types default and num_experts_per_tok",
          "[model_config][gpt_oss]") {
  Json j = GptOssConfig();
  j.erase("layer_types");
  j.erase("quantization_config");
  j.erase("experts_per_token");
  j["num_experts_per_tok"] = 2;
  auto c = ParseModelConfig(j.dump());
  REQUIRE(c.ok());
  CHECK_FALSE(c->mxfp4_experts);
  CHECK(c->num_experts_per_tok == 2);
  // GptOssConfig: "sliding_attention" if bool((i + 1) % 2) else "full_attention".
  CHECK(c->sliding_layers == std::vector<bool>{true, false, true, false});
}

TEST_CASE("gpt_oss config errors name the key", "[model_config][gpt_oss][errors]") {
  Json j = GptOssConfig();
  j["layer_types"] = {"sliding_attention", "full_attention"};
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "layer_types",
              "num_hidden_layers (4)");
  j = GptOssConfig();
  j["layer_types"][2] = "chunked_attention";
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "layer_types",
              "chunked_attention");
  j = GptOssConfig();
  j["swiglu_limit"] = 6.0;
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "swiglu_limit");
  j = GptOssConfig();
  j["quantization_config"]["quant_method"] = "bitsandbytes";
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "quantization_config",
              "bitsandbytes");
  j = GptOssConfig();
  j["quantization_config"]["modules_to_not_convert"].push_back("model.layers.*.mlp.experts");
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "modules_to_not_convert");
  j = GptOssConfig();
  j["attention_bias"] = false;
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "attention_bias");
  j = GptOssConfig();
  j.erase("sliding_window");
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "sliding_window");
  j = GptOssConfig();
  j["experts_per_token"] = 33;
  CHECK_ERROR(ParseStatus(j), absl::StatusCode::kInvalidArgument, "num_experts_per_tok");
}

std::string Fixture(const std::string& name) {
  const std::string dir = std::string(MOEBATCH_FIXTURES_DIR) + "/" + name;
  REQUIRE(std::filesystem::exists(dir + "/model.safetensors"));
  return dir;
}

std::unique_ptr<Checkpoint> LoadFixture(const std::string& dir) {
  auto ckpt = Checkpoint::Load(dir);
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  return *std::move(ckpt);
}

TEST_CASE("fixtures: tiny-gpt-oss's fused experts load as [out, in] rows",
          "[checkpoint][gpt_oss]") {
  const std::unique_ptr<Checkpoint> ckpt = LoadFixture(Fixture("tiny-gpt-oss"));
  const Checkpoint& k = *ckpt;
  const ModelConfig& c = k.config();
  CHECK(c.model_type == "gpt_oss");
  CHECK(c.sliding_layers == std::vector<bool>{true, false, true, false});
  const int64_t hidden = 96, inter = 64, experts = 5;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    INFO("layer " << l);
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerWeights& lw = k.weights().layers[l];
    REQUIRE(lw.sinks != nullptr);
    CHECK(lw.sinks->shape == std::vector<int64_t>{6});
    CHECK(lw.router == k.store().Find(p + "mlp.router.weight"));
    CHECK(lw.router_linear_bias == k.store().Find(p + "mlp.router.bias"));
    CHECK(lw.experts_gate_up_bias->shape == std::vector<int64_t>{experts, 2 * inter});
    const TensorInfo* gate_up = k.store().Find(p + "mlp.experts.gate_up_proj");
    const TensorInfo* down = k.store().Find(p + "mlp.experts.down_proj");
    REQUIRE(gate_up != nullptr);
    REQUIRE(down != nullptr);
    REQUIRE(gate_up->shape == std::vector<int64_t>{experts, hidden, 2 * inter});
    const auto* gu = reinterpret_cast<const uint16_t*>(gate_up->data);
    const auto* dn = reinterpret_cast<const uint16_t*>(down->data);
    for (int64_t e = 0; e < experts; ++e) {
      const ExpertWeights& ew = lw.experts[e];
      REQUIRE(ew.w1->shape == std::vector<int64_t>{inter, hidden});
      REQUIRE(ew.w2->shape == std::vector<int64_t>{hidden, inter});
      CHECK(k.OwnsData(*ew.w1));
      const auto* w1 = reinterpret_cast<const uint16_t*>(ew.w1->data);
      const auto* w3 = reinterpret_cast<const uint16_t*>(ew.w3->data);
      const auto* w2 = reinterpret_cast<const uint16_t*>(ew.w2->data);
      bool same = true;
      for (int64_t r = 0; r < inter; ++r) {
        for (int64_t i = 0; i < hidden; ++i) {
          const uint16_t* col = gu + (e * hidden + i) * 2 * inter;
          same &= w1[r * hidden + i] == col[2 * r];      // gate = [..., ::2]
          same &= w3[r * hidden + i] == col[2 * r + 1];  // up = [..., 1::2]
          same &= w2[i * inter + r] == dn[(e * inter + r) * hidden + i];
        }
      }
      CHECK(same);
    }
  }
}

TEST_CASE("fixtures: tiny-gpt-oss-mxfp4's experts decode to transformers' dequantized values",
          "[checkpoint][gpt_oss]") {
  const std::string dir = Fixture("tiny-gpt-oss-mxfp4");
  const std::unique_ptr<Checkpoint> ckpt = LoadFixture(dir);
  const Checkpoint& k = *ckpt;
  REQUIRE(k.config().mxfp4_experts);
  auto ref = SafetensorsFile::Open(dir + "/reference_experts.safetensors");
  REQUIRE(ref.ok());
  const TensorInfo& gate_up = (*ref)->tensors().at("gate_up_proj");  // [E, hidden, 2 inter] f32
  const TensorInfo& down = (*ref)->tensors().at("down_proj");        // [E, inter, hidden] f32
  const int64_t hidden = 96, inter = 64, experts = 5;
  REQUIRE(gate_up.shape == std::vector<int64_t>{experts, hidden, 2 * inter});
  const auto* gu = reinterpret_cast<const float*>(gate_up.data);
  const auto* dn = reinterpret_cast<const float*>(down.data);
  const LayerWeights& lw = k.weights().layers[0];
  std::vector<float> row(hidden);
  int64_t mismatches = 0, nonzero = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const ExpertWeights& ew = lw.experts[e];
    for (const TensorInfo* w : {ew.w1, ew.w3, ew.w2}) {
      REQUIRE(w->quant == GgmlType::kMXFP4);
      CHECK(w->nbytes == static_cast<size_t>(w->shape[0] * w->shape[1] / 32 * 17));  // 4.25 bits
    }
    for (int64_t r = 0; r < inter; ++r) {  // w1 row r = gate column 2r, w3 row r = up column 2r+1
      for (int64_t which = 0; which < 2; ++which) {
        const TensorInfo* w = which == 0 ? ew.w1 : ew.w3;
        REQUIRE(
            DequantizeRow(GgmlType::kMXFP4, w->data + r * (hidden / 32) * 17, hidden, row.data())
                .ok());
        for (int64_t i = 0; i < hidden; ++i) {
          const float want = gu[(e * hidden + i) * 2 * inter + 2 * r + which];
          mismatches += row[i] != want;
          nonzero += want != 0.0f;
        }
      }
    }
    for (int64_t r = 0; r < hidden; ++r) {  // w2 row r = down column r
      REQUIRE(
          DequantizeRow(GgmlType::kMXFP4, ew.w2->data + r * (inter / 32) * 17, inter, row.data())
              .ok());
      for (int64_t i = 0; i < inter; ++i) mismatches += row[i] != dn[(e * inter + i) * hidden + r];
    }
  }
  CHECK(mismatches == 0);
  CHECK(nonzero > experts * inter * hidden);  // not a vacuous comparison of zeros
}

// MXFP4 tensors that do not fit the config: the loader names the file's tensor (not the shared
// layout's name it was looking for). A copy of tiny-gpt-oss-mxfp4 whose layer 0 gate_up scales
// are F32 (they must be U8) and whose layer 1 down_proj_blocks lack their last expert.
TEST_CASE("gpt_oss checkpoint error: MXFP4 blocks and scales of the wrong dtype or shape are named",
          "[checkpoint][gpt_oss][errors]") {
  const std::string fixture = Fixture("tiny-gpt-oss-mxfp4");
  auto file = SafetensorsFile::Open(fixture + "/model.safetensors");
  REQUIRE(file.ok());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("moebatch-gpt-oss-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture + "/config.json", dir / "config.json");
  auto write = [&](const std::string& name, const testing::TestTensor& replacement) {
    std::map<std::string, testing::TestTensor> tensors;
    for (const auto& [n, t] : (*file)->tensors()) {
      tensors[n] = {t.dtype_name, t.shape,
                    std::string(reinterpret_cast<const char*>(t.data), t.nbytes)};
    }
    tensors[name] = replacement;
    std::ofstream(dir / "model.safetensors", std::ios::binary | std::ios::trunc)
        << testing::SafetensorsBytes(tensors, {{"format", "pt"}});
    return Checkpoint::Load(dir.string()).status();
  };
  const std::string scales = "model.layers.0.mlp.experts.gate_up_proj_scales";
  const absl::Status wrong_dtype =
      write(scales, {"F32", {5, 128, 3}, std::string(5 * 128 * 3 * 4, '\0')});
  const std::string blocks = "model.layers.1.mlp.experts.down_proj_blocks";
  const absl::Status wrong_shape =
      write(blocks, {"U8", {4, 96, 2, 16}, std::string(4 * 96 * 2 * 16, '\0')});
  std::filesystem::remove_all(dir);
  CHECK_ERROR(wrong_dtype, absl::StatusCode::kInvalidArgument,
              "tensor \"" + scales + "\": wrong dtype: expected U8, found F32");
  CHECK_ERROR(
      wrong_shape, absl::StatusCode::kInvalidArgument,
      "tensor \"" + blocks + "\": wrong shape: expected [5, 96, 2, 16], found [4, 96, 2, 16]");
}

}  // namespace
}  // namespace moebatch
