// Non-finite weights (engine/model/weight_check.h): a copy of the tiny golden Mixtral whose
// layer-0 experts' w2 are all NaN loads (the loader reads only the small tensors whole), every
// request then fails with a clear error instead of emitting token 0 forever, and --verify_weights
// refuses the file at load, naming the tensor. A NaN norm or lm_head row is refused at load always.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/checkpoint.h"

namespace moebatch {
namespace {

namespace fs = std::filesystem;

struct FixtureCopy {
  explicit FixtureCopy(const std::string& name) {
    std::random_device device;
    dir = fs::temp_directory_path() /
          ("moebatch_non_finite_" + std::to_string(device()) + std::to_string(device()));
    fs::copy(std::string(MOEBATCH_FIXTURES_DIR) + "/" + name, dir, fs::copy_options::recursive);
  }
  ~FixtureCopy() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // Overwrites every element of the named tensors of model.safetensors with `bits` (one bf16).
  void Poison(const std::vector<std::string>& tensors, uint16_t bits, int64_t elements = -1) {
    const fs::path file = dir / "model.safetensors";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    std::string header(header_bytes, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_bytes));
    const nlohmann::json h = nlohmann::json::parse(header);
    for (const std::string& name : tensors) {
      REQUIRE(h.contains(name));
      REQUIRE(h[name]["dtype"] == "BF16");
      const uint64_t begin = h[name]["data_offsets"][0], end = h[name]["data_offsets"][1];
      const int64_t n = elements < 0 ? static_cast<int64_t>((end - begin) / 2) : elements;
      f.seekp(static_cast<std::streamoff>(8 + header_bytes + begin));
      for (int64_t i = 0; i < n; ++i) f.write(reinterpret_cast<const char*>(&bits), 2);
    }
    REQUIRE(f.good());
  }
  fs::path dir;
};

constexpr uint16_t kNaN = 0x7FC0, kInf = 0x7F80;

std::vector<std::string> Layer0W2() {
  std::vector<std::string> names;
  for (int e = 0; e < 8; ++e) {
    names.push_back("model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".w2.weight");
  }
  return names;
}

TEST_CASE("non-finite weights: a NaN norm or an inf in lm_head's first rows fails the load") {
  {
    FixtureCopy copy("tiny-mixtral");
    copy.Poison({"model.layers.1.post_attention_layernorm.weight"}, kInf, 1);
    auto loaded = Checkpoint::Load(copy.dir.string());
    CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(loaded.status().message()),
               Catch::Contains("model.layers.1.post_attention_layernorm.weight") &&
                   Catch::Contains("element 0 is inf"));
  }
  {
    FixtureCopy copy("tiny-mixtral");
    copy.Poison({"lm_head.weight"}, kNaN, 100);
    auto loaded = Checkpoint::Load(copy.dir.string());
    CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(loaded.status().message()),
               Catch::Contains("lm_head.weight") && Catch::Contains("element 0 is nan"));
  }
}

TEST_CASE("non-finite weights: requests fail clearly; --verify_weights refuses the file") {
  FixtureCopy copy("tiny-mixtral");
  copy.Poison(Layer0W2(), kNaN);
  EngineOptions o;
  o.model_dir = copy.dir.string();
  o.kv.bytes = int64_t{8} << 20;
  auto engine = Engine::Create(o);  // the experts are not read whole at load
  REQUIRE(engine.ok());
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 8;
  SamplingParams sampled = greedy;
  sampled.temperature = 1.0;
  sampled.seed = 3;
  REQUIRE((*engine)->AddRequest({{1, 100, 200}, greedy}).ok());
  REQUIRE((*engine)->AddRequest({{1, 300}, sampled}).ok());
  int failed = 0;
  std::vector<GenerationOutput> out;
  while ((*engine)->HasUnfinished()) REQUIRE((*engine)->Step(&out).ok());
  for (const GenerationOutput& o : out) {
    if (!o.finished) continue;
    CHECK(o.finish_reason == FinishReason::kError);
    CHECK(o.new_token_ids.empty());
    CHECK(o.error.code() == absl::StatusCode::kInternal);
    CHECK_THAT(std::string(o.error.message()), Catch::Contains("not finite"));
    ++failed;
  }
  CHECK(failed == 2);
  CHECK((*engine)->stats().requests_failed == 2);

  o.weights.verify = true;
  auto refused = Engine::Create(o);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("model.layers.0.block_sparse_moe.experts.0.w2.weight") &&
                 Catch::Contains("element 0 is nan"));
}

}  // namespace
}  // namespace moebatch
