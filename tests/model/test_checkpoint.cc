// Checkpoint loading (engine/model/model_config.h, engine/model/safetensors.h,
// engine/model/checkpoint.h): tiny synthetic Mixtral checkpoints written by
// tests/support/safetensors_writer.h into a temporary directory, good and corrupted in one way
// each, plus the committed transformers-made fixtures. config.json parsing on its own:
// test_model_config.cc.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/dtype.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_store.h"
#include "tests/support/checkpoint_test_util.h"
#include "tests/support/safetensors_writer.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;
using testing::RawSafetensors;
using testing::SafetensorsBytes;
using testing::TestTensor;
using testing::TinyConfig;
using testing::WriteFile;
using Json = nlohmann::json;
using Tensors = std::map<std::string, TestTensor>;

// A fresh directory under $TMPDIR, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "moebatch_test_checkpoint_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A tensor of `dtype` (BF16, F16 or F32) with distinct, deterministic values per name and element.
TestTensor MakeTensor(const std::string& name, std::vector<int64_t> shape,
                      DType dtype = DType::kBF16) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  uint32_t seed = 2166136261u;  // FNV-1a of the name
  for (char c : name) seed = (seed ^ static_cast<uint8_t>(c)) * 16777619u;
  std::vector<float> values(numel);
  for (int64_t i = 0; i < numel; ++i) values[i] = static_cast<float>((seed + 7 * i) % 251) / 64 - 2;
  std::string bytes(numel * DTypeSize(dtype), '\0');
  ConvertFromF32(dtype, values.data(), bytes.data(), numel);
  return TestTensor{std::string(DTypeName(dtype)), std::move(shape), std::move(bytes)};
}

// Every tensor MixtralForCausalLM has for `config` (checkpoint.h lists names and shapes).
Tensors TinyTensors(const Json& config = TinyConfig()) {
  const int64_t vocab = config["vocab_size"], hidden = config["hidden_size"],
                inter = config["intermediate_size"], heads = config["num_attention_heads"],
                kv_heads = config["num_key_value_heads"], experts = config["num_local_experts"];
  const int64_t head_dim = hidden / heads;
  Tensors t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    t[name] = MakeTensor(name, std::move(shape));
  };
  add("model.embed_tokens.weight", {vocab, hidden});
  add("model.norm.weight", {hidden});
  if (!config["tie_word_embeddings"].get<bool>()) add("lm_head.weight", {vocab, hidden});
  for (int l = 0; l < config["num_hidden_layers"].get<int>(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden});
    add(p + "post_attention_layernorm.weight", {hidden});
    add(p + "self_attn.q_proj.weight", {heads * head_dim, hidden});
    add(p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden});
    add(p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden});
    add(p + "self_attn.o_proj.weight", {hidden, heads * head_dim});
    add(p + "block_sparse_moe.gate.weight", {experts, hidden});
    for (int e = 0; e < experts; ++e) {
      const std::string ep = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      add(ep + "w1.weight", {inter, hidden});
      add(ep + "w2.weight", {hidden, inter});
      add(ep + "w3.weight", {inter, hidden});
    }
  }
  return t;
}

std::string ShardName(int i, int n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i, n);
  return name;
}

// Writes config.json and the tensors: model.safetensors, or `shards` files in contiguous name
// ranges plus model.safetensors.index.json (the save_pretrained layout). Returns tensor -> file.
std::map<std::string, std::string> WriteCheckpoint(const std::string& dir, const Json& config,
                                                   const Tensors& tensors, int shards = 1) {
  WriteFile(dir + "/config.json", config.dump(2));
  std::map<std::string, std::string> weight_map;
  if (shards == 1) {
    WriteFile(dir + "/model.safetensors", SafetensorsBytes(tensors, {{"format", "pt"}}));
    for (const auto& [name, t] : tensors) weight_map[name] = "model.safetensors";
    return weight_map;
  }
  std::vector<Tensors> parts(shards);
  size_t i = 0, total_size = 0;
  for (const auto& [name, t] : tensors) {
    const int shard = static_cast<int>(i++ * shards / tensors.size());
    parts[shard][name] = t;
    weight_map[name] = ShardName(shard + 1, shards);
    total_size += t.bytes.size();
  }
  for (int s = 0; s < shards; ++s) {
    WriteFile(dir + "/" + ShardName(s + 1, shards), SafetensorsBytes(parts[s], {{"format", "pt"}}));
  }
  const Json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  WriteFile(dir + "/model.safetensors.index.json", index.dump(2));
  return weight_map;
}

std::string Bytes(const TensorInfo& t) {
  return std::string(reinterpret_cast<const char*>(t.data), t.nbytes);
}

absl::Status LoadStatus(const std::string& dir) { return Checkpoint::Load(dir).status(); }

