// The engine's plan (engine/engine_plan.h) and the backend registry (engine/backend.h), without
// loading a weight: a backend registered here by the test itself, and the cpu and cuda backends the
// program links.
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/engine_plan.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_store.h"

namespace moebatch {
namespace {

std::string FixtureDir(const std::string& name) {
  return std::string(MOEBATCH_FIXTURES_DIR) + "/" + name;
}

// A backend that streams host copies in f16, plans 300 tokens per pass and VSLPipe, and never
// creates a device: what MakeEnginePlan does with a backend's answers.
class PlanOnlyBackend final : public Backend {
 public:
  const char* name() const override { return "plan-only"; }
  bool automatic() const override { return false; }
  absl::StatusOr<std::string> Probe(const EngineOptions&) const override {
    return std::string("a test device");
  }
  absl::StatusOr<BackendPlan> Plan(const EngineOptions& options,
                                   const ModelConfig& config) const override {
    if (options.gpu.device != 0) return absl::UnavailableError("no test device 1");
    BackendPlan plan;
    plan.device = "a test device";
    plan.weight_source = WeightSource::kHostCopy;
    plan.weight_dtype = DType::kF16;
    plan.compute_dtype = DType::kF16;
    plan.max_tokens_per_pass =
        options.schedule.max_tokens_per_pass > 0 ? options.schedule.max_tokens_per_pass : 300;
    plan.vslpipe = true;
    plan.profile_token_budget = true;
    return plan;
  }
  absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const LoadedWeights&, const EngineOptions&,
                                                       const BackendPlan&, int64_t) const override {
    return absl::UnimplementedError("plan-only backend");
  }
};

const BackendRegistrar<PlanOnlyBackend> registrar;

EngineOptions TinyOptions() {
  EngineOptions o;
  o.model_dir = FixtureDir("tiny-mixtral");
  o.kv.bytes = int64_t{8} << 20;
  return o;
}

TEST_CASE("backend registry: the linked backends are registered and found by name", "[plan]") {
  std::vector<std::string> names;
  for (const Backend* b : RegisteredBackends()) names.emplace_back(b->name());
  CHECK(std::find(names.begin(), names.end(), "cpu") != names.end());
  CHECK(std::find(names.begin(), names.end(), "cuda") != names.end());
  const EngineOptions o = TinyOptions();
  auto cpu = FindBackend("cpu", o);
  REQUIRE(cpu.ok());
  CHECK(std::string((*cpu)->name()) == "cpu");
  // auto: the first automatic backend with a device; the cpu backend is automatic and always there
  // (the cuda backend is not automatic, and the test backend neither).
  auto chosen = FindBackend("auto", o);
  REQUIRE(chosen.ok());
  CHECK(std::string((*chosen)->name()) == "cpu");
  auto missing = FindBackend("tpu", o);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("'tpu'") && Catch::Contains("cpu") && Catch::Contains("plan-only"));
}

TEST_CASE("engine plan: the cpu backend's plan of the tiny model, no weight read", "[plan]") {
  const EngineOptions o = TinyOptions();
  auto plan = Engine::Plan(o);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  const ModelConfig& c = plan->config;
  CHECK(plan->backend == "cpu");
  CHECK(plan->device.weight_source == WeightSource::kMapped);
  CHECK(plan->weight_dtype == c.torch_dtype);
  CHECK(plan->weight_bytes == WeightStore::RequiredBytes(c, c.num_hidden_layers, c.torch_dtype, 1));
  CHECK(plan->schedule.max_tokens_per_pass == kCpuTokensPerPass);
  CHECK_FALSE(plan->vslpipe);
  CHECK(plan->kv.dtype == DType::kF32);  // the compute dtype's
  CHECK(plan->kv.num_blocks == (int64_t{8} << 20) / plan->kv.bytes_per_block());
  CHECK(plan->max_context_tokens ==
        std::min(c.max_position_embeddings, plan->kv.num_blocks * plan->kv.block_size));
  const std::string text = plan->ToString();
  CHECK_THAT(text, Catch::Contains("backend       cpu") && Catch::Contains("KV cache") &&
                       Catch::Contains("2048 per pass"));
}

