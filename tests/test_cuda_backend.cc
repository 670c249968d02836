// The cuda backend on a GPU (label gpu; tests/gpu_catch_main.cc skips the binary without one):
//  * the golden fixtures through the Engine with --backend=cuda: greedy tokens identical to
//    transformers' with f32 weights (f32 accumulation everywhere), last logits within 2e-2
//    relative with the GPU's compute dtype (bf16 on sm_80+, f16 on sm_75);
//  * the data mover's CUDA copy engine under a concurrent load of small transfers on another
//    stream: every layer arrives intact (checksums), in order, and every small transfer too.
#include <cuda_runtime_api.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_backend.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/weight_store.h"
#include "tests/golden.h"

namespace moebatch {
namespace {

using testing::FixtureDir;
using testing::Golden;
using testing::LoadGolden;

EngineOptions CudaOptions(const std::string& dir, std::optional<DType> weight_dtype) {
  EngineOptions o;
  o.model_dir = dir;
  o.backend = EngineOptions::Backend::kCuda;
  o.weight_dtype = weight_dtype;
  o.kv_cache_bytes = int64_t{64} << 20;
  o.max_tokens_per_pass = 512;
  o.gpu_memory_bytes = int64_t{2} << 30;
  o.weight_packet_bytes = int64_t{1} << 20;  // several packets per layer even on the tiny model
  return o;
}

void CheckGreedy(const std::string& fixture) {
  const std::string dir = FixtureDir(fixture);
  const auto golden = LoadGolden(dir);
  auto engine = Engine::Create(CudaOptions(dir, DType::kF32));
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < golden.size(); ++i) {
    GenerationRequest r;
    r.prompt_token_ids = golden[i].prompt_ids;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = static_cast<int32_t>(golden[i].greedy_ids.size());
    r.sampling.ignore_eos = true;
    auto id = (*engine)->AddRequest(r);
    REQUIRE(id.ok());
    index[*id] = i;
  }
  std::vector<std::vector<int32_t>> got(golden.size());
  while ((*engine)->HasUnfinished()) {
    std::vector<GenerationOutput> outs;
    const absl::Status st = (*engine)->Step(&outs);
    INFO(st.ToString());
    REQUIRE(st.ok());
    for (const auto& o : outs) {
      auto& ids = got[index.at(o.request_id)];
      ids.insert(ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  }
  for (size_t i = 0; i < golden.size(); ++i) {
    INFO(fixture << " prompt " << i);
    REQUIRE(got[i] == golden[i].greedy_ids);
  }
}

TEST_CASE("cuda backend: greedy tokens of the golden fixtures, f32 weights", "[cuda_backend]") {
  CheckGreedy("tiny-mixtral");
  CheckGreedy("tiny-mixtral-swa");
}

TEST_CASE("cuda backend: last logits within 2e-2 in the GPU's compute dtype", "[cuda_backend]") {
  const std::string dir = FixtureDir("tiny-mixtral");
  const auto golden = LoadGolden(dir);
  auto checkpoint = Checkpoint::Load(dir);
  REQUIRE(checkpoint.ok());
  auto dtype = CudaComputeDType(0);
  REQUIRE(dtype.ok());
  WeightStoreOptions store_options;
  store_options.allocator = PinnedHostAllocator();
  store_options.dtype = *dtype;
  auto store = WeightStore::Load(**checkpoint, store_options);
  REQUIRE(store.ok());
  CudaBackendOptions options;
  options.gpu_memory_bytes = int64_t{1} << 30;
  options.max_tokens_per_pass = 256;
  auto device = CreateCudaDevice(**store, options);
  INFO(device.status().ToString());
  REQUIRE(device.ok());
  ModelRunner runner(*std::move(device));
  const ModelConfig& c = (*store)->config();
  KvCacheConfig kc{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, 64, DType::kF32};
  auto cache = PagedKvCache::Create(kc);
  REQUIRE(cache.ok());
  for (size_t i = 0; i < golden.size(); ++i) {
    const Golden& g = golden[i];
    std::vector<int32_t> table;
    for (int64_t b = 0; b < BlocksForTokens(g.prompt_ids.size(), 16); ++b) {
      table.push_back(static_cast<int32_t>(63 - b));
    }
    ForwardBatch batch;
    batch.token_ids = g.prompt_ids;
    const int64_t n = static_cast<int64_t>(g.prompt_ids.size());
    batch.seqs.push_back(ForwardSequence{&table, 0, n, n, true});
    std::vector<float> logits;
    REQUIRE(runner.Forward(batch, **cache, &logits).ok());
    REQUIRE(logits.size() == g.last_logits.size());
    double max_err = 0, max_ref = 0;
    for (size_t v = 0; v < logits.size(); ++v) {
      max_err = std::max(max_err, double(std::abs(logits[v] - g.last_logits[v])));
      max_ref = std::max(max_ref, double(std::abs(g.last_logits[v])));
    }
    INFO("prompt " << i << ": max abs error " << max_err << ", max abs " << max_ref << " ("
                   << DTypeName(*dtype) << ")");
    REQUIRE(max_err / max_ref < 2e-2);
  }
}

TEST_CASE("cuda backend: a budget too small is refused before allocating", "[cuda_backend]") {
  EngineOptions o = CudaOptions(FixtureDir("tiny-mixtral"), std::nullopt);
  o.gpu_memory_bytes = 1 << 20;
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
