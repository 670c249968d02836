// Log-probabilities and n choices per request.
//   - TokenLogprobs: log_softmax of the raw logits and its top-k (order, ties), against a direct
//     computation;
//   - the engine's logprobs / top_logprobs against Hugging Face transformers
//     (tests/fixtures/make_logprobs_golden.py writes <fixture>/logprobs.jsonl: torch.log_softmax of
//     the fp32 logits along the greedy continuation) on a dense and three MoE fixtures, one
//     request at a time and all in one batch; and that a sampled request reports the raw
//     distribution (not the temperature-scaled one);
//   - the scheduler's copy-on-write of a shared KV block;
//   - n > 1: n final outputs, greedy choices identical, seeded choices reproducible and each equal
//     to a single request seeded with ChoiceSeed(seed, i) (so the shared and copied KV blocks hold
//     what each choice would have computed alone), also under preemption, and fewer KV blocks than
//     n separate requests.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/scheduler.h"
#include "tests/support/golden.h"

using namespace moebatch;

namespace {

using testing::FixtureDir;

std::unique_ptr<Engine> MakeEngine(const std::string& fixture, int64_t kv_bytes = int64_t{32} << 20,
                                   int64_t max_num_seqs = 0) {
  EngineOptions o;
  o.model_dir = FixtureDir(fixture);
  o.cpu.compute_dtype = DType::kF32;
  o.kv.bytes = kv_bytes;
  o.schedule.max_num_seqs = max_num_seqs;
  auto e = Engine::Create(o);
  INFO(e.status().ToString() << " (run scripts/fetch_tokenizer.sh for tokenizer.model)");
  REQUIRE(e.ok());
  return *std::move(e);
}

// One choice's output, gathered over the steps.
struct Choice {
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kNone;
};

using Choices = std::map<std::pair<int64_t, int32_t>, Choice>;  // (request id, choice index)

// Runs one pass and adds its outputs to `done`.
void StepInto(Engine& engine, Choices* done) {
  std::vector<GenerationOutput> outs;
  REQUIRE(engine.Step(&outs).ok());
  for (auto& o : outs) {
    Choice& c = (*done)[{o.request_id, o.index}];
    REQUIRE(c.reason == FinishReason::kNone);  // nothing after a choice's final output
    c.ids.insert(c.ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    c.logprobs.insert(c.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
    c.text += o.new_text;
    if (o.finished) c.reason = o.finish_reason;
  }
}

// Runs every queued request to the end.
Choices Drain(Engine& engine, Choices done = {}) {
  while (engine.HasUnfinished()) StepInto(engine, &done);
  return done;
}

struct LogprobsGolden {
  std::vector<int32_t> prompt_ids, token_ids;
  std::vector<float> logprobs;
  std::vector<std::vector<int32_t>> top_ids;
  std::vector<std::vector<float>> top_logprobs;
};

std::vector<LogprobsGolden> LoadLogprobsGolden(const std::string& fixture) {
  const std::string path = FixtureDir(fixture) + "/logprobs.jsonl";
  std::ifstream in(path);
  INFO("reading " << path << " (written by tests/fixtures/make_logprobs_golden.py)");
  REQUIRE(in.good());
  std::vector<LogprobsGolden> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    LogprobsGolden g;
    g.prompt_ids = j.at("prompt_token_ids").get<std::vector<int32_t>>();
    g.token_ids = j.at("token_ids").get<std::vector<int32_t>>();
    g.logprobs = j.at("logprobs").get<std::vector<float>>();
    g.top_ids = j.at("top_ids").get<std::vector<std::vector<int32_t>>>();
    g.top_logprobs = j.at("top_logprobs").get<std::vector<std::vector<float>>>();
    out.push_back(std::move(g));
  }
  REQUIRE(out.size() >= 2);
  return out;
}

constexpr float kLogprobTolerance = 1e-4f;

// One step's logprobs against transformers': the token, its logprob, and the top entries. Ids must
// match in order, except among entries whose reference values are within the tolerance of each
// other (an order fp32 rounding may flip): those must match as a set.
void CheckStep(const TokenLogprob& got, const LogprobsGolden& g, size_t step) {
  INFO("step " << step);
  REQUIRE(got.token == g.token_ids[step]);
  CHECK(std::abs(got.logprob - g.logprobs[step]) <= kLogprobTolerance);
  const auto& want_ids = g.top_ids[step];
  const auto& want_lp = g.top_logprobs[step];
  REQUIRE(got.top.size() == want_ids.size());
  for (size_t k = 0; k < want_ids.size(); ++k) {
    INFO("top " << k << ": id " << got.top[k].first << " (want " << want_ids[k] << ")");
    CHECK(std::abs(got.top[k].second - want_lp[k]) <= kLogprobTolerance);
    if (got.top[k].first == want_ids[k]) continue;
    // A near tie: the id must be among the reference entries of (nearly) the same value.
    bool near_tie = false;
    for (size_t m = 0; m < want_ids.size(); ++m) {
      if (want_ids[m] == got.top[k].first && std::abs(want_lp[m] - want_lp[k]) <= 2e-5f) {
        near_tie = true;
      }
    }
    CHECK(near_tie);
  }
  // The sampled (greedy) token is the most likely one.
  CHECK(got.top[0].first == got.token);
}

void CheckAgainstTransformers(const std::string& fixture) {
  const auto golden = LoadLogprobsGolden(fixture);
  auto engine = MakeEngine(fixture);
  std::vector<GenerationRequest> requests;
  for (const auto& g : golden) {
    GenerationRequest r;
    r.prompt_token_ids = g.prompt_ids;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = static_cast<int32_t>(g.token_ids.size());
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = static_cast<int32_t>(g.top_ids[0].size());
    requests.push_back(std::move(r));
  }
  auto check = [&](const Choices& done, const std::vector<int64_t>& ids) {
    for (size_t i = 0; i < golden.size(); ++i) {
      INFO(fixture << " prompt " << i << " (" << golden[i].prompt_ids.size() << " tokens)");
      const Choice& c = done.at({ids[i], 0});
      REQUIRE(c.ids == golden[i].token_ids);
      REQUIRE(c.logprobs.size() == c.ids.size());  // one per generated token
      for (size_t s = 0; s < c.ids.size(); ++s) CheckStep(c.logprobs[s], golden[i], s);
    }
  };
  SECTION("one at a time") {
    for (size_t i = 0; i < golden.size(); ++i) {
      std::vector<int64_t> ids(golden.size(), -1);
      ids[i] = *engine->AddRequest(requests[i]);
      const auto done = Drain(*engine);
      const Choice& c = done.at({ids[i], 0});
      INFO(fixture << " prompt " << i);
      REQUIRE(c.ids == golden[i].token_ids);
      REQUIRE(c.logprobs.size() == c.ids.size());
      for (size_t s = 0; s < c.ids.size(); ++s) CheckStep(c.logprobs[s], golden[i], s);
    }
  }
  SECTION("all in one batch") {
    std::vector<int64_t> ids;
    for (const auto& r : requests) ids.push_back(*engine->AddRequest(r));
    check(Drain(*engine), ids);
  }
}

}  // namespace

TEST_CASE("TokenLogprobs: log_softmax of the raw logits and its top-k, ties to the lower id") {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f};
  double sum = 0;
  for (float z : logits) sum += std::exp(static_cast<double>(z));
  auto want = [&](int v) { return static_cast<float>(logits[v] - std::log(sum)); };
  const TokenLogprob lp = TokenLogprobs(logits.data(), 6, 4, 3);
  CHECK(lp.token == 4);
  CHECK(lp.logprob == Approx(want(4)).margin(1e-6));
  REQUIRE(lp.top.size() == 3);
  CHECK(lp.top[0].first == 1);  // 3.0 at ids 1 and 3: the lower id first
  CHECK(lp.top[1].first == 3);
  CHECK(lp.top[2].first == 5);
  for (const auto& [id, value] : lp.top) CHECK(value == Approx(want(id)).margin(1e-6));
  CHECK(TokenLogprobs(logits.data(), 6, 2, 0).top.empty());
  const TokenLogprob all = TokenLogprobs(logits.data(), 6, 0, 6);
  REQUIRE(all.top.size() == 6);
  double total = 0;
  for (const auto& [id, value] : all.top) total += std::exp(static_cast<double>(value));
  CHECK(total == Approx(1.0).margin(1e-6));
  CHECK(all.top.back().first == 2);
  // Large logits do not overflow (max-subtracted).
  const std::vector<float> big = {1000.0f, 999.0f};
  CHECK(TokenLogprobs(big.data(), 2, 1, 0).logprob == Approx(-1.0 - std::log1p(std::exp(-1.0))));
}