TEST_CASE("engine plan: what the backend decides goes into the plan", "[plan]") {
  auto config = LoadModelConfig(FixtureDir("tiny-mixtral"));
  REQUIRE(config.ok());
  auto backend = FindBackend("plan-only", TinyOptions());
  REQUIRE(backend.ok());
  EngineOptions o = TinyOptions();
  auto plan = MakeEnginePlan(o, *config, **backend, HostFacts{int64_t{4} << 30});
  REQUIRE(plan.ok());
  CHECK(plan->device.weight_source == WeightSource::kHostCopy);
  CHECK(plan->weight_dtype == DType::kF16);
  CHECK(plan->weight_bytes ==
        WeightStore::RequiredBytes(*config, config->num_hidden_layers, DType::kF16));
  CHECK(plan->layer_bytes == WeightStore::LayerRegionBytes(*config, DType::kF16));
  CHECK(plan->schedule.max_tokens_per_pass == 300);
  CHECK(plan->vslpipe);
  o.schedule.vslpipe = false;  // the options win over the backend's default
  CHECK_FALSE(MakeEnginePlan(o, *config, **backend, HostFacts{})->vslpipe);

  // n_real lowers the scheduler's budget below the ceiling; the ceiling stays the backend's.
  auto profiled = MakeEnginePlan(TinyOptions(), *config, **backend, HostFacts{}, 120);
  REQUIRE(profiled.ok());
  CHECK(profiled->schedule.max_tokens_per_pass == 120);
  CHECK(profiled->device.max_tokens_per_pass == 300);
  CHECK_THAT(profiled->ToString(), Catch::Contains("n_real 120, ceiling 300"));

  // The backend's refusal is the plan's, named.
  EngineOptions other = TinyOptions();
  other.gpu.device = 1;
  auto refused = MakeEnginePlan(other, *config, **backend, HostFacts{});
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("backend plan-only: no test device 1"));
}

TEST_CASE("engine plan: the automatic KV cache is what the host memory leaves", "[plan]") {
  auto config = LoadModelConfig(FixtureDir("tiny-mixtral"));
  REQUIRE(config.ok());
  auto backend = FindBackend("plan-only", TinyOptions());
  REQUIRE(backend.ok());
  EngineOptions o = TinyOptions();
  o.kv.bytes = 0;
  const int64_t available = int64_t{3} << 30;
  auto plan = MakeEnginePlan(o, *config, **backend, HostFacts{available});
  REQUIRE(plan.ok());
  CHECK(plan->kv_automatic);
  // MemAvailable before the (copied) weights, 90% of the rest, less 1 GiB and the pass buffers.
  const int64_t expected =
      (available - plan->weight_bytes) / 10 * 9 - (int64_t{1} << 30) - plan->pass_buffer_bytes;
  CHECK(plan->kv_bytes == expected);
  CHECK(plan->kv.num_blocks == expected / plan->kv.bytes_per_block());
  // An explicit host budget: the weights, 1 GiB and the pass buffers come out of it.
  o.host_memory_bytes = int64_t{2} << 30;
  auto budget = MakeEnginePlan(o, *config, **backend, HostFacts{available});
  REQUIRE(budget.ok());
  CHECK(budget->kv_bytes ==
        (int64_t{2} << 30) - budget->weight_bytes - (int64_t{1} << 30) - budget->pass_buffer_bytes);
  // Too little memory: no block, named.
  o.host_memory_bytes = int64_t{1} << 30;
  auto starved = MakeEnginePlan(o, *config, **backend, HostFacts{});
  CHECK(starved.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(starved.status().message()), Catch::Contains("hold no KV block"));
}