// Both stores hold the same tensor names, each with the same dtype, shape and bytes.
void CheckSameTensors(const TensorStore& a, const TensorStore& b) {
  CHECK(a.tensors().size() == b.tensors().size());
  int differing = 0;
  for (const auto& [name, ta] : a.tensors()) {
    INFO("tensor " << name);
    const TensorInfo* tb = b.Find(name);
    if (tb == nullptr) {
      FAIL_CHECK("only in " << ta->file);
      ++differing;
      continue;
    }
    CHECK(ta->dtype_name == tb->dtype_name);
    CHECK(ta->shape == tb->shape);
    if (ta->nbytes != tb->nbytes || std::memcmp(ta->data, tb->data, ta->nbytes) != 0) {
      FAIL_CHECK("bytes differ between " << ta->file << " and " << tb->file);
      ++differing;
    }
  }
  CHECK(differing == 0);
}

absl::Status OpenStatus(const TempDir& dir, const std::string& file_bytes) {
  WriteFile(dir / "x.safetensors", file_bytes);
  return SafetensorsFile::Open(dir / "x.safetensors").status();
}

// ---------------------------------------------------------------------------------------------
// Good checkpoints

TEST_CASE("a synthetic Mixtral checkpoint loads with its config, shapes and bytes",
          "[checkpoint]") {
  TempDir dir;
  const Tensors tensors = TinyTensors();
  WriteCheckpoint(dir.path(), TinyConfig(), tensors);

  auto ckpt = Checkpoint::Load(dir.path());
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  const ModelConfig& c = (*ckpt)->config();
  CHECK(c.architecture == "MixtralForCausalLM");
  CHECK(c.vocab_size == 32);
  CHECK(c.hidden_size == 8);
  CHECK(c.intermediate_size == 12);
  CHECK(c.num_hidden_layers == 2);
  CHECK(c.num_attention_heads == 4);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.head_dim == 2);
  CHECK(c.q_size() == 8);
  CHECK(c.kv_size() == 4);
  CHECK(c.num_local_experts == 4);
  CHECK(c.num_experts_per_tok == 2);
  CHECK(c.max_position_embeddings == 256);
  CHECK(!c.sliding_window.has_value());
  CHECK(c.torch_dtype == DType::kBF16);

  const ModelWeights& w = (*ckpt)->weights();
  REQUIRE(w.layers.size() == 2);
  CHECK(w.embed_tokens->shape == std::vector<int64_t>{32, 8});
  CHECK(w.lm_head != w.embed_tokens);
  CHECK(w.lm_head->name == "lm_head.weight");
  CHECK(w.norm->shape == std::vector<int64_t>{8});
  for (const LayerWeights& layer : w.layers) {
    CHECK(layer.q_proj->shape == std::vector<int64_t>{8, 8});
    CHECK(layer.k_proj->shape == std::vector<int64_t>{4, 8});
    CHECK(layer.v_proj->shape == std::vector<int64_t>{4, 8});
    CHECK(layer.o_proj->shape == std::vector<int64_t>{8, 8});
    CHECK(layer.router->shape == std::vector<int64_t>{4, 8});
    CHECK(layer.input_layernorm != nullptr);
    CHECK(layer.post_attention_layernorm != nullptr);
    REQUIRE(layer.experts.size() == 4);
    for (const ExpertWeights& e : layer.experts) {
      CHECK(e.w1->shape == std::vector<int64_t>{12, 8});
      CHECK(e.w2->shape == std::vector<int64_t>{8, 12});
      CHECK(e.w3->shape == std::vector<int64_t>{12, 8});
    }
  }
  CHECK(w.layers[1].experts[3].w2->name == "model.layers.1.block_sparse_moe.experts.3.w2.weight");

  // Every tensor's bytes come straight from the mapping.
  const TensorStore& store = (*ckpt)->store();
  CHECK(store.num_files() == 1);
  CHECK(store.tensors().size() == tensors.size());
  size_t total = 0;
  for (const auto& [name, t] : tensors) {
    const TensorInfo* info = store.Find(name);
    REQUIRE(info != nullptr);
    CHECK(info->dtype == DType::kBF16);
    CHECK(info->numel() * 2 == static_cast<int64_t>(info->nbytes));
    CHECK(Bytes(*info) == t.bytes);
    total += t.bytes.size();
  }
  CHECK(store.total_bytes() == total);
  CHECK(store.Find("no.such.tensor") == nullptr);
}

TEST_CASE("single-file and 2-shard checkpoints load the same tensors", "[checkpoint]") {
  TempDir single, sharded;
  const Tensors tensors = TinyTensors();
  WriteCheckpoint(single.path(), TinyConfig(), tensors);
  WriteCheckpoint(sharded.path(), TinyConfig(), tensors, /*shards=*/2);

  auto a = Checkpoint::Load(single.path());
  auto b = Checkpoint::Load(sharded.path());
  INFO(a.status().ToString() << " / " << b.status().ToString());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((*a)->store().num_files() == 1);
  CHECK((*b)->store().num_files() == 2);
  CHECK((*a)->store().tensors().size() == tensors.size());
  CheckSameTensors((*a)->store(), (*b)->store());
  // The shards really split the tensors.
  CHECK((*b)->weights().embed_tokens->file != (*b)->weights().norm->file);
}

