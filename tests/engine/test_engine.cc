// The scheduler (block accounting, preemption, chunked prefill, fairness) on simulated workloads,
// and the engine's request handling on the tiny golden model.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/text/json_output.h"

using namespace moebatch;

namespace {

// Drives a Scheduler the way the engine does: after each pass, a sequence whose tokens are all
// computed gets one new token; it finishes after `gen_len` generated tokens.
struct Sim {
  Sim(int64_t blocks, SchedulerConfig cfg) : alloc(blocks), sched(cfg, &alloc), config(cfg) {}
  BlockAllocator alloc;
  Scheduler sched;
  SchedulerConfig config;
  std::vector<std::unique_ptr<SequenceSlots>> seqs;
  std::map<int64_t, int64_t> prompt_len, gen_len;
  std::set<int64_t> finished;
  int64_t preemptions = 0;
  int64_t largest_pass = 0;  // tokens

  void Add(int64_t id, int64_t prompt, int64_t gen) {
    auto s = std::make_unique<SequenceSlots>();
    s->id = id;
    s->tokens.assign(prompt, 7);
    prompt_len[id] = prompt;
    gen_len[id] = gen;
    sched.Add(s.get());
    seqs.push_back(std::move(s));
  }

  // A table kept to `window` (0: none) holds blocks for every position the chunk's queries read
  // and nothing wholly behind them: kNoBlock before, at most the span's blocks live.
  void CheckWindowTable(const SequenceSlots& seq, const ScheduledChunk& c, int64_t window,
                        const std::vector<int32_t>& table) {
    if (window == 0) {
      for (int32_t b : table) REQUIRE(b != kNoBlock);
      return;
    }
    const int64_t bs = config.block_size;
    const int64_t first_key = std::max<int64_t>(0, seq.num_computed - window + 1);
    const int64_t end = BlocksForTokens(seq.num_computed + c.num_tokens, bs);
    REQUIRE(static_cast<int64_t>(table.size()) >= end);
    int64_t live = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(table.size()); ++i) {
      if (i >= first_key / bs && i < end) REQUIRE(table[i] != kNoBlock);
      if (i < first_key / bs) REQUIRE(table[i] == kNoBlock);
      live += table[i] != kNoBlock ? 1 : 0;
    }
    most_window_blocks = std::max(most_window_blocks, live);
    REQUIRE(live <= BlocksForTokens(window - 1 + c.num_tokens, bs) + 1);
  }

  int64_t most_window_blocks = 0;  // live blocks of a windowed table, the most seen

  // Passes until no work is left (each checked), at most 20,000.
  void RunToEnd() {
    int passes = 0;
    while (sched.has_work()) {
      REQUIRE(Pass());
      REQUIRE(++passes < 20000);
    }
  }

  // One pass with invariant checks. Returns false when nothing was scheduled.
  bool Pass() {
    SchedulerOutput out = sched.Schedule();
    // Preemption: victims are newer than every decode sequence scheduled this pass.
    for (SequenceSlots* v : out.preempted) {
      ++preemptions;
      REQUIRE(v->block_table.empty());
      REQUIRE(v->window_block_table.empty());
      REQUIRE(v->num_computed == 0);
      for (const ScheduledChunk& c : out.chunks) {
        if (c.is_decode) REQUIRE(c.seq->id < v->id);
      }
      REQUIRE(out.num_prefill_tokens == 0);  // preemption mode admits no prefill
    }
    int64_t held = 0;
    std::set<int32_t> owned;
    for (auto& s : seqs) {
      for (const std::vector<int32_t>* table : {&s->block_table, &s->window_block_table}) {
        for (int32_t b : *table) {
          if (b == kNoBlock) continue;
          ++held;
          REQUIRE(owned.insert(b).second);
        }
      }
    }
    REQUIRE(held + alloc.num_free() == alloc.num_blocks());  // no block lost or double-owned
    REQUIRE(out.num_decode_tokens + out.num_prefill_tokens <= config.max_tokens_per_pass);
    largest_pass = std::max(largest_pass, out.num_decode_tokens + out.num_prefill_tokens);
    std::set<SequenceSlots*> distinct;
    for (const ScheduledChunk& c : out.chunks) {
      REQUIRE(distinct.insert(c.seq).second);
      REQUIRE(c.num_tokens >= 1);
      REQUIRE(c.num_tokens <= c.seq->num_pending());
      REQUIRE(static_cast<int64_t>(c.seq->block_table.size()) * config.block_size >=
              c.seq->num_computed + c.num_tokens);
      CheckWindowTable(*c.seq, c, config.main_window, c.seq->block_table);
      if (config.window > 0) {
        REQUIRE(c.seq->window_block_table.size() == c.seq->block_table.size());
        CheckWindowTable(*c.seq, c, config.window, c.seq->window_block_table);
      } else {
        REQUIRE(c.seq->window_block_table.empty());
      }
    }
    if (out.empty()) return !out.preempted.empty();
    sched.Commit(out);
    for (const ScheduledChunk& c : out.chunks) {
      SequenceSlots* s = c.seq;
      if (s->num_pending() != 0) continue;
      s->tokens.push_back(9);
      const int64_t generated = static_cast<int64_t>(s->tokens.size()) - prompt_len[s->id];
      if (generated >= gen_len[s->id]) {
        sched.Remove(s);
        finished.insert(s->id);
      }
    }
    return true;
  }
};

}  // namespace