TEST_CASE("ChoiceSeed: choice 0 keeps the seed, other choices get other seeds") {
  CHECK(ChoiceSeed(42, 0) == 42);
  std::set<uint64_t> seeds;
  for (int32_t i = 0; i < kMaxChoices; ++i) seeds.insert(ChoiceSeed(42, i));
  CHECK(seeds.size() == static_cast<size_t>(kMaxChoices));
  CHECK(ChoiceSeed(42, 1) != ChoiceSeed(43, 1));
  CHECK(ChoiceSeed(42, 3) == ChoiceSeed(42, 3));
}

TEST_CASE("SamplingParams::Validate: n, top_logprobs") {
  SamplingParams p;
  p.n = 0;
  CHECK(p.Validate().message() == "n: must be in [1, 16], got 0");
  p.n = 17;
  CHECK(p.Validate().message() == "n: must be in [1, 16], got 17");
  p.n = 16;
  CHECK(p.Validate().ok());
  p.top_logprobs = 2;
  CHECK(p.Validate().message() == "top_logprobs: needs logprobs to be true, got 2");
  p.logprobs = true;
  CHECK(p.Validate().ok());
  p.top_logprobs = 21;
  CHECK(p.Validate().message() == "top_logprobs: must be in [0, 20], got 21");
}

