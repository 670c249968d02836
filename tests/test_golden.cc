// The proof: the engine reproduces Hugging Face transformers (tests/fixtures/make_tiny_mixtral.py,
// MixtralForCausalLM 4.x, fp32 compute) on the committed tiny checkpoints, token for token.
//   - last-prompt-position logits within 1e-4 relative (max-abs error over max-abs value);
//   - greedy continuations identical, prompts one at a time and all in one batch;
//   - from the single file, from the two shards, and with a sliding window + tied embeddings;
//   - the detokenized text equals sentencepiece's own decode;
//   - unchanged when requests arrive while others decode (passes mixing prefill and decode), when
//     a small KV cache forces preemptions, and when prompts are chunked.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/cpu_device.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "tests/golden.h"

using namespace moebatch;

namespace {

using testing::FixtureDir;
using testing::Golden;
using testing::LoadGolden;

std::unique_ptr<Engine> MakeEngine(const std::string& dir, int64_t kv_bytes = int64_t{64} << 20,
                                   int64_t max_tokens_per_pass = 2048) {
  EngineOptions o;
  o.model_dir = dir;
  o.compute_dtype = DType::kF32;
  o.kv_cache_bytes = kv_bytes;
  o.max_tokens_per_pass = max_tokens_per_pass;
  auto e = Engine::Create(o);
  INFO(e.status().ToString() << " (is tokenizer.model there? run scripts/fetch_tokenizer.sh)");
  REQUIRE(e.ok());
  return *std::move(e);
}

GenerationRequest Greedy(const Golden& g) {
  GenerationRequest r;
  r.prompt_token_ids = g.prompt_ids;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = static_cast<int32_t>(g.greedy_ids.size());
  r.sampling.ignore_eos = true;  // transformers' loop ran a fixed number of steps
  return r;
}

struct Result {
  std::vector<int32_t> ids;
  std::string text;
};

// Runs all requests to completion together; results in submission order.
std::vector<Result> RunAll(Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = engine.AddRequest(requests[i]);
    REQUIRE(id.ok());
    index[*id] = i;
  }
  std::vector<Result> results(requests.size());
  std::vector<GenerationOutput> outs;
  while (engine.HasUnfinished()) {
    outs.clear();
    REQUIRE(engine.Step(&outs).ok());
    for (const auto& o : outs) {
      Result& r = results[index.at(o.request_id)];
      r.ids.insert(r.ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      r.text += o.new_text;
    }
  }
  return results;
}

void CheckGreedy(const std::string& fixture) {
  const std::string dir = FixtureDir(fixture);
  const auto golden = LoadGolden(dir);
  auto engine = MakeEngine(dir);
  std::vector<GenerationRequest> requests;
  for (const auto& g : golden) requests.push_back(Greedy(g));

  SECTION("prompt token ids: our tokenizer agrees with the fixture") {
    for (const auto& g : golden) {
      REQUIRE(engine->tokenizer().Encode(g.prompt, true) == g.prompt_ids);
    }
  }
  SECTION("one at a time") {
    for (size_t i = 0; i < golden.size(); ++i) {
      INFO(fixture << " prompt " << i << " (" << golden[i].prompt_ids.size() << " tokens)");
      auto r = RunAll(*engine, {requests[i]});
      REQUIRE(r[0].ids == golden[i].greedy_ids);
      REQUIRE(r[0].text == golden[i].greedy_text);
      REQUIRE(r[0].text == engine->tokenizer().Decode(r[0].ids));
    }
  }
  SECTION("all in one batch") {
    auto r = RunAll(*engine, requests);
    REQUIRE(engine->stats().passes == 32);  // every prompt prefilled together, then 31 decodes
    for (size_t i = 0; i < golden.size(); ++i) {
      INFO(fixture << " prompt " << i);
      REQUIRE(r[i].ids == golden[i].greedy_ids);
      REQUIRE(r[i].text == golden[i].greedy_text);
    }
    REQUIRE(engine->stats().kv_blocks_free == engine->stats().kv_blocks_total);
  }
  SECTION("staggered arrivals: passes mixing one request's prefill with others' decode") {
    std::map<int64_t, size_t> index;
    std::vector<Result> r(requests.size());
    std::vector<GenerationOutput> outs;
    size_t next = 0;
    int64_t mixed_passes = 0;
    while (next < requests.size() || engine->HasUnfinished()) {
      if (next < requests.size()) {
        index[*engine->AddRequest(requests[next])] = next;
        ++next;
      }
      const int64_t prefill_before = engine->stats().prefill_tokens;
      const int64_t decode_before = engine->stats().decode_tokens;
      outs.clear();
      REQUIRE(engine->Step(&outs).ok());
      mixed_passes += engine->stats().prefill_tokens > prefill_before &&
                      engine->stats().decode_tokens > decode_before;
      for (const auto& o : outs) {
        Result& x = r[index.at(o.request_id)];
        x.ids.insert(x.ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        x.text += o.new_text;
      }
    }
    REQUIRE(mixed_passes >= static_cast<int64_t>(golden.size()) - 1);
    for (size_t i = 0; i < golden.size(); ++i) {
      INFO(fixture << " prompt " << i);
      REQUIRE(r[i].ids == golden[i].greedy_ids);
      REQUIRE(r[i].text == golden[i].greedy_text);
    }
  }
  SECTION("a KV cache small enough to force preemptions, with chunked prefill") {
    // Room for ~20 blocks of 16 tokens: far less than the batch needs at once.
    const int64_t block_bytes = 2 * engine->config().num_hidden_layers *
                                engine->config().num_key_value_heads * 16 *
                                engine->config().head_dim * 4;
    auto small = MakeEngine(dir, 20 * block_bytes, /*max_tokens_per_pass=*/48);
    auto r = RunAll(*small, requests);
    REQUIRE(small->stats().preemptions > 0);
    for (size_t i = 0; i < golden.size(); ++i) {
      INFO(fixture << " prompt " << i);
      REQUIRE(r[i].ids == golden[i].greedy_ids);
    }
    REQUIRE(small->stats().kv_blocks_free == small->stats().kv_blocks_total);
  }
}

void CheckLogits(const std::string& fixture) {
  const std::string dir = FixtureDir(fixture);
  const auto golden = LoadGolden(dir);
  auto checkpoint = Checkpoint::Load(dir);
  REQUIRE(checkpoint.ok());
  auto device = CpuDevice::Create((*checkpoint)->config(), (*checkpoint)->weights(),
                                  CpuDeviceOptions{DType::kF32});
  REQUIRE(device.ok());
  auto model = std::make_unique<ModelRunner>(*std::move(device));
  const ModelConfig& c = (*checkpoint)->config();
  KvCacheConfig kc{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, 64, DType::kF32};
  auto cache = PagedKvCache::Create(kc);
  REQUIRE(cache.ok());
  for (size_t i = 0; i < golden.size(); ++i) {
    const Golden& g = golden[i];
    std::vector<int32_t> table;
    for (int64_t b = 0; b < BlocksForTokens(g.prompt_ids.size(), 16); ++b) {
      table.push_back(static_cast<int32_t>(63 - b));  // any blocks
    }
    ForwardBatch batch;
    batch.token_ids = g.prompt_ids;
    const int64_t n = static_cast<int64_t>(g.prompt_ids.size());
    batch.seqs.push_back(ForwardSequence{&table, 0, n, n, true});
    std::vector<float> logits;
    REQUIRE(model->Forward(batch, **cache, &logits).ok());
    REQUIRE(logits.size() == g.last_logits.size());
    double max_err = 0, max_ref = 0;
    for (size_t v = 0; v < logits.size(); ++v) {
      max_err = std::max(max_err, double(std::abs(logits[v] - g.last_logits[v])));
      max_ref = std::max(max_ref, double(std::abs(g.last_logits[v])));
    }
    INFO(fixture << " prompt " << i << ": max abs error " << max_err << ", max abs " << max_ref);
    REQUIRE(max_err / max_ref < 1e-4);
  }
}

}  // namespace

TEST_CASE("golden tiny-mixtral (single file): last-position logits") {
  CheckLogits("tiny-mixtral");
}
TEST_CASE("golden tiny-mixtral-sharded (two shards): last-position logits") {
  CheckLogits("tiny-mixtral-sharded");
}
TEST_CASE("golden tiny-mixtral-swa (sliding window, tied): last-position logits") {
  CheckLogits("tiny-mixtral-swa");
}
TEST_CASE("golden tiny-mixtral (single file): greedy tokens and text") {
  CheckGreedy("tiny-mixtral");
}
TEST_CASE("golden tiny-mixtral-sharded (two shards): greedy tokens and text") {
  CheckGreedy("tiny-mixtral-sharded");
}
TEST_CASE("golden tiny-mixtral-swa (sliding window, tied): greedy tokens and text") {
  CheckGreedy("tiny-mixtral-swa");
}
