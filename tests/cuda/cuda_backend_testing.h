// Helpers shared by the cuda backend's test files (test_cuda_backend.cc,
// test_cuda_backend_quant.cc): the Engine's options for the cuda backend on a fixture, a greedy
// job through an Engine, a relative logit error, and a checkpoint's weights in page-locked memory.
// Catch2's REQUIRE reports a failed load in the calling test case.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "engine/engine.h"
#include "engine/model/weight_store.h"
#include "tests/support/golden.h"

namespace moebatch::cuda_testing {

// The Engine on `dir` with --backend=cuda: weights in `weight_dtype` (nullopt: the checkpoint's),
// a 64 MiB KV cache, 512 tokens per pass, a 2 GiB GPU budget, 1 MiB packets, every layer
// streamed.
inline EngineOptions CudaOptions(const std::string& dir, std::optional<DType> weight_dtype) {
  EngineOptions o;
  o.model_dir = dir;
  o.backend = "cuda";
  o.weights.dtype = weight_dtype;
  o.kv.bytes = int64_t{64} << 20;
  o.schedule.max_tokens_per_pass = 512;
  o.gpu.memory_bytes = int64_t{2} << 30;
  o.gpu.packet_bytes = int64_t{1} << 20;  // several packets per layer even on the tiny model
  o.gpu.resident_layers = 0;              // every layer streams
  return o;
}

// Greedy tokens of `prompts` through `engine` (ignore_eos, max_tokens[i] for prompt i), in prompt
// order.
inline std::vector<std::vector<int32_t>> GreedyTokens(Engine& engine,
                                                      const std::vector<testing::Golden>& prompts,
                                                      const std::vector<int32_t>& max_tokens) {
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt_token_ids = prompts[i].prompt_ids;
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens.at(i);
    r.sampling.ignore_eos = true;
    auto id = engine.AddRequest(r);
    REQUIRE(id.ok());
    index[*id] = i;
  }
  std::vector<std::vector<int32_t>> got(prompts.size());
  while (engine.HasUnfinished()) {
    std::vector<GenerationOutput> outs;
    const absl::Status st = engine.Step(&outs);
    INFO(st.ToString());
    REQUIRE(st.ok());
    for (const auto& o : outs) {
      auto& ids = got[index.at(o.request_id)];
      ids.insert(ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  }
  return got;
}

// max |got - want| / max |want| over the vocabulary.
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double max_err = 0, max_ref = 0;
  for (size_t v = 0; v < want.size(); ++v) {
    max_err = std::max(max_err, double(std::abs(got[v] - want[v])));
    max_ref = std::max(max_ref, double(std::abs(want[v])));
  }
  return max_err / max_ref;
}

// `checkpoint`'s weights in page-locked memory, stored in `dtype`.
inline std::unique_ptr<WeightStore> PinnedStore(const Checkpoint& checkpoint, DType dtype) {
  WeightStoreOptions store_options;
  store_options.allocator = PinnedHostAllocator();
  store_options.dtype = dtype;
  auto loaded = WeightStore::Load(checkpoint, store_options);
  REQUIRE(loaded.ok());
  return *std::move(loaded);
}

}  // namespace moebatch::cuda_testing