TEST_CASE("scheduler: decode first, prefill within the token budget, chunked prompts") {
  Sim sim(1000, SchedulerConfig{64, 40, 16});
  sim.Add(1, 100, 3);  // longer than the budget: split over passes
  sim.Add(2, 10, 3);
  SchedulerOutput first = sim.sched.Schedule();
  REQUIRE(first.chunks.size() == 1);
  REQUIRE(first.chunks[0].num_tokens == 40);
  REQUIRE(first.chunks[0].seq->id == 1);
  sim.sched.Commit(first);
  SchedulerOutput second = sim.sched.Schedule();
  REQUIRE(second.chunks[0].num_tokens == 40);
  sim.sched.Commit(second);
  SchedulerOutput third = sim.sched.Schedule();
  REQUIRE(third.chunks.size() == 2);  // the last 20 of seq 1, then all of seq 2
  REQUIRE(third.chunks[0].num_tokens == 20);
  REQUIRE(third.chunks[1].seq->id == 2);
  REQUIRE(third.chunks[1].num_tokens == 10);
  sim.sched.Commit(third);
  REQUIRE(sim.sched.num_running() == 2);
  sim.seqs[0]->tokens.push_back(5);
  sim.seqs[1]->tokens.push_back(5);
  SchedulerOutput decode = sim.sched.Schedule();
  REQUIRE(decode.num_decode_tokens == 2);
  REQUIRE(decode.chunks[0].is_decode);
}

TEST_CASE("scheduler: max_num_seqs bounds the sequences holding KV") {
  Sim sim(1000, SchedulerConfig{3, 1000, 16});
  for (int i = 1; i <= 6; ++i) sim.Add(i, 5, 4);
  SchedulerOutput out = sim.sched.Schedule();
  REQUIRE(out.chunks.size() == 3);
}

TEST_CASE("scheduler: limits from a token ceiling, n_real and max_num_seqs (0: automatic)") {
  // The cpu backend: no profile; automatic sequences fill a pass with decode tokens.
  SchedulerConfig c = SchedulerConfigFor(2048, 0, std::nullopt, 16);
  REQUIRE(c.max_tokens_per_pass == 2048);
  REQUIRE(c.max_num_seqs == 2048);
  REQUIRE(c.block_size == 16);
  // The cuda backend: the ceiling the GPU budget holds, lowered to n_real.
  c = SchedulerConfigFor(19000, 0, 12000, 16);
  REQUIRE(c.max_tokens_per_pass == 12000);
  REQUIRE(c.max_num_seqs == 12000);
  // n_real above the ceiling does not raise it; a profile of 0 tokens still leaves one.
  REQUIRE(SchedulerConfigFor(512, 0, 5000, 16).max_tokens_per_pass == 512);
  REQUIRE(SchedulerConfigFor(512, 0, 0, 16).max_tokens_per_pass == 1);
  // Given sequences are kept.
  c = SchedulerConfigFor(19000, 300, 12000, 16);
  REQUIRE(c.max_num_seqs == 300);
}