TEST_CASE("tied word embeddings: lm_head is embed_tokens, lm_head.weight not needed",
          "[checkpoint]") {
  TempDir dir;
  Json config = TinyConfig();
  config["tie_word_embeddings"] = true;
  WriteCheckpoint(dir.path(), config, TinyTensors(config));
  auto ckpt = Checkpoint::Load(dir.path());
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  CHECK((*ckpt)->weights().lm_head == (*ckpt)->weights().embed_tokens);
}

TEST_CASE("float32 and float16 checkpoints load; extra tensors are ignored", "[checkpoint]") {
  for (const auto& [torch_dtype, dtype] :
       {std::pair{"float32", DType::kF32}, std::pair{"float16", DType::kF16}}) {
    TempDir dir;
    Json config = TinyConfig();
    config.erase("torch_dtype");
    config["dtype"] = torch_dtype;  // the transformers >= 4.56 spelling
    Tensors tensors = TinyTensors();
    for (auto& [name, t] : tensors) t = MakeTensor(name, t.shape, dtype);
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] =
        MakeTensor("inv_freq", {1}, DType::kF32);
    WriteCheckpoint(dir.path(), config, tensors);
    auto ckpt = Checkpoint::Load(dir.path());
    INFO(torch_dtype << ": " << ckpt.status().ToString());
    REQUIRE(ckpt.ok());
    CHECK((*ckpt)->config().torch_dtype == dtype);
    CHECK((*ckpt)->weights().norm->dtype == dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// Corrupt checkpoints: each fails with its own code and a message naming the culprit.

TEST_CASE("checkpoint error: missing tensor", "[checkpoint][errors]") {
  TempDir dir;
  Tensors tensors = TinyTensors();
  tensors.erase("model.layers.1.block_sparse_moe.experts.3.w2.weight");
  WriteCheckpoint(dir.path(), TinyConfig(), tensors);
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kNotFound,
              "model.layers.1.block_sparse_moe.experts.3.w2.weight", "missing", dir.path());
}

TEST_CASE("checkpoint error: missing lm_head when embeddings are not tied",
          "[checkpoint][errors]") {
  TempDir dir;
  Tensors tensors = TinyTensors();
  tensors.erase("lm_head.weight");
  WriteCheckpoint(dir.path(), TinyConfig(), tensors);
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kNotFound, "\"lm_head.weight\"", "missing");
}

TEST_CASE("checkpoint error: wrong shape", "[checkpoint][errors]") {
  TempDir dir;
  Tensors tensors = TinyTensors();
  tensors["model.layers.0.self_attn.k_proj.weight"] =
      MakeTensor("model.layers.0.self_attn.k_proj.weight", {3, 8});
  WriteCheckpoint(dir.path(), TinyConfig(), tensors);
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
              "model.layers.0.self_attn.k_proj.weight",
              "wrong shape: expected [4, 8], found [3, 8]", dir / "model.safetensors");
}

TEST_CASE("checkpoint error: wrong dtype", "[checkpoint][errors]") {
  TempDir dir;
  Tensors tensors = TinyTensors();
  tensors["model.layers.1.block_sparse_moe.gate.weight"] =
      MakeTensor("model.layers.1.block_sparse_moe.gate.weight", {4, 8}, DType::kF32);
  WriteCheckpoint(dir.path(), TinyConfig(), tensors);
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
              "model.layers.1.block_sparse_moe.gate.weight",
              "expected BF16 (config torch_dtype), found F32", dir / "model.safetensors");
}

TEST_CASE("checkpoint error: truncated safetensors file", "[checkpoint][errors]") {
  TempDir dir;
  const Tensors tensors = TinyTensors();
  WriteCheckpoint(dir.path(), TinyConfig(), tensors);
  // The writer packs tensors in name order: the last one, model.norm.weight, loses its last byte.
  REQUIRE(tensors.rbegin()->first == "model.norm.weight");
  const std::string file = dir / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 1);
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kDataLoss, file,
              "tensor \"model.norm.weight\"", "truncated");
}

TEST_CASE("checkpoint error: safetensors header is not valid JSON", "[checkpoint][errors]") {
  TempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors());
  WriteFile(dir / "model.safetensors",
            RawSafetensors(R"({"model.norm.weight": {"dtype": "BF16", "shape": [8], )", "xx"));
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument, dir / "model.safetensors",
              "header is not valid JSON");
}

TEST_CASE("checkpoint error: safetensors header length beyond the file", "[checkpoint][errors]") {
  TempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors());
  WriteFile(dir / "model.safetensors", RawSafetensors("{}", "", uint64_t{1} << 40));
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kDataLoss, dir / "model.safetensors",
              "header length 1099511627776 runs past the end of the file (10 bytes)");
}

