// VSLPipe (engine/model_runner.h, MoE-Lens §6.4) on the cpu backend: the plain pass's logits and KV
// cache (within f32 rounding), the task order of Fig. 9, and the same greedy tokens end to end.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu_attention/backend/cpu_device.h"
#include "engine/engine.h"
#include "engine/model/checkpoint.h"
#include "engine/model_runner.h"
#include "engine/pipeline_trace.h"
#include "tests/support/mixed_passes.h"

namespace moebatch {
namespace {

std::string Fixture(const std::string& name) {
  return std::string(MOEBATCH_FIXTURES_DIR) + "/" + name;
}

// A CpuDevice that records the order of the calls it serves.
class RecordingDevice final : public Device {
 public:
  explicit RecordingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  const ModelConfig& config() const override { return inner_->config(); }
  void BeginPass(int micro_batches) override {
    Log("pass " + std::to_string(micro_batches));
    inner_->BeginPass(micro_batches);
  }
  absl::Status Embed(int mb, const int32_t* ids, const int64_t* pos, int64_t tokens) override {
    Log("E" + std::to_string(mb));
    return inner_->Embed(mb, ids, pos, tokens);
  }
  absl::Status TaskA(int mb, int64_t layer, float* q, float* k, float* v, float* attn) override {
    Log("A" + std::to_string(layer) + "." + std::to_string(mb));
    return inner_->TaskA(mb, layer, q, k, v, attn);
  }
  absl::Status TaskB(int mb, int64_t layer, const float* attn, ForwardStats* stats) override {
    Log("B" + std::to_string(layer) + "." + std::to_string(mb));
    return inner_->TaskB(mb, layer, attn, stats);
  }
  absl::Status Logits(int mb, const int64_t* rows, int64_t n, float* logits) override {
    Log("L" + std::to_string(mb));
    return inner_->Logits(mb, rows, n, logits);
  }
  std::vector<std::string> calls;