TEST_CASE("scheduler: running sequences never outnumber the token budget, whatever max_num_seqs") {
  // What sizes the cuda backend's activations: a pass never holds more than the budget, decode
  // included, even when max_num_seqs would allow more sequences than it.
  Sim sim(1000, SchedulerConfigFor(16, 40, std::nullopt, 4));
  for (int i = 1; i <= 60; ++i) sim.Add(i, 3, 50);
  int64_t most_running = 0;
  while (sim.sched.has_work()) {
    REQUIRE(sim.Pass());  // checks decode + prefill <= 16 every pass
    most_running = std::max(most_running, sim.sched.num_running());
  }
  REQUIRE(static_cast<int>(sim.finished.size()) == 60);
  REQUIRE(sim.largest_pass == 16);
  REQUIRE(most_running == 16);
}

TEST_CASE(
    "scheduler: under KV pressure it preempts newest first, never over-commits, starves no one") {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t blocks = 12 + trial;  // small: forces many preemptions
    Sim sim(blocks, SchedulerConfig{16, 48, 4});
    std::uniform_int_distribution<int64_t> prompt(1, 30), gen(1, 25);
    const int n = 30;
    for (int i = 1; i <= n; ++i) {
      int64_t p = prompt(rng), g = gen(rng);
      // Every sequence alone fits the cache (the engine refuses those that cannot).
      g = std::min<int64_t>(g, blocks * 4 - p);
      sim.Add(i, p, g);
    }
    sim.RunToEnd();
    REQUIRE(static_cast<int>(sim.finished.size()) == n);
    REQUIRE(sim.alloc.num_free() == blocks);
    if (trial == 0) REQUIRE(sim.preemptions > 0);
  }
}