TEST_CASE("checkpoint error: index names a missing shard", "[checkpoint][errors]") {
  TempDir dir;
  const auto weight_map = WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors(), /*shards=*/2);
  const std::string missing = ShardName(2, 2);
  fs::remove(dir / missing);
  std::string first_in_missing;  // the error names the first tensor (in name order) mapped to it
  for (const auto& [tensor, shard] : weight_map) {
    if (shard == missing && first_in_missing.empty()) first_in_missing = tensor;
  }
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kNotFound, missing,
              "tensor \"" + first_in_missing + "\"", "model.safetensors.index.json");
}

TEST_CASE("checkpoint error: index is not valid JSON", "[checkpoint][errors]") {
  TempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors(), /*shards=*/2);
  WriteFile(dir / "model.safetensors.index.json", R"({"metadata": {}, "weight_map": {"a": )");
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
              dir / "model.safetensors.index.json", "invalid JSON");
}

TEST_CASE("checkpoint error: a shard name that is a path", "[checkpoint][errors]") {
  for (const std::string bad :
       {"../model-00001-of-00002.safetensors", "/dev/zero", "sub/x", ".."}) {
    TempDir dir;
    auto weight_map = WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors(), /*shards=*/2);
    const std::string tensor = weight_map.begin()->first;
    weight_map[tensor] = bad;
    const Json index = {{"metadata", Json::object()}, {"weight_map", weight_map}};
    WriteFile(dir / "model.safetensors.index.json", index.dump());
    INFO(bad);
    CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
                dir / "model.safetensors.index.json", "tensor \"" + tensor + "\"",
                "\"" + bad + "\"", "not a path");
  }
}

TEST_CASE("checkpoint error: unknown architecture", "[checkpoint][errors]") {
  TempDir dir;
  Json config = TinyConfig();
  config.erase("model_type");
  config["architectures"] = {"GPTNeoXForCausalLM"};
  WriteCheckpoint(dir.path(), config, TinyTensors());
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
              "unknown architecture [\"GPTNeoXForCausalLM\"]", dir / "config.json");
}

TEST_CASE("checkpoint error: a family's tensor missing is named", "[checkpoint][errors]") {
  // The config says qwen2 (q/k/v biases) but the files hold Mixtral's tensors.
  TempDir dir;
  Json config = TinyConfig();
  config["model_type"] = "qwen2";
  config["architectures"] = {"Qwen2ForCausalLM"};
  WriteCheckpoint(dir.path(), config, TinyTensors());
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kNotFound,
              "\"model.layers.0.self_attn.q_proj.bias\" is missing");
}

TEST_CASE("checkpoint error: missing config.json", "[checkpoint][errors]") {
  TempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors());
  fs::remove(dir / "config.json");
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kNotFound, dir / "config.json");
}

TEST_CASE("checkpoint error: required key missing from config.json", "[checkpoint][errors]") {
  TempDir dir;
  Json config = TinyConfig();
  config.erase("num_hidden_layers");
  WriteCheckpoint(dir.path(), config, TinyTensors());
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument, dir / "config.json",
              "key \"num_hidden_layers\" is required but missing");
}

TEST_CASE("checkpoint error: attention heads not divisible by KV heads", "[checkpoint][errors]") {
  TempDir dir;
  Json config = TinyConfig();
  config["num_key_value_heads"] = 3;
  WriteCheckpoint(dir.path(), config, TinyTensors());
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument, dir / "config.json",
              "\"num_key_value_heads\" must divide num_attention_heads (4 heads, 3 KV heads)");
}

TEST_CASE("checkpoint error: no weights file", "[checkpoint][errors]") {
  TempDir dir;
  WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors());
  fs::remove(dir / "model.safetensors");
  CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kNotFound,
              "no model.safetensors or model.safetensors.index.json in " + dir.path());
}

TEST_CASE("checkpoint error: inconsistent shards", "[checkpoint][errors]") {
  TempDir dir;
  const Tensors tensors = TinyTensors();
  const auto weight_map = WriteCheckpoint(dir.path(), TinyConfig(), tensors, /*shards=*/2);
  const std::string shard1 = ShardName(1, 2), shard2 = ShardName(2, 2);

  SECTION("a tensor in two shards") {
    Tensors second;
    for (const auto& [name, shard] : weight_map) {
      if (shard == shard2) second[name] = tensors.at(name);
    }
    second["model.embed_tokens.weight"] = tensors.at("model.embed_tokens.weight");
    WriteFile(dir / shard2, SafetensorsBytes(second));
    CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
                "tensor \"model.embed_tokens.weight\" is in both", dir / shard1, dir / shard2);
  }
  SECTION("the index maps a tensor to a shard that does not hold it") {
    Json index = Json::parse(R"({"weight_map": {}})");
    for (const auto& [name, shard] : weight_map) index["weight_map"][name] = shard;
    REQUIRE(weight_map.at("model.norm.weight") == shard2);
    index["weight_map"]["model.norm.weight"] = shard1;
    WriteFile(dir / "model.safetensors.index.json", index.dump());
    CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
                "weight_map puts tensor \"model.norm.weight\" in", "which does not hold it");
  }
  SECTION("the index has no weight_map") {
    WriteFile(dir / "model.safetensors.index.json", R"({"metadata": {"total_size": 1}})");
    CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
                "model.safetensors.index.json", "no \"weight_map\"");
  }
}

