// The cuda backend on a GPU (label gpu; tests/cuda/gpu_catch_main.cc skips the binary without one),
// and the same program on the CUDA emulator (label emulated, tests/cuda_emulation/):
//  * the golden fixtures (Mixtral's and every family's) through the Engine with --backend=cuda:
//  greedy tokens identical to
//    transformers' with f32 weights (f32 accumulation everywhere), last logits within 1e-4 of
//    transformers' with f32 weights and within 2e-2 relative in the GPU's compute dtype (bf16 on
//    sm_80+, f16 on sm_75, each against the cpu backend in the same dtype);
//  * (quantized weights: test_cuda_backend_quant.cc, the same program);
//  * a failed call mid-pass, then a pass with the right weights in every layer;
//  * the data mover's CUDA copy engine under a concurrent load of small transfers on another
//    stream: every layer arrives intact (checksums), in order, and every small transfer too.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu_attention/backend/cpu_device.h"
#include "cuda/cuda_backend.h"
#include "engine/engine.h"
#include "engine/model/family.h"
#include "engine/model/ggml_quants.h"
#include "engine/model/weight_store.h"
#include "engine/model_runner.h"
#include "engine/offload/gpu_memory_plan.h"
#include "engine/offload/pipeline_profiler.h"
#include "tests/cuda/cuda_backend_testing.h"
#include "tests/support/golden.h"