 private:
  void Log(std::string s) {
    std::lock_guard<std::mutex> lock(mu_);
    calls.push_back(std::move(s));
  }
  std::unique_ptr<Device> inner_;
  std::mutex mu_;
};

struct Pass {
  std::vector<float> logits;
  std::vector<std::byte> cache;  // every byte of the KV cache after the pass
  std::vector<std::string> calls;
  int micro_batches = 0;
};

// A mixed pass on tiny-mixtral (tests/support/mixed_passes.h's second pass: two prefill chunks, one
// continuing an earlier chunk, and three decode tokens) after the first pass that filled the
// earlier context.
Pass RunMixed(const Checkpoint& checkpoint, bool vslpipe) {
  const ModelConfig& c = checkpoint.config();
  auto cpu = CpuDevice::Create(c, checkpoint.weights(), CpuDeviceOptions{DType::kF32});
  REQUIRE(cpu.ok());
  auto recording = std::make_unique<RecordingDevice>(*std::move(cpu));
  RecordingDevice* rec = recording.get();
  ModelRunner runner(std::move(recording), ModelRunnerOptions{vslpipe});
  KvCacheConfig kc{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, 32, DType::kF32};
  auto cache = PagedKvCache::Create(kc);
  REQUIRE(cache.ok());
  const auto passes = testing::MakeMixedPasses(c.vocab_size);
  std::vector<float> logits;
  REQUIRE(runner.Forward(passes->first, **cache, &logits).ok());
  const ForwardBatch& second = passes->second;
  rec->calls.clear();
  Pass out;
  REQUIRE(runner.Forward(second, **cache, &out.logits).ok());
  out.micro_batches = runner.last_micro_batches();
  out.calls = rec->calls;
  const std::byte* base = (*cache)->LayerBase(0);
  out.cache.assign(base, base + (*cache)->total_bytes());
  return out;
}

TEST_CASE("VSLPipe: the plain pass's logits and KV cache, within f32 rounding", "[vslpipe]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const Pass plain = RunMixed(**checkpoint, false);
  const Pass piped = RunMixed(**checkpoint, true);
  REQUIRE(plain.micro_batches == 1);
  REQUIRE(piped.micro_batches == 2);
  REQUIRE(piped.logits.size() == plain.logits.size());
  REQUIRE(piped.logits.size() == 5 * 32000);
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < plain.logits.size(); ++i) {
    max_err = std::max(max_err, double(std::abs(piped.logits[i] - plain.logits[i])));
    max_ref = std::max(max_ref, double(std::abs(plain.logits[i])));
  }
  INFO("max abs difference " << max_err << " of max " << max_ref);
  REQUIRE(max_err <= 1e-5 * max_ref);
  // K/V of a token depend on its own row only, up to the GEMM's summation order, which oneDNN may
  // choose by the number of rows (a micro-batch has fewer): equal within f32 rounding.
  REQUIRE(piped.cache.size() == plain.cache.size());
  const auto* a = reinterpret_cast<const float*>(piped.cache.data());
  const auto* b = reinterpret_cast<const float*>(plain.cache.data());
  double kv_err = 0, kv_ref = 0;
  size_t nonzero = 0;
  for (size_t i = 0; i < plain.cache.size() / sizeof(float); ++i) {
    kv_err = std::max(kv_err, double(std::abs(a[i] - b[i])));
    kv_ref = std::max(kv_ref, double(std::abs(b[i])));
    nonzero += b[i] != 0.0f;
  }
  INFO("KV cache: max abs difference " << kv_err << " of max " << kv_ref);
  REQUIRE(nonzero > 0);
  REQUIRE(kv_err <= 1e-5 * kv_ref);
}

TEST_CASE("VSLPipe: the device sees the prologue, stages and epilogue of Fig. 9", "[vslpipe]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const int64_t n = (*checkpoint)->config().num_hidden_layers;
  const Pass piped = RunMixed(**checkpoint, true);
  std::vector<std::string> want = {"pass 2", "E0", "E1", "A0.0", "A0.1"};
  for (int64_t i = 0; i + 1 < n; ++i) {
    const std::string l = std::to_string(i), next = std::to_string(i + 1);
    for (const std::string& s :
         {"B" + l + ".0", "A" + next + ".0", "B" + l + ".1", "A" + next + ".1"}) {
      want.push_back(s);
    }
  }
  want.push_back("B" + std::to_string(n - 1) + ".0");
  want.push_back("B" + std::to_string(n - 1) + ".1");
  want.push_back("L0");
  want.push_back("L1");
  REQUIRE(piped.calls == want);

  const Pass plain = RunMixed(**checkpoint, false);
  REQUIRE(plain.calls.front() == "pass 1");
  REQUIRE(plain.calls[2] == "A0.0");
  REQUIRE(plain.calls[3] == "B0.0");
}

TEST_CASE("model runner: greedy rows get their logits' argmax, the others their logits",
          "[vslpipe]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  const int64_t vocab = c.vocab_size;
  for (bool vslpipe : {false, true}) {
    INFO("vslpipe " << vslpipe);
    auto cpu = CpuDevice::Create(c, (*checkpoint)->weights(), CpuDeviceOptions{DType::kF32});
    REQUIRE(cpu.ok());
    ModelRunner runner(*std::move(cpu), ModelRunnerOptions{vslpipe});
    KvCacheConfig kc{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, 32, DType::kF32};
    auto cache = PagedKvCache::Create(kc);
    REQUIRE(cache.ok());
    const auto passes = testing::MakeMixedPasses(vocab);
    std::vector<float> all;
    REQUIRE(runner.Forward(passes->first, **cache, &all).ok());
    // The second pass twice over the same cache (it rewrites the same K/V): all logits, then
    // sequences 0, 2 and 4 greedy (a decode token, a continued chunk, a whole prompt).
    REQUIRE(runner.Forward(passes->second, **cache, &all).ok());
    REQUIRE(all.size() == 5 * static_cast<size_t>(vocab));
    ForwardBatch mixed = passes->second;
    for (int s : {0, 2, 4}) mixed.seqs[s].greedy = true;
    std::vector<float> rest;
    REQUIRE(runner.Forward(mixed, **cache, &rest).code() == absl::StatusCode::kInvalidArgument);
    std::vector<int32_t> greedy;
    REQUIRE(runner.Forward(mixed, **cache, &rest, nullptr, &greedy).ok());
    REQUIRE(runner.last_micro_batches() == (vslpipe ? 2 : 1));
    REQUIRE(greedy.size() == 3);
    REQUIRE(rest.size() == 2 * static_cast<size_t>(vocab));
    const int greedy_seqs[] = {0, 2, 4}, sampled_seqs[] = {1, 3};
    for (int j = 0; j < 3; ++j) {
      const float* row = all.data() + greedy_seqs[j] * vocab;
      REQUIRE(greedy[j] == std::max_element(row, row + vocab) - row);
    }
    for (int j = 0; j < 2; ++j) {
      REQUIRE(std::equal(rest.begin() + j * vocab, rest.begin() + (j + 1) * vocab,
                         all.begin() + sampled_seqs[j] * vocab));
    }
  }
}

TEST_CASE("VSLPipe: golden greedy tokens with the pipeline off and on", "[vslpipe]") {
  // Several requests at once, so passes hold two micro-batches; the pipeline must not change a
  // token. (tests/engine/test_golden.cc checks the tokens against transformers with the default,
  // on.)
  EngineOptions options;
  options.model_dir = Fixture("tiny-mixtral");
  options.kv.bytes = int64_t{16} << 20;
  auto run = [&](bool vslpipe) {
    options.schedule.vslpipe = vslpipe;
    auto engine = Engine::Create(options);
    REQUIRE(engine.ok());
    std::vector<std::vector<int32_t>> out(6);
    std::vector<int64_t> ids;
    for (int r = 0; r < 6; ++r) {
      GenerationRequest request;
      for (int i = 0; i < 5 + 7 * r; ++i) request.prompt_token_ids.push_back(100 + 13 * i + r);
      request.sampling.temperature = 0.0f;
      request.sampling.max_tokens = 12;
      request.sampling.ignore_eos = true;
      ids.push_back(*(*engine)->AddRequest(request));
    }
    while ((*engine)->HasUnfinished()) {
      std::vector<GenerationOutput> step;
      REQUIRE((*engine)->Step(&step).ok());
      for (const auto& g : step) {
        const size_t r = static_cast<size_t>(g.request_id - ids.front());
        out[r].insert(out[r].end(), g.new_token_ids.begin(), g.new_token_ids.end());
      }
    }
    return out;
  };
  const auto off = run(false);
  const auto on = run(true);
  for (const auto& tokens : off) REQUIRE(tokens.size() == 12);
  REQUIRE(on == off);
}

// The trace's pass events also carry each pass's roofline.
TEST_CASE("VSLPipe: the Chrome trace shows device and CPU work overlapping", "[vslpipe]") {
  const std::string path = "/tmp/moebatch_test_trace_" + std::to_string(getpid()) + ".json";
  EngineOptions options;
  options.model_dir = Fixture("tiny-mixtral");
  options.kv.bytes = int64_t{16} << 20;
  options.metrics.trace_file = path;
  options.schedule.vslpipe = true;  // the cpu backend's default is off
  EngineStats stats;
  {
    auto engine = Engine::Create(options);
    REQUIRE(engine.ok());
    for (int r = 0; r < 8; ++r) {
      GenerationRequest request;
      for (int i = 0; i < 40 + r; ++i) request.prompt_token_ids.push_back(200 + 7 * i + r);
      request.sampling.temperature = 0.0f;
      request.sampling.max_tokens = 4;
      request.sampling.ignore_eos = true;
      REQUIRE((*engine)->AddRequest(request).ok());
    }
    while ((*engine)->HasUnfinished()) {
      std::vector<GenerationOutput> step;
      REQUIRE((*engine)->Step(&step).ok());
    }
    stats = (*engine)->stats();
  }  // the trace is written here
  REQUIRE(stats.device_seconds > 0);
  REQUIRE(stats.cpu_attention_seconds > 0);
  REQUIRE(stats.expert_token_pairs > 0);
  REQUIRE(stats.last_pass.micro_batches == 2);
  REQUIRE(stats.weight_bytes == 0);  // the cpu backend moves no weights
  REQUIRE(stats.activated_bytes > 0);
  REQUIRE(stats.sparse_flops > 0);
  REQUIRE(stats.last_utilization.bytes_per_second > 0);
  REQUIRE(stats.last_utilization.s_mbu == 0);  // no peak given

  std::ifstream in(path);
  REQUIRE(in.good());
  const auto doc = nlohmann::json::parse(in);
  std::remove(path.c_str());
  struct Span {
    int64_t start, end;
  };
  std::vector<Span> device, cpu;
  int passes = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const Span s{e.at("ts").get<int64_t>(), e.at("ts").get<int64_t>() + e.at("dur").get<int64_t>()};
    const int row = e.at("tid").get<int>();
    if (row == PipelineTrace::kDeviceRow) device.push_back(s);
    if (row == PipelineTrace::kCpuRow) cpu.push_back(s);
    if (row == PipelineTrace::kPassRow) {
      ++passes;
      // Its roofline (engine/plan/cpu_roofline.h), against the host's measured ceilings.
      const auto& args = e.at("args");
      INFO(args.dump());
      CHECK(args.at("weight_MB").get<double>() > 0);
      CHECK(args.at("kv_MB").get<double>() > 0);
      CHECK(args.at("GFLOP").get<double>() > 0);
      const double memory = args.at("memory_bound_ms"), compute = args.at("compute_bound_ms");
      CHECK(memory > 0);
      CHECK(compute > 0);
      CHECK(args.at("bound_ms").get<double>() == std::max(memory, compute));
      CHECK(args.at("bound") == (memory >= compute ? "memory" : "compute"));
      CHECK(args.at("of_bound").get<double>() > 0);
    }
  }
  REQUIRE(passes == stats.passes);
  REQUIRE(!device.empty());
  REQUIRE(!cpu.empty());
  // Some CPU task ran while a device call ran (the phases of Fig. 9).
  bool overlap = false;
  for (const Span& c : cpu) {
    for (const Span& d : device) overlap |= c.start < d.end && d.start < c.end;
  }
  REQUIRE(overlap);
}

}  // namespace
}  // namespace moebatch