// ---------------------------------------------------------------------------------------------
// safetensors header validation, one failure kind at a time.

TEST_CASE("safetensors: a valid file maps every dtype's bytes in place", "[safetensors]") {
  TempDir dir;
  Tensors tensors;
  tensors["ids"] = TestTensor{"I64", {3}, std::string(24, '\x07')};
  tensors["mask"] = TestTensor{"BOOL", {2, 2}, std::string("\x01\x00\x01\x01", 4)};
  tensors["fp8"] = TestTensor{"F8_E4M3", {5}, "abcde"};
  tensors["scalar"] = TestTensor{"F32", {}, std::string("\0\0\x80\x3f", 4)};
  tensors["empty"] = TestTensor{"BF16", {0, 4}, ""};
  WriteFile(dir / "t.safetensors", SafetensorsBytes(tensors, {{"format", "pt"}}));
  auto file = SafetensorsFile::Open(dir / "t.safetensors");
  INFO(file.status().ToString());
  REQUIRE(file.ok());
  CHECK((*file)->file_size() == fs::file_size(dir / "t.safetensors"));
  REQUIRE((*file)->tensors().size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    const TensorInfo& info = (*file)->tensors().at(name);
    CHECK(info.dtype_name == t.dtype);
    CHECK(info.shape == t.shape);
    CHECK(Bytes(info) == t.bytes);
    CHECK(info.file == dir / "t.safetensors");
  }
  CHECK(!(*file)->tensors().at("ids").dtype.has_value());
  CHECK((*file)->tensors().at("scalar").dtype == DType::kF32);
  CHECK((*file)->tensors().at("scalar").numel() == 1);
  CHECK((*file)->tensors().at("empty").numel() == 0);
}

TEST_CASE("safetensors: each malformed header gives its own error", "[safetensors][errors]") {
  TempDir dir;
  const std::string path = dir / "x.safetensors";
  auto header = [](const std::string& entry) { return R"({"t": )" + entry + "}"; };

  SECTION("missing file") {
    CHECK_ERROR(SafetensorsFile::Open(dir / "nope.safetensors").status(),
                absl::StatusCode::kNotFound, dir / "nope.safetensors");
  }
  SECTION("shorter than the length field") {
    CHECK_ERROR(OpenStatus(dir, "abc"), absl::StatusCode::kDataLoss, path,
                "shorter than the 8-byte");
  }
  SECTION("header is not an object") {
    CHECK_ERROR(OpenStatus(dir, RawSafetensors("[1, 2]")), absl::StatusCode::kInvalidArgument, path,
                "header is not a JSON object");
  }
  SECTION("entry without data_offsets") {
    CHECK_ERROR(
        OpenStatus(dir, RawSafetensors(header(R"({"dtype": "F32", "shape": [1]})"), "xxxx")),
        absl::StatusCode::kInvalidArgument, path, "tensor \"t\"",
        "needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  SECTION("unknown dtype") {
    CHECK_ERROR(
        OpenStatus(dir,
                   RawSafetensors(
                       header(R"({"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]})"), "x")),
        absl::StatusCode::kInvalidArgument, path, "tensor \"t\"", "unknown dtype \"Q4_K\"");
  }
  SECTION("negative dimension") {
    CHECK_ERROR(
        OpenStatus(
            dir, RawSafetensors(header(R"({"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]})"),
                                "x")),
        absl::StatusCode::kInvalidArgument, path, "tensor \"t\"", "shape [-1]");
  }
  SECTION("offsets out of order") {
    CHECK_ERROR(
        OpenStatus(
            dir, RawSafetensors(header(R"({"dtype": "U8", "shape": [1], "data_offsets": [2, 1]})"),
                                "xx")),
        absl::StatusCode::kInvalidArgument, path, "tensor \"t\"", "data_offsets [2,1]");
  }
  SECTION("byte size does not match the shape") {
    CHECK_ERROR(
        OpenStatus(dir, RawSafetensors(
                            header(R"({"dtype": "I16", "shape": [2, 3], "data_offsets": [0, 10]})"),
                            std::string(10, 'x'))),
        absl::StatusCode::kInvalidArgument, path, "tensor \"t\"",
        "span 10 bytes, but shape [2,3] of I16 needs 12");
  }
  SECTION("element count overflows") {
    CHECK_ERROR(
        OpenStatus(
            dir,
            RawSafetensors(
                header(
                    R"({"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})"),
                std::string(8, 'x'))),
        absl::StatusCode::kInvalidArgument, path, "tensor \"t\"", "more than 2^64");
  }
  SECTION("data past the end of the file") {
    CHECK_ERROR(
        OpenStatus(
            dir, RawSafetensors(header(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})"),
                                "1234")),
        absl::StatusCode::kDataLoss, path, "tensor \"t\"", "holds only 4 data bytes");
  }
}