namespace moebatch {
namespace {

using cuda_testing::CudaOptions;
using cuda_testing::PinnedStore;
using cuda_testing::RelativeError;
using testing::FixtureDir;
using testing::Golden;
using testing::LoadGolden;

// resident: layers kept on the GPU (-1: as many as fit, which for the tiny model is all but the
// two that stay in the slots).
void CheckGreedy(const std::string& fixture, int64_t resident = 0) {
  const std::string dir = FixtureDir(fixture);
  const auto golden = LoadGolden(dir);
  EngineOptions options = CudaOptions(dir, DType::kF32);
  options.gpu.resident_layers = resident;
  auto engine = Engine::Create(options);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  std::vector<int32_t> max_tokens;
  for (const Golden& g : golden) max_tokens.push_back(static_cast<int32_t>(g.greedy_ids.size()));
  const auto got = cuda_testing::GreedyTokens(**engine, golden, max_tokens);
  for (size_t i = 0; i < golden.size(); ++i) {
    INFO(fixture << " prompt " << i << ", resident layers " << resident);
    REQUIRE(got[i] == golden[i].greedy_ids);
  }
}

TEST_CASE("cuda backend: greedy tokens of the golden fixtures, f32 weights",
          "[cuda_backend][f32_weights]") {
  CheckGreedy("tiny-mixtral");
  CheckGreedy("tiny-mixtral-swa");
  CheckGreedy("tiny-mixtral-hd128");  // Mixtral's head_dim 128 and 4 query heads per KV head
}

// The families beyond Mixtral (tests/fixtures/make_tiny_families.py): biases, q/k norms, clip_qkv,
// dense layers, a shared expert, unnormalised top-k, llama3 and yarn RoPE, f16 shards; DBRX's
// LayerNorm, fused tensors and p-norm routing; gpt-oss (tests/fixtures/make_tiny_gpt_oss.py):
// attention sinks in the GPU's prefill and the CPU's decode attention, sliding and full layers,
// the biased router and experts, the clamped SwiGLU, its experts in bf16 or MXFP4 (the MXFP4
// blocks decoded on the GPU in f32 are transformers' dequantized values); DeepSeek-V2 and V3
// (make_tiny_families.py): multi-head latent attention (absorbed: the GPU's prefill over the
// latent rows, the CPU's decode over the latent cache), with and without q_lora_rank, the
// greedy / group_limited_greedy / noaux_tc routers, shared experts, dense first layers.
TEST_CASE("cuda backend: greedy tokens of the families' golden fixtures, f32 weights",
          "[cuda_backend][families]") {
  const std::string fixture =
      GENERATE(as<std::string>{}, "tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3",
               "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-olmoe", "tiny-dbrx", "tiny-gpt-oss",
               "tiny-gpt-oss-mxfp4", "tiny-deepseek-v2", "tiny-deepseek-v3");
  CheckGreedy(fixture);
}

// A greedy request that asks for logprobs cannot use Device::GreedyTokens: its logits row comes
// back to the sampler. Its tokens equal the device-greedy ones and its logprobs match
// transformers' (tests/fixtures/make_logprobs_golden.py) within 1e-3 (the f32-weight logits are
// within 1e-4 relative of transformers'); n = 2 greedy choices are the same tokens.
TEST_CASE("cuda backend: logprobs take the logits path, n choices too",
          "[cuda_backend][f32_weights][logprobs]") {
  const std::string dir = FixtureDir("tiny-mixtral");
  std::ifstream in(dir + "/logprobs.jsonl");
  REQUIRE(in.good());
  std::string text;
  REQUIRE(std::getline(in, text));
  const auto ref = nlohmann::json::parse(text);
  const auto ids = ref.at("token_ids").get<std::vector<int32_t>>();
  const auto logprobs = ref.at("logprobs").get<std::vector<float>>();
  const auto top_ids = ref.at("top_ids").get<std::vector<std::vector<int32_t>>>();
  auto engine = Engine::Create(CudaOptions(dir, DType::kF32));
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  GenerationRequest r;
  r.prompt_token_ids = ref.at("prompt_token_ids").get<std::vector<int32_t>>();
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = static_cast<int32_t>(ids.size());
  r.sampling.ignore_eos = true;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 3;
  // n = 2 when the engine decodes 2 sequences per pass (n_real may be 1 on the emulator).
  const int32_t n = std::min(2, (*engine)->max_choices());
  r.sampling.n = n;
  auto with_id = (*engine)->AddRequest(r);
  INFO(with_id.status().ToString());
  REQUIRE(with_id.ok());
  const int64_t with = *with_id;
  r.sampling.logprobs = false;
  r.sampling.top_logprobs = 0;
  r.sampling.n = 1;
  auto without_id = (*engine)->AddRequest(r);
  REQUIRE(without_id.ok());
  const int64_t without = *without_id;
  std::map<std::pair<int64_t, int32_t>, std::vector<int32_t>> got;
  std::vector<TokenLogprob> lp;
  while ((*engine)->HasUnfinished()) {
    std::vector<GenerationOutput> outs;
    REQUIRE((*engine)->Step(&outs).ok());
    for (const auto& o : outs) {
      auto& v = got[{o.request_id, o.index}];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.request_id == with && o.index == 0) {
        lp.insert(lp.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      } else {
        CHECK(o.new_logprobs.size() == (o.request_id == with ? o.new_token_ids.size() : 0));
      }
    }
  }
  CHECK(got.at({without, 0}) == ids);
  CHECK(got.at({with, 0}) == ids);
  if (n == 2) CHECK(got.at({with, 1}) == ids);
  REQUIRE(lp.size() == ids.size());
  for (size_t s = 0; s < ids.size(); ++s) {
    INFO("step " << s);
    CHECK(std::abs(lp[s].logprob - logprobs[s]) <= 1e-3f);
    REQUIRE(lp[s].top.size() == 3);
    CHECK(lp[s].top[0].first == top_ids[s][0]);
  }
}

TEST_CASE("cuda backend: greedy tokens with resident layers", "[cuda_backend][f32_weights]") {
  CheckGreedy("tiny-mixtral", 1);   // layer 0 resident; 1, 2, 3 stream (odd: slots alternate)
  CheckGreedy("tiny-mixtral", -1);  // 0 and 1 resident; 2 and 3 stay in the slots
}

// The last-position logits of every golden prompt, one prompt per forward pass through `device`.
std::vector<std::vector<float>> LastLogits(std::unique_ptr<Device> device,
                                           const std::vector<Golden>& golden) {
  ModelRunner runner(std::move(device));
  const ModelConfig& c = runner.config();
  const KvCacheConfig kc = KvCacheConfigFor(c, c.num_hidden_layers, 16, 64, DType::kF32);
  auto cache = PagedKvCache::Create(kc);
  REQUIRE(cache.ok());
  std::vector<std::vector<float>> out;
  for (const Golden& g : golden) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b < BlocksForTokens(g.prompt_ids.size(), 16); ++b) {
      table.push_back(static_cast<int32_t>(63 - b));
    }
    ForwardBatch batch;
    batch.token_ids = g.prompt_ids;
    const int64_t n = static_cast<int64_t>(g.prompt_ids.size());
    batch.seqs.push_back(ForwardSequence{&table, 0, n, n, true});
    std::vector<float> logits;
    const absl::Status st = runner.Forward(batch, **cache, &logits);
    INFO(st.ToString());
    REQUIRE(st.ok());
    REQUIRE(logits.size() == g.last_logits.size());
    out.push_back(std::move(logits));
  }
  return out;
}