TEST_CASE("scheduler: a shared block is copied before a sequence writes into it") {
  BlockAllocator alloc(10);
  SchedulerConfig cfg{16, 64, 4};  // max_num_seqs 16, 64 tokens per pass, blocks of 4 tokens
  Scheduler sched(cfg, &alloc);
  SequenceSlots a;
  a.id = 16;
  a.tokens.assign(6, 5);  // 6 tokens: blocks of 4 + 2 (the second partly filled)
  a.width = 3;
  sched.Add(&a);
  SchedulerOutput pass = sched.Schedule();
  REQUIRE(pass.num_prefill_tokens == 6);
  sched.Commit(pass);
  REQUIRE(a.block_table.size() == 2);
  // Fork two choices as the engine does: share the table, join the running set.
  SequenceSlots b = a, c = a;
  b.id = 17;
  c.id = 18;
  a.width = b.width = c.width = 1;
  for (SequenceSlots* s : {&b, &c}) {
    for (int32_t block : s->block_table) alloc.Share(block);
    sched.AddRunning(s);
  }
  const std::vector<int32_t> shared = a.block_table;
  REQUIRE(alloc.holders(shared[0]) == 3);
  REQUIRE(alloc.num_free() == 8);
  for (SequenceSlots* s : {&a, &b, &c}) s->tokens.push_back(9);  // each sampled a token
  pass = sched.Schedule();
  REQUIRE(pass.num_decode_tokens == 3);
  // a and b (older) write position 6 into a copy of the partly filled block; c, its last holder,
  // writes in place. The full first block stays shared.
  REQUIRE(pass.copies.size() == 2);
  for (const BlockCopy& copy : pass.copies) CHECK(copy.src == shared[1]);
  CHECK(a.block_table[0] == shared[0]);
  CHECK(b.block_table[0] == shared[0]);
  CHECK(c.block_table[0] == shared[0]);
  CHECK(a.block_table[1] == pass.copies[0].dst);
  CHECK(b.block_table[1] == pass.copies[1].dst);
  CHECK(c.block_table[1] == shared[1]);
  CHECK(alloc.holders(shared[0]) == 3);
  CHECK(alloc.holders(shared[1]) == 1);
  CHECK(alloc.num_free() == 6);
  sched.Commit(pass);
  // Position 8 starts a new block for each: nothing to copy.
  for (SequenceSlots* s : {&a, &b, &c}) s->tokens.push_back(9);
  pass = sched.Schedule();
  sched.Commit(pass);
  for (SequenceSlots* s : {&a, &b, &c}) s->tokens.push_back(9);
  pass = sched.Schedule();
  CHECK(pass.copies.empty());
  CHECK(alloc.num_free() == 3);
  for (SequenceSlots* s : {&a, &b, &c}) sched.Remove(s);
  CHECK(alloc.num_free() == 10);
}

TEST_CASE("scheduler: a request's width counts against max_num_seqs at admission") {
  BlockAllocator alloc(64);
  SchedulerConfig cfg{4, 64, 4};  // at most 4 sequences hold KV
  Scheduler sched(cfg, &alloc);
  SequenceSlots one, wide;
  one.id = 16;
  one.tokens.assign(3, 1);
  wide.id = 32;
  wide.tokens.assign(3, 1);
  wide.width = 4;
  sched.Add(&one);
  sched.Add(&wide);
  SchedulerOutput pass = sched.Schedule();
  REQUIRE(pass.chunks.size() == 1);  // 1 + 4 > 4: the wide one waits
  CHECK(pass.chunks[0].seq == &one);
  sched.Commit(pass);
  sched.Remove(&one);
  pass = sched.Schedule();
  REQUIRE(pass.chunks.size() == 1);
  CHECK(pass.chunks[0].seq == &wide);
  sched.Remove(&wide);
}