// ---------------------------------------------------------------------------------------------
// The parsers on bytes (what the fuzz targets in tests/fuzz call), and what fuzzing found.

TEST_CASE("safetensors: ParseSafetensors and ParseSafetensorsIndex read bytes as Open reads files",
          "[safetensors]") {
  Tensors tensors;
  tensors["a"] = TestTensor{"F32", {2}, std::string("\0\0\x80\x3f\0\0\0\x40", 8)};
  tensors["b"] = TestTensor{"U8", {3}, "xyz"};
  const std::string image = SafetensorsBytes(tensors, {{"format", "pt"}});
  const auto* bytes = reinterpret_cast<const std::byte*>(image.data());
  auto parsed = ParseSafetensors(bytes, image.size(), "mem.safetensors");
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 2);
  CHECK(Bytes(parsed->at("a")) == tensors["a"].bytes);
  CHECK(Bytes(parsed->at("b")) == "xyz");
  CHECK(parsed->at("b").data >= bytes);
  CHECK(parsed->at("b").data + 3 == bytes + image.size());
  CHECK(parsed->at("a").file == "mem.safetensors");
  CHECK_ERROR(ParseSafetensors(bytes, 3, "mem.safetensors").status(), absl::StatusCode::kDataLoss,
              "mem.safetensors: 3 bytes, shorter than the 8-byte");

  auto index = ParseSafetensorsIndex(
      R"({"metadata": {}, "weight_map": {"c": "s2", "a": "s1", "b": "s2"}})", "idx.json");
  INFO(index.status().ToString());
  REQUIRE(index.ok());
  CHECK(index->weight_map ==
        std::map<std::string, std::string>{{"a", "s1"}, {"b", "s2"}, {"c", "s2"}});
  CHECK(index->shards ==
        std::vector<std::pair<std::string, std::string>>{{"s1", "a"}, {"s2", "b"}});
  CHECK_ERROR(ParseSafetensorsIndex(R"({"weight_map": {}})", "idx.json").status(),
              absl::StatusCode::kInvalidArgument, "idx.json: weight_map is empty");
}

// `depth` arrays inside one another. Dumping, copying or comparing a million-deep value recurses
// a million times: a stack overflow. Fuzzing (tests/fuzz) found the parsers reached such code for
// a deep value (an error message dumping it), so they now refuse JSON deeper than 128 levels.
std::string DeepArray(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST_CASE("fuzz regression: JSON nested deeper than 128 levels is refused, not dumped",
          "[config][safetensors][errors]") {
  const std::string deep = DeepArray(1000000);
  const std::string config_head = R"({"architectures": ["MixtralForCausalLM"], "vocab_size": )";
  SECTION("config.json") {
    CHECK_ERROR(ParseModelConfig(config_head + deep + "}").status(),
                absl::StatusCode::kInvalidArgument,
                "config.json: invalid JSON: nested deeper than 128 levels");
    // The top-level object and 127 arrays: at the limit, so refused for its type instead.
    CHECK_ERROR(ParseModelConfig(config_head + DeepArray(127) + "}").status(),
                absl::StatusCode::kInvalidArgument, "key \"vocab_size\" must be an integer");
    CHECK_ERROR(ParseModelConfig(config_head + DeepArray(128) + "}").status(),
                absl::StatusCode::kInvalidArgument, "nested deeper than 128 levels");
    // Brackets inside strings are text.
    CHECK_ERROR(ParseModelConfig(config_head + "\"" + std::string(300, '[') + "\\\"\"}").status(),
                absl::StatusCode::kInvalidArgument, "key \"vocab_size\" must be an integer");
  }
  SECTION("safetensors header") {
    TempDir dir;
    CHECK_ERROR(OpenStatus(dir, RawSafetensors(R"({"t": {"dtype": "F32", "shape": )" + deep +
                                                   R"(, "data_offsets": [0, 4]}})",
                                               "1234")),
                absl::StatusCode::kInvalidArgument, dir / "x.safetensors",
                "safetensors header is not valid JSON: nested deeper than 128 levels");
  }
  SECTION("model.safetensors.index.json") {
    TempDir dir;
    WriteCheckpoint(dir.path(), TinyConfig(), TinyTensors(), /*shards=*/2);
    WriteFile(dir / "model.safetensors.index.json", R"({"weight_map": {"a": )" + deep + "}}");
    CHECK_ERROR(LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
                dir / "model.safetensors.index.json",
                "invalid JSON: nested deeper than 128 levels");
  }
}

// ---------------------------------------------------------------------------------------------
// The committed fixtures made by tests/fixtures/make_tiny_mixtral.py with transformers.

// The fixtures are committed: a missing one is a failure, not a skip.
void RequireFixture(const std::string& dir) {
  if (!fs::exists(dir + "/config.json")) {
    FAIL("fixture " << dir
                    << " is missing: it is committed with the repository; regenerate it with "
                       "tests/fixtures/make_tiny_mixtral.py (see tests/fixtures/README.md)");
  }
}

// The architecture every fixture shares (tests/fixtures/README.md).
void CheckFixtureConfig(const ModelConfig& c) {
  CHECK(c.hidden_size == 64);
  CHECK(c.intermediate_size == 128);
  CHECK(c.num_hidden_layers == 4);
  CHECK(c.num_local_experts == 8);
  CHECK(c.num_experts_per_tok == 2);
  CHECK(c.num_attention_heads == 4);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.head_dim == 16);
  CHECK(c.vocab_size == 32000);
  CHECK(c.torch_dtype == DType::kBF16);
}