TEST_CASE("engine plan: values out of range are refused naming the option", "[plan]") {
  const EngineOptions good = TinyOptions();
  struct Case {
    const char* field;
    void (*apply)(EngineOptions*);
  };
  const Case cases[] = {
      {"max_num_seqs", [](EngineOptions* o) { o->schedule.max_num_seqs = -1; }},
      {"max_tokens_per_pass", [](EngineOptions* o) { o->schedule.max_tokens_per_pass = -2; }},
      {"gpu_resident_layers", [](EngineOptions* o) { o->gpu.resident_layers = -5; }},
      {"kv_block_size", [](EngineOptions* o) { o->kv.block_size = 0; }},
      {"kv_cache_bytes", [](EngineOptions* o) { o->kv.bytes = 100; }},
      {"synthetic_layers", [](EngineOptions* o) { o->weights.synthetic_layers = -1; }},
      {"weight_dtype", [](EngineOptions* o) { o->weights.dtype = DType::kF16; }},
  };
  for (const Case& c : cases) {
    EngineOptions bad = good;
    c.apply(&bad);
    auto plan = Engine::Plan(bad);
    INFO(c.field << ": " << plan.status().ToString());
    CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(plan.status().message()), Catch::Contains(c.field));
  }
}

TEST_CASE("engine plan: synthetic layers shrink the model the plan is for", "[plan]") {
  EngineOptions o = TinyOptions();
  o.weights.source = WeightSource::kSynthetic;
  o.weights.synthetic_layers = 1;
  auto plan = Engine::Plan(o);
  REQUIRE(plan.ok());
  CHECK(plan->config.num_hidden_layers == 1);
  CHECK(plan->kv.num_layers == 1);
  CHECK(plan->weight_bytes == WeightStore::RequiredBytes(plan->config, 1, plan->weight_dtype));
}

// Sliding windows in the plan: gpt-oss's window layers get a second block table from the same
// blocks (each block as big as the larger group), a sequence's context leaves room for its
// window's blocks; every layer in a window (tiny-mixtral-swa) keeps the one table to it, so the
// context is not bounded by the cache, which must hold a window plus one block.
TEST_CASE("engine plan: sliding-window layers and their block tables", "[plan]") {
  EngineOptions o;
  o.model_dir = FixtureDir("tiny-gpt-oss");
  o.kv.bytes = int64_t{1} << 20;
  o.kv.block_size = 4;
  auto plan = Engine::Plan(o);
  REQUIRE(plan.ok());
  const KvCacheConfig& kv = plan->kv;
  CHECK(kv.num_groups() == 2);
  CHECK(kv.window == 8);
  CHECK(plan->schedule.window == 8);
  CHECK(plan->schedule.main_window == 0);
  const int64_t windowed = std::count(kv.window_layers.begin(), kv.window_layers.end(), true);
  CHECK(kv.num_layer_slots() == std::max(windowed, kv.num_layers - windowed));
  CHECK(kv.num_blocks == o.kv.bytes / kv.bytes_per_block());
  CHECK(plan->max_context_tokens == std::min<int64_t>(plan->config.max_position_embeddings,
                                                      (kv.num_blocks - 4) * 4));
  CHECK_THAT(plan->ToString(), Catch::Contains("KV window     2 of 4 layers attend the last 8"));

  o.model_dir = FixtureDir("tiny-mixtral-swa");
  plan = Engine::Plan(o);
  REQUIRE(plan.ok());
  CHECK(plan->kv.num_groups() == 1);
  CHECK(plan->schedule.main_window == 32);
  CHECK(plan->schedule.window == 0);
  CHECK(plan->max_context_tokens == plan->config.max_position_embeddings);
  // 9 blocks of 4 tokens hold a window of 32; a 10th is needed beside them.
  o.kv.bytes = 9 * plan->kv.bytes_per_block();
  auto small = Engine::Plan(o);
  CHECK(small.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(small.status().message()), Catch::Contains("kv_cache_bytes"));
  o.kv.bytes = 10 * plan->kv.bytes_per_block();
  CHECK(Engine::Plan(o).ok());
}

}  // namespace
}  // namespace moebatch