// The same from the cpu backend (batch-invariant) computing in `dtype`.
std::vector<std::vector<float>> CpuLastLogits(const ModelConfig& config,
                                              const ModelWeights& weights, DType dtype,
                                              const std::vector<Golden>& golden) {
  auto cpu = CpuDevice::Create(config, weights, CpuDeviceOptions{dtype, int64_t{1} << 30, true});
  INFO(cpu.status().ToString());
  REQUIRE(cpu.ok());
  return LastLogits(*std::move(cpu), golden);
}

// The cuda backend over `checkpoint` with weights (and so compute) in `dtype`.
std::unique_ptr<Device> CudaOver(const Checkpoint& checkpoint, DType dtype,
                                 std::unique_ptr<WeightStore>* store, int64_t resident = 0) {
  *store = PinnedStore(checkpoint, dtype);
  CudaBackendOptions options;
  options.gpu_memory_bytes = int64_t{1} << 30;
  options.max_tokens_per_pass = 256;
  options.resident_layers = resident;
  auto device = CreateCudaDevice(**store, options);
  INFO(device.status().ToString());
  REQUIRE(device.ok());
  return *std::move(device);
}

// Last logits of `fixture`'s golden prompts with f32 weights, `resident` layers kept on the GPU,
// within 1e-4 of transformers'.
void CheckLastLogitsF32(const std::string& fixture, int64_t resident) {
  const std::string dir = FixtureDir(fixture);
  const auto golden = LoadGolden(dir);
  auto checkpoint = Checkpoint::Load(dir);
  REQUIRE(checkpoint.ok());
  std::unique_ptr<WeightStore> store;
  const auto got = LastLogits(CudaOver(**checkpoint, DType::kF32, &store, resident), golden);
  for (size_t i = 0; i < golden.size(); ++i) {
    const double err = RelativeError(got[i], golden[i].last_logits);
    INFO(fixture << " prompt " << i << ", resident layers " << resident << ": relative error "
                 << err);
    REQUIRE(err < 1e-4);
  }
}

TEST_CASE("cuda backend: last logits with f32 weights within 1e-4 of transformers'",
          "[cuda_backend][f32_weights]") {
  for (const char* fixture : {"tiny-mixtral", "tiny-mixtral-swa", "tiny-mixtral-hd128"}) {
    for (int64_t resident : {0, 1}) CheckLastLogitsF32(fixture, resident);
  }
}

// The families with f32 weights: the same math on every GPU generation, so the sm_75 run of this
// program (tests/cuda_emulation) leaves out this tag.
TEST_CASE("cuda backend: the families' last logits with f32 weights within 1e-4 of transformers'",
          "[cuda_backend][families]") {
  for (const char* fixture :
       {"tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-qwen2-moe",
        "tiny-qwen3-moe", "tiny-olmoe", "tiny-dbrx", "tiny-gpt-oss", "tiny-gpt-oss-mxfp4",
        "tiny-deepseek-v2", "tiny-deepseek-v3"}) {
    CheckLastLogitsF32(fixture, 0);
  }
}