TEST_CASE("fixtures: tiny-mixtral loads, and its shards hold byte-identical tensors",
          "[checkpoint][fixtures]") {
  const std::string single = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral";
  const std::string sharded = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral-sharded";
  RequireFixture(single);
  RequireFixture(sharded);
  auto a = Checkpoint::Load(single);
  auto b = Checkpoint::Load(sharded);
  INFO(a.status().ToString() << " / " << b.status().ToString());
  REQUIRE(a.ok());
  REQUIRE(b.ok());

  for (const auto* ckpt : {a->get(), b->get()}) {
    const ModelConfig& c = ckpt->config();
    INFO(ckpt->dir());
    CheckFixtureConfig(c);
    CHECK(!c.tie_word_embeddings);
    CHECK(!c.sliding_window.has_value());
    CHECK(ckpt->weights().lm_head != ckpt->weights().embed_tokens);
  }
  CHECK((*a)->store().num_files() == 1);
  CHECK((*b)->store().num_files() == 2);
  CheckSameTensors((*a)->store(), (*b)->store());
}

TEST_CASE("fixtures: tiny-mixtral-swa loads with tied embeddings and a sliding window",
          "[checkpoint][fixtures]") {
  const std::string dir = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral-swa";
  RequireFixture(dir);
  auto ckpt = Checkpoint::Load(dir);
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  CheckFixtureConfig((*ckpt)->config());
  CHECK((*ckpt)->config().sliding_window == 32);
  CHECK((*ckpt)->config().tie_word_embeddings);
  CHECK((*ckpt)->store().Find("lm_head.weight") == nullptr);
  CHECK((*ckpt)->weights().lm_head == (*ckpt)->weights().embed_tokens);
}

TEST_CASE("fixtures: tiny-mixtral-hd128 loads with an explicit head_dim wider than hidden / heads",
          "[checkpoint][fixtures]") {
  const std::string dir = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral-hd128";
  RequireFixture(dir);
  auto ckpt = Checkpoint::Load(dir);
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  const ModelConfig& c = (*ckpt)->config();
  CHECK(c.hidden_size == 128);
  CHECK(c.num_hidden_layers == 2);
  CHECK(c.num_attention_heads == 8);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.head_dim == 128);  // given, not hidden_size / num_attention_heads (16)
  CHECK(c.q_size() == 1024);
  CHECK(c.kv_size() == 256);
  CHECK(c.tie_word_embeddings);
  const TensorInfo* q = (*ckpt)->store().Find("model.layers.1.self_attn.q_proj.weight");
  const TensorInfo* o = (*ckpt)->store().Find("model.layers.1.self_attn.o_proj.weight");
  REQUIRE(q != nullptr);
  REQUIRE(o != nullptr);
  CHECK(q->shape == std::vector<int64_t>{1024, 128});
  CHECK(o->shape == std::vector<int64_t>{128, 1024});
}