// Sliding windows (engine/kv/kv_cache.h's layer groups). window: gpt-oss's window layers beside
// full-context ones, a second table per sequence from the same blocks; main_window: every layer
// in the window (Mistral's sliding_window), the one table kept to it. Either way the blocks behind
// the window go back to the free list as the sequence moves on.
TEST_CASE("scheduler: tables kept to a sliding window free the blocks behind it") {
  SECTION("window group beside the main one: a long sequence holds its window twice over") {
    Sim sim(200, SchedulerConfig{16, 48, 4, 0, 8});
    sim.Add(1, 30, 100);  // 130 positions: 33 main blocks, a window of at most 3
    while (sim.sched.has_work()) REQUIRE(sim.Pass());
    REQUIRE(sim.finished.size() == 1);
    REQUIRE(sim.alloc.num_free() == 200);
    // The prompt's chunk spans 30 tokens (8 blocks); decode holds ceil(7 / 4) + 1 = 3.
    REQUIRE(sim.most_window_blocks == 8);
  }
  SECTION("every layer in the window: a sequence far longer than the cache finishes") {
    Sim sim(6, SchedulerConfig{16, 8, 4, 8, 0});  // 24 token slots; the window needs 3 blocks
    sim.Add(1, 20, 300);
    sim.Add(2, 5, 280);
    sim.RunToEnd();
    REQUIRE(sim.finished.size() == 2);
    REQUIRE(sim.alloc.num_free() == 6);
  }
  SECTION("KV pressure with windows: preemption returns both tables' blocks, no one starves") {
    std::mt19937_64 rng(99);
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t blocks = 16 + trial;
      const bool main = trial % 2 == 1;
      Sim sim(blocks, SchedulerConfig{16, 48, 4, main ? 6 : 0, main ? 0 : 6});
      std::uniform_int_distribution<int64_t> prompt(1, 30), gen(1, 40);
      const int n = 30;
      for (int i = 1; i <= n; ++i) {
        const int64_t p = prompt(rng);
        // Alone, every sequence fits: its main table (a window's 2 blocks when kept to one) and
        // the window table beside it.
        const int64_t g = main ? gen(rng) : std::min<int64_t>(gen(rng), (blocks - 3) * 4 - p);
        sim.Add(i, p, g);
      }
      sim.RunToEnd();
      REQUIRE(static_cast<int>(sim.finished.size()) == n);
      REQUIRE(sim.alloc.num_free() == blocks);
      if (trial < 2) REQUIRE(sim.preemptions > 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The engine on the tiny golden model (tests/fixtures/tiny-mixtral).

namespace {

std::string TinyDir() { return std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral"; }

std::unique_ptr<Engine> TinyEngine(int64_t kv_bytes = int64_t{32} << 20) {
  EngineOptions o;
  o.model_dir = TinyDir();
  o.kv.bytes = kv_bytes;
  auto e = Engine::Create(o);
  INFO(e.status().ToString() << " (run scripts/fetch_tokenizer.sh for tokenizer.model)");
  REQUIRE(e.ok());
  return *std::move(e);
}

struct Done {
  std::vector<int32_t> ids;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int64_t completion_tokens = 0;
};

std::map<int64_t, Done> Drain(Engine& engine) {
  std::map<int64_t, Done> done;
  std::vector<GenerationOutput> outs;
  while (engine.HasUnfinished()) {
    outs.clear();
    REQUIRE(engine.Step(&outs).ok());
    for (const auto& o : outs) {
      Done& d = done[o.request_id];
      REQUIRE(d.reason == FinishReason::kNone);  // nothing after the final output
      d.ids.insert(d.ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      d.text += o.new_text;
      if (o.finished) {
        d.reason = o.finish_reason;
        d.completion_tokens = o.completion_tokens;
      }
    }
  }
  return done;
}

GenerationRequest Prompt(const Engine& e, const std::string& text, SamplingParams p) {
  GenerationRequest r;
  r.prompt_token_ids = e.tokenizer().Encode(text, true);
  r.sampling = std::move(p);
  return r;
}

}  // namespace

TEST_CASE("engine: max_tokens ends with length; blocks return to the free list") {
  auto e = TinyEngine();
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 5;
  p.ignore_eos = true;
  const int64_t id = *e->AddRequest(Prompt(*e, "Hello there", p));
  auto done = Drain(*e);
  REQUIRE(done[id].ids.size() == 5);
  REQUIRE(done[id].reason == FinishReason::kLength);
  REQUIRE(done[id].completion_tokens == 5);
  REQUIRE(done[id].text == e->tokenizer().Decode(done[id].ids));
  REQUIRE(e->stats().kv_blocks_free == e->stats().kv_blocks_total);
}

TEST_CASE("engine: a stop string cuts the text and ends the request") {
  auto e = TinyEngine();
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 24;
  p.ignore_eos = true;
  const int64_t free_run = *e->AddRequest(Prompt(*e, "The weather today", p));
  const Done full = Drain(*e)[free_run];
  REQUIRE(full.text.size() > 6);
  // Use a piece of the unconstrained output as the stop string: the run must end right there.
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  p.stop = {stop};
  const int64_t id = *e->AddRequest(Prompt(*e, "The weather today", p));
  const Done cut = Drain(*e)[id];
  REQUIRE(cut.reason == FinishReason::kStop);
  REQUIRE(cut.text == full.text.substr(0, full.text.find(stop)));
  REQUIRE(cut.ids.size() <= full.ids.size());
  REQUIRE(std::equal(cut.ids.begin(), cut.ids.end(), full.ids.begin()));
  REQUIRE(e->stats().kv_blocks_free == e->stats().kv_blocks_total);
}

// "The river" decoded greedily by `e`, at most 12 tokens.
Done RunRiver(Engine& e, bool ignore_eos) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 12;
  p.ignore_eos = ignore_eos;
  const int64_t id = *e.AddRequest(Prompt(e, "The river", p));
  return Drain(e)[id];
}

// The tiny model's 12 greedy tokens for "The river", EOS ignored: what the EOS tests pick from.
std::vector<int32_t> GreedyRiver() {
  auto e = TinyEngine();
  return RunRiver(*e, /*ignore_eos=*/true).ids;
}

// A copy of the tiny model in a temporary directory `name` whose config.json names `eos` as its
// eos_token_id (the caller removes it).
std::filesystem::path TinyCopyWithEos(const std::string& name, int32_t eos) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "tokenizer.model"}) {
    fs::copy_file(fs::path(TinyDir()) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  std::ifstream in(fs::path(TinyDir()) / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["eos_token_id"] = eos;
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

std::unique_ptr<Engine> EngineOf(const std::filesystem::path& dir) {
  EngineOptions o;
  o.model_dir = dir.string();
  o.kv.bytes = int64_t{8} << 20;
  return *Engine::Create(o);
}

TEST_CASE("engine: EOS ends a request (token kept, no text) unless ignore_eos") {
  // Make EOS deterministic: a copy of the tiny model whose config names as eos_token_id the token
  // greedy decoding produces fourth for this prompt.
  const std::vector<int32_t> greedy = GreedyRiver();
  REQUIRE(greedy.size() == 12);
  const int32_t eos = greedy[3];
  const size_t first_eos = std::find(greedy.begin(), greedy.end(), eos) - greedy.begin();
  const std::filesystem::path dir = TinyCopyWithEos("moebatch_eos", eos);
  auto e = EngineOf(dir);
  const Done d = RunRiver(*e, /*ignore_eos=*/false);
  REQUIRE(d.reason == FinishReason::kStop);
  REQUIRE(d.ids == std::vector<int32_t>(greedy.begin(), greedy.begin() + first_eos + 1));
  REQUIRE(d.text ==
          e->tokenizer().Decode(std::vector<int32_t>(greedy.begin(), greedy.begin() + first_eos)));
  REQUIRE(RunRiver(*e, /*ignore_eos=*/true).ids == greedy);
  e.reset();
  std::filesystem::remove_all(dir);
}

TEST_CASE("engine: every eos id of generation_config.json's list ends a request") {
  // gpt-oss's generation_config.json lists three: <|return|>, <|endoftext|>, <|call|>. A copy of
  // the tiny model whose config.json names an id greedy decoding never produces, and whose
  // generation_config.json lists three ids of which only one (in turn at each place of the list)
  // is produced: the request stops at that id's first appearance.
  const std::vector<int32_t> greedy = GreedyRiver();
  REQUIRE(greedy.size() == 12);
  auto produced = [&](int32_t t) { return std::find(greedy.begin(), greedy.end(), t); };
  std::vector<int32_t> unused;  // ids greedy decoding never produces
  for (int32_t t = 3; unused.size() < 3; ++t) {
    if (produced(t) == greedy.end()) unused.push_back(t);
  }
  const std::filesystem::path dir = TinyCopyWithEos("moebatch_eos_list", unused[0]);
  const size_t stops_at[] = {2, 5, 8};  // greedy positions whose token ends the request
  for (size_t place = 0; place < 3; ++place) {
    const int32_t eos = greedy[stops_at[place]];
    const size_t first = produced(eos) - greedy.begin();
    std::vector<int32_t> list = {unused[1], unused[2]};
    list.insert(list.begin() + place, eos);
    INFO("generation_config eos_token_id " << nlohmann::json(list).dump());
    std::ofstream(dir / "generation_config.json")
        << nlohmann::json({{"bos_token_id", 1}, {"eos_token_id", list}}).dump(2);
    auto e = EngineOf(dir);
    const Done d = RunRiver(*e, /*ignore_eos=*/false);
    CHECK(d.reason == FinishReason::kStop);
    CHECK(d.ids == std::vector<int32_t>(greedy.begin(), greedy.begin() + first + 1));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("engine: the same seed gives the same tokens, alone or in a crowd") {
  auto e = TinyEngine();
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.top_k = 50;
  p.max_tokens = 20;
  p.ignore_eos = true;
  p.seed = 1234;
  const int64_t alone = *e->AddRequest(Prompt(*e, "Once upon a time", p));
  const Done a = Drain(*e)[alone];
  std::vector<int64_t> ids;
  SamplingParams other = p;
  for (int i = 0; i < 5; ++i) {
    other.seed = 99 + i;
    ids.push_back(*e->AddRequest(Prompt(*e, "Noise prompt " + std::to_string(i), other)));
  }
  const int64_t crowd = *e->AddRequest(Prompt(*e, "Once upon a time", p));
  auto all = Drain(*e);
  REQUIRE(all[crowd].ids == a.ids);
  REQUIRE(all[crowd].text == a.text);
  REQUIRE(all[ids[0]].ids != a.ids);
}

TEST_CASE("engine: Abort stops a request and frees its blocks") {
  auto e = TinyEngine();
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 200;
  p.ignore_eos = true;
  const int64_t keep = *e->AddRequest(Prompt(*e, "first", p));
  const int64_t stop = *e->AddRequest(Prompt(*e, "second", p));
  std::vector<GenerationOutput> outs;
  REQUIRE(e->Step(&outs).ok());
  REQUIRE(e->stats().kv_blocks_free < e->stats().kv_blocks_total);
  e->Abort(stop);
  e->Abort(987654);  // unknown: ignored
  outs.clear();
  REQUIRE(e->Step(&outs).ok());
  bool aborted = false;
  for (const auto& o : outs) {
    if (o.request_id == stop) {
      aborted = o.finished && o.finish_reason == FinishReason::kAborted;
    }
  }
  REQUIRE(aborted);
  auto rest = Drain(*e);
  REQUIRE(rest.count(stop) == 0);
  REQUIRE(rest[keep].reason == FinishReason::kLength);
  REQUIRE(e->stats().kv_blocks_free == e->stats().kv_blocks_total);
}

TEST_CASE("engine: bad requests are refused with the field named; the engine keeps working") {
  auto e = TinyEngine(/*kv_bytes=*/int64_t{1} << 20);  // a small cache: short max context
  auto code_and_prefix = [](const absl::Status& st, const std::string& prefix) {
    REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(st.message()).rfind(prefix, 0) == 0);
  };
  GenerationRequest empty;
  code_and_prefix(e->AddRequest(empty).status(), "prompt");
  GenerationRequest bad_id;
  bad_id.prompt_token_ids = {1, 5, 32000};
  code_and_prefix(e->AddRequest(bad_id).status(), "prompt_token_ids[2]");
  GenerationRequest too_long;
  too_long.prompt_token_ids.assign(e->max_context_tokens(), 5);
  code_and_prefix(e->AddRequest(too_long).status(), "prompt");
  GenerationRequest bad_temp;
  bad_temp.prompt_token_ids = {1, 5};
  bad_temp.sampling.temperature = -1;
  code_and_prefix(e->AddRequest(bad_temp).status(), "temperature");
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 3;
  const int64_t id = *e->AddRequest(Prompt(*e, "still fine", p));
  REQUIRE(Drain(*e)[id].completion_tokens >= 1);
}

TEST_CASE("engine: a sequence that reaches the context limit ends with length") {
  auto e = TinyEngine(/*kv_bytes=*/int64_t{1} << 20);
  const int64_t limit = e->max_context_tokens();
  REQUIRE(limit < 4096);  // the KV cache, not max_position_embeddings, is the limit here
  GenerationRequest r;
  r.prompt_token_ids.assign(limit - 3, 100);
  r.prompt_token_ids[0] = 1;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 100;
  r.sampling.ignore_eos = true;
  const int64_t id = *e->AddRequest(r);
  const Done d = Drain(*e)[id];
  REQUIRE(d.ids.size() == 3);
  REQUIRE(d.reason == FinishReason::kLength);
}

TEST_CASE("engine: automatic tokens per pass and sequences; negative values refused") {
  auto e = TinyEngine();  // the options' defaults: both automatic
  REQUIRE(e->schedule().max_tokens_per_pass == kCpuTokensPerPass);
  REQUIRE(e->schedule().max_num_seqs == kCpuTokensPerPass);
  EngineOptions o;
  o.model_dir = TinyDir();
  o.kv.bytes = int64_t{32} << 20;
  o.schedule.max_tokens_per_pass = 96;
  auto given = Engine::Create(o);
  REQUIRE(given.ok());
  REQUIRE((*given)->schedule().max_tokens_per_pass == 96);
  REQUIRE((*given)->schedule().max_num_seqs == 96);
  o.schedule.max_num_seqs = 7;
  given = Engine::Create(o);
  REQUIRE(given.ok());
  REQUIRE((*given)->schedule().max_num_seqs == 7);
  for (const char* field : {"max_num_seqs", "max_tokens_per_pass"}) {
    EngineOptions bad = o;
    (std::string(field) == "max_num_seqs" ? bad.schedule.max_num_seqs
                                          : bad.schedule.max_tokens_per_pass) = -1;
    auto refused = Engine::Create(bad);
    REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(refused.status().message()).find(field) == 0);
  }
}

TEST_CASE("engine: a model directory without a tokenizer is refused clearly") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("moebatch_notok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(fs::path(TinyDir()) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  EngineOptions o;
  o.model_dir = dir.string();
  auto e = Engine::Create(o);
  REQUIRE(e.status().code() == absl::StatusCode::kNotFound);
  REQUIRE(std::string(e.status().message())
              .find("no tokenizer in " + dir.string() + ": expected tokenizer.json") !=
          std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("engine: JSON mode keeps every reply a JSON-object prefix; EOS only once it is closed") {
  auto e = TinyEngine();
  const JsonTokenMask mask(e->tokenizer(), {e->tokenizer().eos_id()});
  // Sampled (several seeds) and greedy (which the device would otherwise pick).
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p;
    p.temperature = i == 0 ? 0.0f : 1.0f;
    if (i > 0) p.seed = 100 + i;
    p.max_tokens = 40;
    p.json_object = true;
    ids.push_back(*e->AddRequest(Prompt(*e, "Give me a JSON object about rivers", p)));
  }
  std::map<int64_t, Done> done = Drain(*e);
  for (int64_t id : ids) {
    const Done& d = done[id];
    INFO("request " << id << ": " << d.text);
    REQUIRE(!d.ids.empty());
    JsonPrefix state;
    for (int32_t t : d.ids) REQUIRE(mask.Advance(&state, t));
    if (d.reason == FinishReason::kStop) {
      REQUIRE(state.complete());
      const nlohmann::json parsed = nlohmann::json::parse(d.text, nullptr, false);
      REQUIRE(parsed.is_object());
    } else {
      REQUIRE(d.reason == FinishReason::kLength);
      REQUIRE(d.completion_tokens == 40);
    }
  }
  REQUIRE(e->stats().kv_blocks_free == e->stats().kv_blocks_total);

  // A model whose EOS is the fourth greedy token: without JSON mode it stops there; with it, EOS
  // is masked until the object is closed, so the reply goes on.
  const std::vector<int32_t> greedy = GreedyRiver();
  const std::filesystem::path dir = TinyCopyWithEos("moebatch_json_eos", greedy[3]);
  auto eos_engine = EngineOf(dir);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 12;
  p.json_object = true;
  const int64_t id = *eos_engine->AddRequest(Prompt(*eos_engine, "The river", p));
  const Done d = Drain(*eos_engine)[id];
  const JsonTokenMask eos_mask(eos_engine->tokenizer(), {greedy[3]});
  JsonPrefix state;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    if (d.ids[i] == greedy[3]) REQUIRE((i + 1 == d.ids.size() && state.complete()));
    REQUIRE(eos_mask.Advance(&state, d.ids[i]));
  }
  JsonPrefix start;
  if (!eos_mask.Advance(&start, greedy.front())) REQUIRE(d.ids.front() != greedy.front());
  REQUIRE(d.ids.size() > 4);  // past the EOS of the free reply
  eos_engine.reset();
  std::filesystem::remove_all(dir);

  // ignore_eos cannot be combined with it.
  SamplingParams bad;
  bad.json_object = true;
  bad.ignore_eos = true;
  const auto refused = e->AddRequest(Prompt(*e, "x", bad));
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(absl::StartsWith(refused.status().message(), "ignore_eos: cannot be combined"));
}