TEST_CASE("logprobs match transformers: tiny-llama (dense)", "[logprobs]") {
  CheckAgainstTransformers("tiny-llama");
}
TEST_CASE("logprobs match transformers: tiny-mixtral (MoE)", "[logprobs]") {
  CheckAgainstTransformers("tiny-mixtral");
}
TEST_CASE("logprobs match transformers: tiny-qwen3-moe (MoE, 32 experts top-8)", "[logprobs]") {
  CheckAgainstTransformers("tiny-qwen3-moe");
}
TEST_CASE("logprobs match transformers: tiny-olmoe (MoE, f16 shards)", "[logprobs]") {
  CheckAgainstTransformers("tiny-olmoe");
}

TEST_CASE("logprobs are the raw model distribution, whatever the temperature", "[logprobs]") {
  // golden.jsonl's last_logits are transformers' logits at the last prompt position: the first
  // token's reported logprobs must be their log_softmax, not that of logits / temperature.
  const auto golden = testing::LoadGolden(FixtureDir("tiny-mixtral"));
  auto engine = MakeEngine("tiny-mixtral");
  const auto& g = golden[2];
  GenerationRequest r;
  r.prompt_token_ids = g.prompt_ids;
  r.sampling.temperature = 3.0f;
  r.sampling.seed = 7;
  r.sampling.max_tokens = 1;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 5;
  const int64_t id = *engine->AddRequest(r);
  const Choice c = Drain(*engine).at({id, 0});
  REQUIRE(c.logprobs.size() == 1);
  const std::vector<float>& z = g.last_logits;
  double max = z[0], sum = 0;
  for (float v : z) max = std::max<double>(max, v);
  for (float v : z) sum += std::exp(v - max);
  auto reference = [&](int32_t v) { return z[v] - max - std::log(sum); };
  CHECK(c.logprobs[0].token == c.ids[0]);
  CHECK(std::abs(c.logprobs[0].logprob - reference(c.ids[0])) <= kLogprobTolerance);
  REQUIRE(c.logprobs[0].top.size() == 5);
  CHECK(c.logprobs[0].top[0].first == g.greedy_ids[0]);
  for (const auto& [v, value] : c.logprobs[0].top) {
    CHECK(std::abs(value - reference(v)) <= kLogprobTolerance);
  }
  // At temperature 3 the scaled distribution's value differs by far more than the tolerance.
  double scaled_sum = 0;
  for (float v : z) scaled_sum += std::exp((v - max) / 3.0);
  const double scaled = (z[g.greedy_ids[0]] - max) / 3.0 - std::log(scaled_sum);
  CHECK(std::abs(c.logprobs[0].top[0].second - scaled) > 0.1);
}