// DBRX's fused tensors (tests/fixtures/tiny-dbrx, DbrxForCausalLM) as the shared layout's: q, k and
// v are row views of Wqkv, each expert's w1 / w3 row views of ffn.experts.mlp.w1 / v1 (no copy),
// its w2 the transpose of its rows of ffn.experts.mlp.w2 (a copy); a WeightStore copies them all.
TEST_CASE("fixtures: tiny-dbrx's fused Wqkv and experts load as views of the shared layout",
          "[checkpoint][fixtures][dbrx]") {
  const std::string dir = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-dbrx";
  RequireFixture(dir);
  auto ckpt = Checkpoint::Load(dir);
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  const Checkpoint& k = **ckpt;
  const ModelConfig& c = k.config();
  CHECK(c.model_type == "dbrx");
  CHECK(c.norm == NormType::kLayerNorm);
  const int64_t hidden = 72, q = 72, kv = 24, ffn = 28, experts = 5;
  const TensorStore& store = k.store();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    INFO("layer " << l);
    const std::string p = "transformer.blocks." + std::to_string(l) + ".";
    const TensorInfo* wqkv = store.Find(p + "norm_attn_norm.attn.Wqkv.weight");
    REQUIRE(wqkv != nullptr);
    REQUIRE(wqkv->shape == std::vector<int64_t>{q + 2 * kv, hidden});
    const LayerWeights& lw = k.weights().layers[l];
    const size_t row = hidden * 2;  // bf16
    CHECK(lw.q_proj->data == wqkv->data);
    CHECK(lw.k_proj->data == wqkv->data + q * row);
    CHECK(lw.v_proj->data == wqkv->data + (q + kv) * row);
    CHECK(lw.k_proj->shape == std::vector<int64_t>{kv, hidden});
    CHECK(k.Find("model.layers." + std::to_string(l) + ".self_attn.v_proj.weight") == lw.v_proj);
    CHECK(lw.input_layernorm == store.Find(p + "norm_attn_norm.norm_1.weight"));
    CHECK(lw.post_attention_layernorm == store.Find(p + "norm_attn_norm.norm_2.weight"));
    CHECK(lw.router == store.Find(p + "ffn.router.layer.weight"));
    const TensorInfo* w1 = store.Find(p + "ffn.experts.mlp.w1");
    const TensorInfo* v1 = store.Find(p + "ffn.experts.mlp.v1");
    const TensorInfo* w2 = store.Find(p + "ffn.experts.mlp.w2");
    REQUIRE(w1 != nullptr);
    REQUIRE(v1 != nullptr);
    REQUIRE(w2 != nullptr);
    REQUIRE(lw.experts.size() == static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      INFO("expert " << e);
      const ExpertWeights& ew = lw.experts[e];
      CHECK(ew.w1->data == w1->data + e * ffn * row);
      CHECK(ew.w3->data == v1->data + e * ffn * row);
      CHECK(!k.OwnsData(*ew.w1));
      CHECK(k.OwnsData(*ew.w2));
      REQUIRE(ew.w2->shape == std::vector<int64_t>{hidden, ffn});
      // w2[i][j] of the expert (down: [hidden, ffn]) is the fused tensor's row e * ffn + j, col i.
      const auto* down = reinterpret_cast<const uint16_t*>(ew.w2->data);
      const auto* fused = reinterpret_cast<const uint16_t*>(w2->data);
      int64_t differ = 0;
      for (int64_t i = 0; i < hidden; ++i) {
        for (int64_t j = 0; j < ffn; ++j) {
          differ += down[i * ffn + j] != fused[(e * ffn + j) * hidden + i];
        }
      }
      CHECK(differ == 0);
    }
  }
  CHECK(k.weights().embed_tokens == store.Find("transformer.wte.weight"));
  CHECK(k.weights().norm == store.Find("transformer.norm_f.weight"));

  // A host copy holds the same bytes, and the checkpoint's own copies (w2) are left intact.
  WeightStoreOptions options;
  auto copy = WeightStore::Load(k, options);
  INFO(copy.status().ToString());
  REQUIRE(copy.ok());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int64_t e = 0; e < experts; ++e) {
      for (auto field : {&ExpertWeights::w1, &ExpertWeights::w2, &ExpertWeights::w3}) {
        const TensorInfo* a = k.weights().layers[l].experts[e].*field;
        const TensorInfo* b = (*copy)->weights().layers[l].experts[e].*field;
        REQUIRE(a->nbytes == b->nbytes);
        CHECK(std::memcmp(a->data, b->data, a->nbytes) == 0);
      }
    }
    const TensorInfo* a = k.weights().layers[l].q_proj;
    CHECK(std::memcmp(a->data, (*copy)->weights().layers[l].q_proj->data, a->nbytes) == 0);
  }
}

TEST_CASE("checkpoint error: DBRX's fused tensor of the wrong shape is named",
          "[checkpoint][errors][dbrx]") {
  const std::string fixture = std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-dbrx";
  RequireFixture(fixture);
  TempDir dir;
  fs::copy(fixture + "/model.safetensors", dir / "model.safetensors");
  std::ifstream in(fixture + "/config.json");
  Json config = Json::parse(in);
  config["ffn_config"]["ffn_hidden_size"] = 27;  // the files hold 5 x 28 rows
  WriteFile(dir / "config.json", config.dump());
  CHECK_ERROR(
      LoadStatus(dir.path()), absl::StatusCode::kInvalidArgument,
      "tensor \"transformer.blocks.0.ffn.experts.mlp.w1\": wrong shape: expected [135, 72], "
      "found [140, 72]");
}

}  // namespace
}  // namespace moebatch