// The compute dtype rounds activations (GEMM inputs) as the cpu backend's bf16 and f16 modes do,
// at the same points; transformers' f32 logits are no reference there: the fixtures' router has
// near-ties (2nd vs 3rd expert ~3e-5 apart, tests/fixtures/README.md) that bf16 rounding flips,
// which moves the cpu backend's own bf16 logits up to 0.29 from transformers'. f16's finer
// rounding flips them too: on the CUDA emulator, the f16 path was 0.025 and 0.050 from
// transformers' f32 logits on tiny-mixtral prompts 3 and 4 (the others within 7e-3). So each
// dtype is checked against the cpu backend in the same dtype, over weights stored in it (two
// summation orders of the cpu backend, batch-invariant vs oneDNN, differ by < 6e-3 in bf16).
TEST_CASE("cuda backend: last logits within 2e-2 in the GPU's compute dtype", "[cuda_backend]") {
  auto dtype = CudaComputeDType(0);
  REQUIRE(dtype.ok());
  for (const char* fixture : {"tiny-mixtral", "tiny-mixtral-swa", "tiny-mixtral-hd128",
                              "tiny-qwen2-moe", "tiny-olmoe", "tiny-gpt-oss", "tiny-deepseek-v3"}) {
    const std::string dir = FixtureDir(fixture);
    const auto golden = LoadGolden(dir);
    auto checkpoint = Checkpoint::Load(dir);
    REQUIRE(checkpoint.ok());
    std::unique_ptr<WeightStore> store;
    const auto got = LastLogits(CudaOver(**checkpoint, *dtype, &store), golden);
    // The cpu backend reads the cuda backend's weight store: the same weights in the same dtype
    // (f16 ones converted from the checkpoint's bf16 at load).
    const auto want = CpuLastLogits(store->config(), store->weights(), *dtype, golden);
    for (size_t i = 0; i < golden.size(); ++i) {
      const double err = RelativeError(got[i], want[i]);
      INFO(fixture << " prompt " << i << ": relative error " << err << " (" << DTypeName(*dtype)
                   << ", against the cpu backend in the same dtype)");
      REQUIRE(err < 2e-2);
    }
  }
}