TEST_CASE("n > 1: n choices that share the prompt's KV blocks", "[n]") {
  // Block size 16; a 40-token prompt fills 2 blocks and part of a third.
  auto engine = MakeEngine("tiny-mixtral");
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 39; ++i) prompt.push_back(300 + 17 * i);
  REQUIRE(engine->plan().kv.block_size == 16);
  auto used = [&] { return engine->stats().kv_blocks_total - engine->stats().kv_blocks_free; };

  SECTION("greedy: n identical choices, each the single request's tokens, logprobs included") {
    GenerationRequest r;
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 10;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = 3;
    const int64_t single = *engine->AddRequest(r);
    const Choice alone = Drain(*engine).at({single, 0});
    r.sampling.n = 4;
    const int64_t id = *engine->AddRequest(r);
    const auto done = Drain(*engine);
    REQUIRE(done.size() == 4);
    for (int32_t i = 0; i < 4; ++i) {
      const Choice& c = done.at({id, i});
      CHECK(c.reason == FinishReason::kLength);
      CHECK(c.ids == alone.ids);
      CHECK(c.text == alone.text);
      REQUIRE(c.logprobs.size() == alone.logprobs.size());
      for (size_t s = 0; s < c.logprobs.size(); ++s) {
        CHECK(c.logprobs[s].logprob == alone.logprobs[s].logprob);
        CHECK(c.logprobs[s].top == alone.logprobs[s].top);
      }
    }
    CHECK(used() == 0);
  }

  SECTION("seeded sampling: reproducible, choices differ, choice i = a request seeded ChoiceSeed") {
    GenerationRequest r;
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 1.0f;
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = true;
    r.sampling.seed = 2024;
    r.sampling.n = 4;
    const int64_t first = *engine->AddRequest(r);
    // After the prefill pass the four choices hold the prompt's 3 blocks together; 4 separate
    // requests would hold 12.
    Choices run1;
    StepInto(*engine, &run1);
    REQUIRE(run1.size() == 4);
    CHECK(used() == 3);
    // The first decode pass copies the partly filled block for all but its last holder.
    StepInto(*engine, &run1);
    CHECK(used() == 6);
    CHECK(used() < 4 * 3);
    run1 = Drain(*engine, std::move(run1));
    const int64_t second = *engine->AddRequest(r);
    const auto run2 = Drain(*engine);
    std::set<std::vector<int32_t>> distinct;
    for (int32_t i = 0; i < 4; ++i) {
      INFO("choice " << i);
      const Choice& c = run2.at({second, i});
      REQUIRE(c.ids.size() == 12);
      distinct.insert(c.ids);
      CHECK(run1.at({first, i}).ids == c.ids);  // the same request again: the same choices
    }
    CHECK(distinct.size() == 4);
    // Choice i draws exactly what one request seeded with ChoiceSeed(2024, i) draws, from the
    // same logits: the shared and copied KV blocks hold what each choice would have alone.
    for (int32_t i = 0; i < 4; ++i) {
      GenerationRequest one = r;
      one.sampling.n = 1;
      one.sampling.seed = ChoiceSeed(2024, i);
      const int64_t single = *engine->AddRequest(one);
      CHECK(Drain(*engine).at({single, 0}).ids == run2.at({second, i}).ids);
    }
    CHECK(used() == 0);
  }

  SECTION("the same under preemption: a KV cache too small for the choices side by side") {
    GenerationRequest r;
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 1.0f;
    r.sampling.max_tokens = 40;
    r.sampling.ignore_eos = true;
    r.sampling.seed = 77;
    r.sampling.n = 4;
    std::vector<std::vector<int32_t>> want;
    for (int32_t i = 0; i < 4; ++i) {
      GenerationRequest one = r;
      one.sampling.n = 1;
      one.sampling.seed = ChoiceSeed(77, i);
      const int64_t single = *engine->AddRequest(one);
      want.push_back(Drain(*engine).at({single, 0}).ids);
    }
    // 80 tokens need 5 blocks per choice; 12 blocks hold the shared prompt and a few choices.
    auto small = MakeEngine("tiny-mixtral", 12 * engine->plan().kv.bytes_per_block());
    REQUIRE(small->stats().kv_blocks_total == 12);
    const int64_t id = *small->AddRequest(r);
    const auto done = Drain(*small);
    CHECK(small->stats().preemptions > 0);
    for (int32_t i = 0; i < 4; ++i) CHECK(done.at({id, i}).ids == want[i]);
    CHECK(small->stats().kv_blocks_free == 12);
  }

  SECTION("Abort ends every choice, forked or not, and frees the blocks") {
    GenerationRequest r;
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 50;
    r.sampling.n = 3;
    const int64_t before_fork = *engine->AddRequest(r);
    engine->Abort(before_fork);
    auto done = Drain(*engine);
    REQUIRE(done.size() == 3);
    for (int32_t i = 0; i < 3; ++i)
      CHECK(done.at({before_fork, i}).reason == FinishReason::kAborted);
    const int64_t forked = *engine->AddRequest(r);
    done.clear();
    StepInto(*engine, &done);
    StepInto(*engine, &done);
    engine->Abort(forked);
    done = Drain(*engine, std::move(done));
    REQUIRE(done.size() == 3);
    for (int32_t i = 0; i < 3; ++i) CHECK(done.at({forked, i}).reason == FinishReason::kAborted);
    CHECK(used() == 0);
  }

  SECTION("n above what the engine decodes per pass is refused, naming the field") {
    auto narrow = MakeEngine("tiny-mixtral", int64_t{32} << 20, /*max_num_seqs=*/2);
    CHECK(narrow->max_choices() == 2);
    GenerationRequest r;
    r.prompt_token_ids = prompt;
    r.sampling.n = 3;
    auto id = narrow->AddRequest(r);
    REQUIRE_FALSE(id.ok());
    CHECK(id.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(id.status().message()).rfind("n: 3 choices", 0) == 0);
    r.sampling.n = 2;
    CHECK(narrow->AddRequest(r).ok());
    Drain(*narrow);
  }
}