TEST_CASE("cuda backend: the profiler's timed passes copy no weights", "[cuda_backend]") {
  auto checkpoint = Checkpoint::Load(FixtureDir("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const std::unique_ptr<WeightStore> store = PinnedStore(**checkpoint, DType::kF32);
  auto one_layer = WeightStore::View(*store, 1);
  REQUIRE(one_layer.ok());
  CudaBackendOptions options;
  options.gpu_memory_bytes = int64_t{1} << 30;
  options.max_tokens_per_pass = 64;
  auto device = CreateCudaDevice(**one_layer, options);
  INFO(device.status().ToString());
  REQUIRE(device.ok());
  auto points = MeasureLayerTimes(**device, {16, 64}, 2);
  INFO(points.status().ToString());
  REQUIRE(points.ok());
  CHECK(points->size() == 2);
  const DeviceCounters moved = (*device)->counters();
  CHECK(moved.weight_fills == 1);  // 2 token counts x (1 warm-up + 2 timed) passes, one fill
  CHECK(moved.weight_bytes == static_cast<int64_t>((*one_layer)->max_layer_bytes()));
}

TEST_CASE("cuda backend: a call that fails mid-pass leaves the device usable", "[cuda_backend]") {
  const std::string dir = FixtureDir("tiny-mixtral");
  const auto golden = LoadGolden(dir);
  auto checkpoint = Checkpoint::Load(dir);
  REQUIRE(checkpoint.ok());
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<Device> device = CudaOver(**checkpoint, DType::kF32, &store);
  Device* d = device.get();
  const ModelConfig& c = d->config();
  REQUIRE(c.num_hidden_layers >= 3);
  const std::vector<Golden> one(golden.begin() + 1, golden.begin() + 2);
  // Half a pass, then layer 2 while layers 0 and 1 hold both weight slots: refused.
  const std::vector<int32_t>& ids = one[0].prompt_ids;
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = i;
  std::vector<float> q(n * c.q_size()), k(n * c.kv_size()), v(n * c.kv_size());
  std::vector<float> attn(n * c.q_size(), 0.5f);
  d->BeginPass(1);
  REQUIRE(d->Embed(0, ids.data(), positions.data(), n).ok());
  REQUIRE(d->TaskA(0, 0, q.data(), k.data(), v.data(), nullptr).ok());
  REQUIRE(d->TaskB(0, 2, attn.data(), nullptr).code() == absl::StatusCode::kFailedPrecondition);
  // The next pass starts over: every layer's weights are right again (transformers' logits).
  const auto got = LastLogits(std::move(device), one);
  const double err = RelativeError(got[0], one[0].last_logits);
  INFO("relative error " << err);
  REQUIRE(err < 1e-4);
}

// The model runner puts the prefill segments last in a micro-batch; device.h allows them anywhere.
// Here a golden prompt is a segment between two one-token sequences that the "CPU" (this test)
// attends: task A applies the segment's attention itself, task B projects the rows before and
// after it. A one-token sequence at position 0 attends only to itself: its attention output is its
// own v, per query head through GQA.
TEST_CASE("cuda backend: prefill segments between rows the CPU attends", "[cuda_backend]") {
  const std::string dir = FixtureDir("tiny-mixtral");
  const auto golden = LoadGolden(dir);
  auto checkpoint = Checkpoint::Load(dir);
  REQUIRE(checkpoint.ok());
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<Device> device = CudaOver(**checkpoint, DType::kF32, &store);
  const ModelConfig& c = device->config();
  const Golden& g = golden[1];
  const int64_t n = static_cast<int64_t>(g.prompt_ids.size()), tokens = n + 2;
  const int32_t first_token = 7, last_token = 11;
  std::vector<int32_t> ids = {first_token};
  ids.insert(ids.end(), g.prompt_ids.begin(), g.prompt_ids.end());
  ids.push_back(last_token);
  std::vector<int64_t> positions(tokens, 0);
  for (int64_t i = 0; i < n; ++i) positions[1 + i] = i;
  const int32_t cu_rows[2] = {1, static_cast<int32_t>(1 + n)};
  std::vector<float> q(tokens * c.q_size()), k(tokens * c.kv_size()), v(tokens * c.kv_size());
  std::vector<float> attn(tokens * c.q_size(), std::nanf(""));  // the segment's rows stay NaN
  const int64_t group = c.num_attention_heads / c.num_key_value_heads;
  device->BeginPass(1);
  REQUIRE(device->Embed(0, ids.data(), positions.data(), tokens).ok());
  REQUIRE(device->SetPrefillSegments(0, cu_rows, 1).ok());
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    REQUIRE(device->TaskA(0, layer, q.data(), k.data(), v.data(), attn.data()).ok());
    for (int64_t row : {int64_t{0}, tokens - 1}) {
      for (int64_t h = 0; h < c.num_attention_heads; ++h) {
        std::memcpy(&attn[(row * c.num_attention_heads + h) * c.head_dim],
                    &v[(row * c.num_key_value_heads + h / group) * c.head_dim],
                    c.head_dim * sizeof(float));
      }
    }
    REQUIRE(device->TaskB(0, layer, attn.data(), nullptr).ok());
  }
  const int64_t rows[3] = {0, n, tokens - 1};
  std::vector<float> logits(3 * c.vocab_size);
  REQUIRE(device->Logits(0, rows, 3, logits.data()).ok());
  auto row = [&](int i) {
    return std::vector<float>(logits.begin() + i * c.vocab_size,
                              logits.begin() + (i + 1) * c.vocab_size);
  };
  // The segment: transformers' last logits. The one-token sequences: the cpu backend's (f32).
  REQUIRE(RelativeError(row(1), g.last_logits) < 1e-4);
  std::vector<Golden> singles(2);
  singles[0].prompt_ids = {first_token};
  singles[1].prompt_ids = {last_token};
  for (Golden& s : singles) s.last_logits.resize(c.vocab_size);
  const auto want =
      CpuLastLogits((*checkpoint)->config(), (*checkpoint)->weights(), DType::kF32, singles);
  REQUIRE(RelativeError(row(0), want[0]) < 1e-4);
  REQUIRE(RelativeError(row(2), want[1]) < 1e-4);
}

TEST_CASE("cuda backend: a MOEBATCH_CUDA_GUARD_BYTES outside its range is refused",
          "[cuda_backend]") {
  auto checkpoint = Checkpoint::Load(FixtureDir("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const std::unique_ptr<WeightStore> store = PinnedStore(**checkpoint, DType::kF32);
  CudaBackendOptions options;
  options.gpu_memory_bytes = int64_t{1} << 30;
  options.max_tokens_per_pass = 64;
  for (const char* bad : {"-1", "2000000", "lots"}) {
    setenv("MOEBATCH_CUDA_GUARD_BYTES", bad, 1);
    auto device = CreateCudaDevice(*store, options);
    REQUIRE_FALSE(device.ok());
    CHECK(device.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(device.status().message()),
               Catch::Contains(std::string("MOEBATCH_CUDA_GUARD_BYTES=") + bad));
  }
  setenv("MOEBATCH_CUDA_GUARD_BYTES", "256", 1);  // as tests/cuda/gpu_catch_main.cc set it
  CHECK(CreateCudaDevice(*store, options).ok());
}

TEST_CASE("cuda backend: a budget too small is refused before allocating", "[cuda_backend]") {
  EngineOptions o = CudaOptions(FixtureDir("tiny-mixtral"), std::nullopt);
  o.gpu.memory_bytes = 1 << 20;
  auto engine = Engine::Create(o);
  REQUIRE(engine.status().code() == absl::StatusCode::kResourceExhausted);
}

uint64_t Checksum(const std::byte* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint64_t>(p[i])) * 1099511628211ull;
  return h;
}

TEST_CASE("data mover on the GPU: layers intact and in order under small transfers",
          "[cuda_backend][data_mover]") {
  const size_t slot_bytes = size_t{32} << 20;
  const int layers = 8;
  HostAllocator* pinned = PinnedHostAllocator();
  REQUIRE(pinned != nullptr);
  std::vector<std::byte*> host(layers);
  std::vector<uint64_t> sums(layers);
  std::mt19937_64 rng(5);
  for (int l = 0; l < layers; ++l) {
    auto p = pinned->Allocate(slot_bytes);
    REQUIRE(p.ok());
    host[l] = *p;
    auto* words = reinterpret_cast<uint64_t*>(host[l]);
    for (size_t i = 0; i < slot_bytes / 8; ++i) words[i] = rng();
    sums[l] = Checksum(host[l], slot_bytes);
  }
  std::byte* slots[2];
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&slots[0]), slot_bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&slots[1]), slot_bytes) == cudaSuccess);
  cudaStream_t consumer, small;
  REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&small, cudaStreamNonBlocking) == cudaSuccess);
  auto engine = CreateCudaCopyEngine(0, {slots[0], slots[1]}, slot_bytes, consumer);
  REQUIRE(engine.ok());

  // The small, latency-critical transfers of the pipeline: 64 KiB up and back, checked.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> small_ok{0}, small_bad{0};
  std::thread load([&] {
    cudaSetDevice(0);
    const size_t n = size_t{64} << 10;
    auto up = pinned->Allocate(n), down = pinned->Allocate(n);
    std::byte* dev = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&dev), n);
    uint64_t x = 1;
    while (!stop.load()) {
      for (size_t i = 0; i < n; ++i) (*up)[i] = static_cast<std::byte>((x + i) & 0xff);
      cudaMemcpyAsync(dev, *up, n, cudaMemcpyHostToDevice, small);
      cudaMemcpyAsync(*down, dev, n, cudaMemcpyDeviceToHost, small);
      cudaStreamSynchronize(small);
      (std::memcmp(*up, *down, n) == 0 ? small_ok : small_bad)++;
      ++x;
    }
    cudaFree(dev);
    pinned->Free(*up, n);
    pinned->Free(*down, n);
  });

  std::vector<std::byte> back(slot_bytes);
  {
    DataMover mover(engine->get(), size_t{4} << 20);
    std::vector<uint64_t> tickets;
    for (int l = 0; l < layers; ++l) {
      auto t = mover.Enqueue(l % 2, host[l], slot_bytes, l);
      REQUIRE(t.ok());
      tickets.push_back(*t);
    }
    for (int l = 0; l < layers; ++l) {
      INFO("layer " << l);
      REQUIRE(mover.Wait(tickets[l]).ok());
      // The consumer reads the slot on its stream, then releases it.
      REQUIRE(cudaMemcpyAsync(back.data(), slots[l % 2], slot_bytes, cudaMemcpyDeviceToHost,
                              consumer) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
      REQUIRE(Checksum(back.data(), slot_bytes) == sums[l]);
      mover.Release(l % 2);
    }
    const DataMoverStats s = mover.stats();
    REQUIRE(s.fills == layers);
    REQUIRE(s.packets == layers * 8);
    WARN("data mover: " << s.bytes / s.busy_seconds / 1e9 << " GB/s while small transfers ran");
  }
  stop = true;
  load.join();
  REQUIRE(small_bad == 0);
  REQUIRE(small_ok > 0);
  engine->reset();
  cudaStreamDestroy(consumer);
  cudaStreamDestroy(small);
  cudaFree(slots[0]);
  cudaFree(slots[1]);
  for (std::byte* p : host) pinned->Free(p, slot_bytes);
}

}  // namespace
}  // namespace moebatch
