// engine/model/weight_store.h: per-layer host regions against the checkpoint they came from, the
// budget check, synthetic weights, and the cpu backend running from a store.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu_attention/backend/cpu_device.h"
#include "cpu_attention/gemm/quant_linear.h"
#include "cpu_attention/runtime/cpu_isa.h"
#include "cuda/device_probe.h"
#include "engine/engine.h"
#include "engine/model/checkpoint.h"
#include "engine/model/ggml_quants.h"
#include "engine/model/weight_store.h"
#include "engine/model_runner.h"

namespace moebatch {
namespace {

std::string Fixture(const std::string& name) {
  return std::string(MOEBATCH_FIXTURES_DIR) + "/" + name;
}

// A real allocator (the pageable one) that counts what it hands out.
class CountingAllocator final : public HostAllocator {
 public:
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    auto p = PageableHostAllocator().Allocate(bytes);
    if (p.ok()) {
      ++live;
      live_bytes += bytes;
      REQUIRE(reinterpret_cast<uintptr_t>(*p) % 4096 == 0);
    }
    return p;
  }
  void Free(std::byte* data, size_t bytes) override {
    --live;
    live_bytes -= bytes;
    PageableHostAllocator().Free(data, bytes);
  }
  const char* name() const override { return "counting"; }
  std::atomic<int> live{0};
  std::atomic<int64_t> live_bytes{0};
};

// One prompt through `runner` (a fresh cache, blocks 5, 2, 7): the last logits.
absl::Status ForwardPrompt(ModelRunner& runner, const std::vector<int32_t>& prompt,
                           std::vector<float>* logits) {
  const ModelConfig& c = runner.config();
  KvCacheConfig kc{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, 8, DType::kF32};
  auto cache = PagedKvCache::Create(kc);
  REQUIRE(cache.ok());
  std::vector<int32_t> table = {5, 2, 7};
  ForwardBatch batch;
  batch.token_ids = prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  batch.seqs.push_back(ForwardSequence{&table, 0, n, n, true});
  return runner.Forward(batch, **cache, logits);
}

// Runs one prompt through ModelRunner + CpuDevice over `weights` and returns the last logits.
std::vector<float> LastLogits(const ModelConfig& c, const ModelWeights& weights,
                              const std::vector<int32_t>& prompt) {
  auto device = CpuDevice::Create(c, weights, CpuDeviceOptions{DType::kF32});
  REQUIRE(device.ok());
  ModelRunner runner(*std::move(device));
  std::vector<float> logits;
  REQUIRE(ForwardPrompt(runner, prompt, &logits).ok());
  return logits;
}

// Always fails: what a host without enough (page-lockable) memory does.
class FailingAllocator final : public HostAllocator {
 public:
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    return absl::ResourceExhaustedError("no memory here");
  }
  void Free(std::byte* data, size_t bytes) override {}
  const char* name() const override { return "failing"; }
};

// A CpuDevice whose host buffers come from `allocator` (as the cuda backend's are page-locked).
class AllocatorDevice final : public Device {
 public:
  AllocatorDevice(std::unique_ptr<Device> inner, HostAllocator* allocator)
      : inner_(std::move(inner)), allocator_(allocator) {}
  const char* name() const override { return inner_->name(); }
  const ModelConfig& config() const override { return inner_->config(); }
  void BeginPass(int micro_batches) override { inner_->BeginPass(micro_batches); }
  absl::Status Embed(int mb, const int32_t* ids, const int64_t* pos, int64_t tokens) override {
    return inner_->Embed(mb, ids, pos, tokens);
  }
  absl::Status TaskA(int mb, int64_t layer, float* q, float* k, float* v, float* attn) override {
    return inner_->TaskA(mb, layer, q, k, v, attn);
  }
  absl::Status TaskB(int mb, int64_t layer, const float* attn, ForwardStats* stats) override {
    return inner_->TaskB(mb, layer, attn, stats);
  }
  absl::Status Logits(int mb, const int64_t* rows, int64_t n, float* logits) override {
    return inner_->Logits(mb, rows, n, logits);
  }
  HostAllocator* host_buffer_allocator() const override { return allocator_; }

 private:
  std::unique_ptr<Device> inner_;
  HostAllocator* allocator_;
};

TEST_CASE("host buffer: grows by a quarter at least, never shrinks, frees on destruction",
          "[weight_store]") {
  CountingAllocator counting;
  {
    HostBuffer<float> buffer(&counting);
    REQUIRE(buffer.size() == 0);
    REQUIRE(buffer.Resize(1000).ok());
    REQUIRE(counting.live == 1);
    REQUIRE(counting.live_bytes == 4000);
    float* first = buffer.data();
    first[999] = 1.0f;                // the memory is there
    REQUIRE(buffer.Resize(10).ok());  // within capacity: same memory
    REQUIRE(buffer.data() == first);
    REQUIRE(buffer.size() == 10);
    REQUIRE(buffer.Resize(1001).ok());  // grows to 1250 elements, not 1001
    REQUIRE(counting.live == 1);
    REQUIRE(counting.live_bytes == 5000);
    REQUIRE(buffer.Resize(1250).ok());
    REQUIRE(counting.live_bytes == 5000);
    REQUIRE(std::string(buffer.allocator_name()) == "counting");
  }
  REQUIRE(counting.live == 0);
  FailingAllocator failing;
  HostBuffer<float> refused(&failing);
  const absl::Status st = refused.Resize(8);
  REQUIRE(st.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(std::string(st.message()).find("no memory here") != std::string::npos);
  REQUIRE(refused.size() == 0);
  REQUIRE(refused.data() == nullptr);
}

TEST_CASE("model runner: q/k/v/attention buffers come from the device's allocator",
          "[weight_store]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  const std::vector<int32_t> prompt = {1, 415, 6588, 28705, 28770};
  const std::vector<float> want = LastLogits(c, (*checkpoint)->weights(), prompt);
  auto runner_over = [&](HostAllocator* allocator) {
    auto cpu = CpuDevice::Create(c, (*checkpoint)->weights(), CpuDeviceOptions{DType::kF32});
    REQUIRE(cpu.ok());
    return std::make_unique<ModelRunner>(
        std::make_unique<AllocatorDevice>(*std::move(cpu), allocator));
  };
  CountingAllocator counting;
  {
    auto runner = runner_over(&counting);
    std::vector<float> logits;
    REQUIRE(ForwardPrompt(*runner, prompt, &logits).ok());
    REQUIRE(counting.live == 4);  // q, k, v, attn of the one micro-batch
    REQUIRE(logits == want);
  }
  REQUIRE(counting.live == 0);
  // A device whose buffers cannot be had: the pass fails with the allocator's error.
  FailingAllocator failing;
  auto runner = runner_over(&failing);
  std::vector<float> logits;
  REQUIRE(ForwardPrompt(*runner, prompt, &logits).code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("weight store: per-layer regions hold the checkpoint's bytes", "[weight_store]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  CountingAllocator allocator;
  std::vector<int64_t> progress;
  {
    WeightStoreOptions options;
    options.allocator = &allocator;
    options.progress = [&](int64_t done, int64_t total, int64_t done_bytes, int64_t total_bytes) {
      REQUIRE(total == c.num_hidden_layers + 1);
      REQUIRE(done_bytes <= total_bytes);
      progress.push_back(done);
    };
    auto store = WeightStore::Load(**checkpoint, options);
    REQUIRE(store.ok());
    const WeightStore& s = **store;
    REQUIRE(s.num_layers() == c.num_hidden_layers);
    REQUIRE(s.dtype() == c.torch_dtype);
    REQUIRE(allocator.live == c.num_hidden_layers + 1);
    REQUIRE(static_cast<int64_t>(s.total_bytes()) ==
            WeightStore::RequiredBytes(c, c.num_hidden_layers, s.dtype()));
    REQUIRE(progress.size() == static_cast<size_t>(c.num_hidden_layers + 1));
    REQUIRE(progress.back() == c.num_hidden_layers + 1);

    size_t max_layer = 0;
    for (int64_t l = 0; l < s.num_layers(); ++l) {
      const WeightRegion& region = s.layer(l);
      max_layer = std::max(max_layer, region.bytes);
      // Layout: the 7 layer-wise tensors, then w1, w3, w2 per expert.
      REQUIRE(region.tensors.size() == static_cast<size_t>(7 + 3 * c.num_local_experts));
      REQUIRE(region.tensors[0].name ==
              "model.layers." + std::to_string(l) + ".input_layernorm.weight");
      REQUIRE(region.tensors[6].name.find("block_sparse_moe.gate.weight") != std::string::npos);
      size_t end = 0;
      for (size_t i = 0; i < region.tensors.size(); ++i) {
        const WeightTensor& t = region.tensors[i];
        INFO(t.name);
        REQUIRE(t.offset % 256 == 0);
        REQUIRE(t.offset >= end);  // no overlap, in order
        end = t.offset + t.nbytes;
        const TensorInfo* src = (*checkpoint)->store().Find(t.name);
        REQUIRE(src != nullptr);
        REQUIRE(src->shape == t.shape);
        REQUIRE(src->nbytes == t.nbytes);
        REQUIRE(std::memcmp(src->data, region.data + t.offset, t.nbytes) == 0);
      }
      REQUIRE(end == region.bytes);
      for (int64_t e = 0; e < c.num_local_experts; ++e) {
        const WeightTensor& w1 = region.tensors[7 + 3 * e];
        const WeightTensor& w3 = region.tensors[8 + 3 * e];
        REQUIRE(w1.name.find("experts." + std::to_string(e) + ".w1") != std::string::npos);
        REQUIRE(w3.name.find("experts." + std::to_string(e) + ".w3") != std::string::npos);
      }
      // The TensorInfo views point into the region.
      const LayerWeights& lw = s.weights().layers[l];
      REQUIRE(lw.q_proj->data == region.data + region.tensors[1].offset);
      REQUIRE(lw.experts.back().w2->data == region.data + region.tensors.back().offset);
    }
    REQUIRE(s.max_layer_bytes() == max_layer);
    REQUIRE(s.globals().tensors.front().name == "model.embed_tokens.weight");
    REQUIRE(std::memcmp(s.weights().embed_tokens->data, (*checkpoint)->weights().embed_tokens->data,
                        s.weights().embed_tokens->nbytes) == 0);
    REQUIRE(s.weights().lm_head != nullptr);

    // The cpu backend gives bit-identical logits from the store and from the mapped checkpoint.
    const std::vector<int32_t> prompt = {1,   415,   2936, 9060, 285,  1142,
                                         461, 10575, 754,  272,  17898};
    const auto from_store = LastLogits(c, s.weights(), prompt);
    const auto from_checkpoint = LastLogits(c, (*checkpoint)->weights(), prompt);
    REQUIRE(from_store == from_checkpoint);
  }
  REQUIRE(allocator.live == 0);
  REQUIRE(allocator.live_bytes == 0);
}

TEST_CASE("weight store: converts to f16 at load (GPUs without bf16)", "[weight_store]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  WeightStoreOptions options;
  options.dtype = DType::kF16;
  auto store = WeightStore::Load(**checkpoint, options);
  REQUIRE(store.ok());
  REQUIRE((*store)->dtype() == DType::kF16);
  const TensorInfo& src = *(*checkpoint)->weights().layers[1].experts[2].w2;
  const TensorInfo& dst = *(*store)->weights().layers[1].experts[2].w2;
  REQUIRE(*dst.dtype == DType::kF16);
  REQUIRE(dst.nbytes == static_cast<size_t>(src.numel()) * 2);
  std::vector<float> a(src.numel()), b(src.numel());
  ConvertToF32(*src.dtype, src.data, a.data(), a.size());
  ConvertToF32(DType::kF16, dst.data, b.data(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(i);
    REQUIRE(b[i] == F16ToF32(F32ToF16(a[i])));  // one round-to-nearest-even from the exact value
  }
  (void)c;
}

TEST_CASE("weight store: the host memory budget is checked before allocating", "[weight_store]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  const int64_t need = WeightStore::RequiredBytes(c, c.num_hidden_layers, c.torch_dtype);
  CountingAllocator allocator;
  WeightStoreOptions options;
  options.allocator = &allocator;
  options.host_budget_bytes = need - 1;
  auto store = WeightStore::Load(**checkpoint, options);
  REQUIRE(store.status().code() == absl::StatusCode::kResourceExhausted);
  INFO(store.status().message());
  REQUIRE(store.status().message().find("host memory budget") != std::string::npos);
  REQUIRE(allocator.live == 0);

  options.host_budget_bytes = need;  // exactly enough
  REQUIRE(WeightStore::Load(**checkpoint, options).ok());
  options.reserved_bytes = 1;  // ... but not with one byte of KV cache beside it
  auto over = WeightStore::Load(**checkpoint, options);
  REQUIRE(over.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(over.status().message().find("reserved") != std::string::npos);

  options = WeightStoreOptions{};
  options.alignment = 100;
  REQUIRE(WeightStore::Load(**checkpoint, options).status().code() ==
          absl::StatusCode::kInvalidArgument);
}

TEST_CASE("weight store: synthetic weights are deterministic, shaped like the config",
          "[weight_store]") {
  auto config = LoadModelConfig(Fixture("tiny-mixtral"));
  REQUIRE(config.ok());
  const ModelConfig& c = *config;
  REQUIRE(c.num_hidden_layers >= 2);
  auto a = WeightStore::Synthetic(c, 1, 42, WeightStoreOptions{});
  auto b = WeightStore::Synthetic(c, 1, 42, WeightStoreOptions{});
  auto other = WeightStore::Synthetic(c, 1, 43, WeightStoreOptions{});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(other.ok());
  REQUIRE((*a)->num_layers() == 1);
  REQUIRE((*a)->config().num_hidden_layers == 1);
  REQUIRE((*a)->dtype() == c.torch_dtype);
  const WeightRegion& ra = (*a)->layer(0);
  REQUIRE(std::memcmp(ra.data, (*b)->layer(0).data, ra.bytes) == 0);
  REQUIRE(std::memcmp(ra.data, (*other)->layer(0).data, ra.bytes) != 0);

  // Norms are 1; linear weights have mean ~0 and standard deviation ~0.02.
  const TensorInfo& norm = *(*a)->weights().layers[0].input_layernorm;
  std::vector<float> v(norm.numel());
  ConvertToF32(*norm.dtype, norm.data, v.data(), v.size());
  for (float x : v) REQUIRE(x == 1.0f);
  const TensorInfo& w1 = *(*a)->weights().layers[0].experts[0].w1;
  v.resize(w1.numel());
  ConvertToF32(*w1.dtype, w1.data, v.data(), v.size());
  double sum = 0, sum_sq = 0;
  for (float x : v) {
    sum += x;
    sum_sq += double(x) * x;
  }
  const double mean = sum / v.size(), sd = std::sqrt(sum_sq / v.size() - mean * mean);
  INFO("mean " << mean << " sd " << sd << " over " << v.size());
  REQUIRE(std::abs(mean) < 0.002);
  REQUIRE(sd == Approx(0.02).epsilon(0.05));

  REQUIRE(
      WeightStore::Synthetic(c, c.num_hidden_layers + 1, 0, WeightStoreOptions{}).status().code() ==
      absl::StatusCode::kInvalidArgument);
  auto all = WeightStore::Synthetic(c, 0, 0, WeightStoreOptions{});
  REQUIRE(all.ok());
  REQUIRE((*all)->num_layers() == c.num_hidden_layers);
}

TEST_CASE("engine: host-copied and synthetic weights", "[weight_store]") {
  EngineOptions options;
  options.model_dir = Fixture("tiny-mixtral");
  options.kv.bytes = int64_t{8} << 20;
  GenerationRequest request;
  request.prompt_token_ids = {1, 415, 2936, 9060, 285, 1142};
  request.sampling.max_tokens = 8;
  request.sampling.temperature = 0.0;
  auto run = [&](const EngineOptions& o) {
    auto engine = Engine::Create(o);
    REQUIRE(engine.ok());
    REQUIRE((*engine)->AddRequest(request).ok());
    std::vector<int32_t> tokens;
    while ((*engine)->HasUnfinished()) {
      std::vector<GenerationOutput> out;
      REQUIRE((*engine)->Step(&out).ok());
      for (const auto& g : out)
        tokens.insert(tokens.end(), g.new_token_ids.begin(), g.new_token_ids.end());
    }
    return tokens;
  };
  const auto mapped = run(options);
  REQUIRE(mapped.size() == 8);
  options.weights.source = WeightSource::kHostCopy;
  REQUIRE(run(options) == mapped);

  options.weights.source = WeightSource::kSynthetic;
  options.weights.synthetic_layers = 1;
  options.weights.synthetic_seed = 7;
  {
    auto engine = Engine::Create(options);
    REQUIRE(engine.ok());
    REQUIRE((*engine)->config().num_hidden_layers == 1);
  }
  const auto synthetic = run(options);
  REQUIRE(synthetic.size() == 8);
  REQUIRE(run(options) == synthetic);  // deterministic

  options.host_memory_bytes = 1 << 20;  // the KV cache alone is 8 MiB
  auto refused = Engine::Create(options);
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);

  // The cuda backend without a usable GPU (this machine, CI): a clear Unavailable, nothing loaded.
  options = EngineOptions{};
  options.model_dir = Fixture("tiny-mixtral");
  options.backend = "cuda";
  if (auto gpus = ProbeGpus(); !gpus.ok() || gpus->empty()) {
    auto no_gpu = Engine::Create(options);
    INFO(no_gpu.status().ToString());
    REQUIRE(no_gpu.status().code() == absl::StatusCode::kUnavailable);
  }

  // kv_cache_bytes 0: the KV cache takes what the host budget leaves after the weights, 1 GiB and
  // the pass's host buffers at their largest (2048 tokens of q/k/v/attention for each of two
  // micro-batches, and two logits rows per token).
  {
    auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
    REQUIRE(checkpoint.ok());
    const int64_t weights = static_cast<int64_t>((*checkpoint)->store().total_bytes());
    const ModelConfig& c = (*checkpoint)->config();
    const int64_t pass =
        kCpuTokensPerPass * (2 * (2 * c.q_size() + 2 * c.kv_size()) * 4 + 2 * c.vocab_size * 4);
    EngineOptions automatic;
    automatic.model_dir = Fixture("tiny-mixtral");
    automatic.kv.bytes = 0;
    automatic.host_memory_bytes = weights + (int64_t{1} << 30) + pass + (int64_t{64} << 20);
    auto engine = Engine::Create(automatic);
    REQUIRE(engine.ok());
    const int64_t block = c.num_hidden_layers * 2 * c.num_key_value_heads * 16 * c.head_dim * 4;
    REQUIRE((*engine)->stats().kv_blocks_total == (int64_t{64} << 20) / block);
    automatic.host_memory_bytes = weights + (int64_t{1} << 30) + pass;  // nothing left for KV
    REQUIRE(Engine::Create(automatic).status().code() == absl::StatusCode::kInvalidArgument);
  }

  REQUIRE(WeightSourceFromString("host") == WeightSource::kHostCopy);
  REQUIRE(!WeightSourceFromString("disk").has_value());
}

TEST_CASE("weight store: int8 / int4 at load quantize the weight matrices only", "[weights]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  for (const auto& q :
       {WeightQuantization{GgmlType::kQ8_0, 32}, WeightQuantization{GgmlType::kQ4_1, 64}}) {
    INFO(WeightQuantizationName(q) << " group " << q.group_size);
    WeightStoreOptions options;
    options.quantize = q;
    auto store = WeightStore::Load(**checkpoint, options);
    INFO(store.status().ToString());
    REQUIRE(store.ok());
    const WeightStore& s = **store;
    CHECK(s.quantized());
    CHECK(static_cast<int64_t>(s.total_bytes()) ==
          WeightStore::RequiredBytes(c, c.num_hidden_layers, c.torch_dtype, 256, q));
    // A layer: 8.5 (Q8_0) or 5 (Q4_1) bits per weight against bf16's 16.
    CHECK(static_cast<double>(s.max_layer_bytes()) <
          WeightStore::LayerRegionBytes(c, c.torch_dtype) /
              (q.type == GgmlType::kQ8_0 ? 1.8 : 3.0));
    CHECK(static_cast<int64_t>(s.max_layer_bytes()) ==
          WeightStore::LayerRegionBytes(c, c.torch_dtype, 256, q));
    const ModelWeights& w = s.weights();
    CHECK(w.embed_tokens->quant == GgmlType::kQ8_0);
    CHECK(w.norm->dtype == c.torch_dtype);
    for (const LayerWeights& layer : w.layers) {
      CHECK(layer.q_proj->quant == q.type);
      CHECK(layer.router->dtype == c.torch_dtype);
      CHECK_FALSE(layer.router->quant.has_value());
      CHECK(layer.input_layernorm->dtype == c.torch_dtype);
      for (const ExpertWeights& e : layer.experts) CHECK(e.w2->quant == q.type);
    }
    // An expert row decodes to the checkpoint's within half a quantization step of its group.
    const TensorInfo& src = *(*checkpoint)->weights().layers[1].experts[3].w1;
    const TensorInfo& dst = *w.layers[1].experts[3].w1;
    const int64_t cols = src.shape[1];
    std::vector<float> want(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
    const int64_t row_bytes = GgmlRowBytes(GgmlTypeInfoOf(q.type), cols);
    for (int64_t r = 0; r < src.shape[0]; ++r) {
      ConvertToF32(*src.dtype, src.data + r * cols * DTypeSize(*src.dtype), want.data(), cols);
      REQUIRE(DequantizeRow(q.type, dst.data + r * row_bytes, cols, got.data()).ok());
      for (int64_t g = 0; g < cols; g += q.group_size) {
        float lo = want[g], hi = want[g], amax = 0;
        for (int64_t i = g; i < std::min(cols, g + q.group_size); ++i) {
          lo = std::min(lo, want[i]);
          hi = std::max(hi, want[i]);
          amax = std::max(amax, std::fabs(want[i]));
        }
        const float step = q.type == GgmlType::kQ8_0 ? amax / 127 : (hi - lo) / 15;
        for (int64_t i = g; i < std::min(cols, g + q.group_size); ++i) {
          // Half a step, plus the f16 rounding of the stored scale (and min): 2^-11 relative.
          REQUIRE(std::fabs(got[i] - want[i]) <=
                  0.5f * step + (128 * step + std::fabs(lo)) / 2048 + 1e-6f);
        }
      }
    }
  }
}

// --q8_0_activations=f32: the cpu backend over Q8_0 weights (here quantized at load) computes the
// dequantized model bit for bit (InvariantLinearQ8_0 widens each weight exactly and sums in
// InvariantLinear's order): the same logits as a device over f32 copies of the dequantized
// tensors, for a prompt of 5 tokens (the GEMMs' dot-product tiles) and of 40 (the lane path). With
// int8 activations (the default, llama.cpp's method) they differ.
TEST_CASE("cpu backend: Q8_0 weights with f32 activations give the dequantized model's bits",
          "[weights]") {
  auto checkpoint = Checkpoint::Load(Fixture("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  WeightStoreOptions options;
  options.quantize = WeightQuantization{GgmlType::kQ8_0, 32};
  auto store = WeightStore::Load(**checkpoint, options);
  REQUIRE(store.ok());
  // The store's weights with every quantized tensor replaced by an f32 copy of its dequantized
  // values (the same copy wherever a tensor is shared, as a tied lm_head).
  ModelWeights wide = (*store)->weights();
  std::map<const TensorInfo*, std::unique_ptr<TensorInfo>> copies;
  std::vector<std::vector<float>> buffers;
  int widened = 0;
  auto widen = [&](const TensorInfo*& t) {
    if (t == nullptr || !t->quant) return;
    auto& copy = copies[t];
    if (copy == nullptr) {
      REQUIRE(*t->quant == GgmlType::kQ8_0);
      const int64_t cols = t->shape.back(), rows = t->numel() / cols;
      const int64_t row_bytes = GgmlRowBytes(GgmlTypeInfoOf(*t->quant), cols);
      std::vector<float>& f = buffers.emplace_back(static_cast<size_t>(t->numel()));
      bool decoded = true;
      for (int64_t r = 0; r < rows; ++r) {
        decoded &=
            DequantizeRow(*t->quant, t->data + r * row_bytes, cols, f.data() + r * cols).ok();
      }
      REQUIRE(decoded);
      copy = std::make_unique<TensorInfo>(*t);
      copy->quant.reset();
      copy->dtype = DType::kF32;
      copy->dtype_name = "F32";
      copy->data = reinterpret_cast<const std::byte*>(f.data());
      copy->nbytes = f.size() * sizeof(float);
      ++widened;
    }
    t = copy.get();
  };
  widen(wide.embed_tokens);
  widen(wide.lm_head);
  for (LayerWeights& layer : wide.layers) {
    for (const TensorInfo** t : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj}) {
      widen(*t);
    }
    for (ExpertWeights& e : layer.experts) {
      widen(e.w1);
      widen(e.w2);
      widen(e.w3);
    }
  }
  REQUIRE(widened == 2 + c.num_hidden_layers * (4 + 3 * c.num_local_experts));
  auto logits_of = [&](const ModelWeights& weights, bool q8_0_f32,
                       const std::vector<int32_t>& prompt) {
    CpuDeviceOptions device_options{DType::kF32};
    device_options.q8_0_f32_activations = q8_0_f32;
    auto device = CpuDevice::Create(c, weights, device_options);
    REQUIRE(device.ok());
    ModelRunner runner(*std::move(device));
    std::vector<float> logits;
    REQUIRE(ForwardPrompt(runner, prompt, &logits).ok());
    return logits;
  };
  for (const int64_t n : {5, 40}) {
    INFO("prompt of " << n << " tokens");
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < n; ++i) prompt.push_back(static_cast<int32_t>((1 + 977 * i) % 32000));
    const std::vector<float> want = logits_of(wide, false, prompt);
    const std::vector<float> f32 = logits_of((*store)->weights(), true, prompt);
    const std::vector<float> int8 = logits_of((*store)->weights(), false, prompt);
    REQUIRE(f32.size() == want.size());
    CHECK(std::memcmp(f32.data(), want.data(), want.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(int8.data(), want.data(), want.size() * sizeof(float)) != 0);
  }
}

// --q8_0_activations=auto (EngineOptions::Cpu::q8_0_f32_activations unset): the engine runs the
// host's faster Q8_0 path, int8 activations where QuantLinear has AVX-512 VNNI and f32 (widened)
// elsewhere. Its scores are that path's, pinned, bit for bit, and the two paths' differ.
TEST_CASE("engine: Q8_0 weights take the host's faster activations by default", "[weights]") {
  CHECK_FALSE(QuantLinearUsesVnni(CpuIsa::kAvx2));
  CHECK_FALSE(QuantLinearUsesVnni(CpuIsa::kPortable));
  __builtin_cpu_init();
  CHECK(QuantLinearUsesVnni(CpuIsa::kAvx512) ==
        (__builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512vnni") != 0));
  CHECK(DefaultQ8_0F32Activations() == !QuantLinearUsesVnni(SelectedCpuIsa()));
  auto scores = [](std::optional<bool> f32) {
    EngineOptions options;
    options.model_dir = Fixture("tiny-mixtral");
    options.kv.bytes = int64_t{8} << 20;
    options.weights.source = WeightSource::kHostCopy;
    options.weights.quantize = WeightQuantization{GgmlType::kQ8_0, 32};
    options.cpu.q8_0_f32_activations = f32;
    auto engine = Engine::Create(options);
    REQUIRE(engine.ok());
    auto got = (*engine)->ScoreTokens({{1, 415, 2936, 9060, 285, 1142, 28705, 13}}, 1);
    REQUIRE(got.ok());
    REQUIRE(got->size() == 1);
    return got->front();
  };
  const std::vector<double> automatic = scores(std::nullopt);
  const std::vector<double> f32 = scores(true);
  const std::vector<double> int8 = scores(false);
  REQUIRE(automatic.size() == 7);
  CHECK(f32 != int8);
  CHECK(automatic == (DefaultQ8_0F32Activations() ? f32 : int8));
}

// DeepSeek's MLA with int8 / int4 at load: kv_b_proj stays in the store's float dtype (both
// backends multiply its per-head slices in floats; a quantized one is refused), the other
// matrices are quantized, and the cpu backend computes with the store. kv_lora_rank 64 (the
// fixture's 48 is not a multiple of 32, so it would stay unquantized anyway).
TEST_CASE("weight store: int8 / int4 at load keep MLA's kv_b_proj in floats", "[weights]") {
  auto config = LoadModelConfig(Fixture("tiny-deepseek-v2"));
  REQUIRE(config.ok());
  ModelConfig c = *config;
  REQUIRE(c.mla);
  c.mla->kv_lora_rank = 64;
  c.head_dim = c.mla->latent_dim();  // the attention the CPU computes: MQA over latent rows
  c.hidden_size = 64;                // so that the projections from it are quantized too
  WeightStoreOptions options;
  options.quantize = WeightQuantization{GgmlType::kQ4_1, 32};
  auto store = WeightStore::Synthetic(c, c.num_hidden_layers, 7, options);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  for (const LayerWeights& layer : (*store)->weights().layers) {
    CHECK_FALSE(layer.kv_b_proj->quant.has_value());
    CHECK(layer.kv_b_proj->dtype == c.torch_dtype);
    CHECK(layer.kv_a_proj->quant == GgmlType::kQ4_1);
    CHECK(layer.q_proj->quant == GgmlType::kQ4_1);
  }
  CHECK(static_cast<int64_t>((*store)->total_bytes()) ==
        WeightStore::RequiredBytes(c, c.num_hidden_layers, c.torch_dtype, 256, options.quantize));
  auto device =
      CpuDevice::Create((*store)->config(), (*store)->weights(), CpuDeviceOptions{DType::kF32});
  INFO(device.status().ToString());
  CHECK(device.ok());
}

TEST_CASE("weight store: a GGUF checkpoint's blocks are copied as they are", "[weights]") {
  const char* deps = std::getenv("MOEBATCH_DEPS_DIR");
  const std::string path =
      (deps != nullptr && *deps != '\0' ? std::string(deps) : Fixture("../../.deps")) +
      "/gguf/moe-tiny.gguf";
  auto checkpoint = Checkpoint::Load(path);
  INFO(checkpoint.status().ToString());
  REQUIRE(checkpoint.ok());
  auto store = WeightStore::Load(**checkpoint, WeightStoreOptions{});
  REQUIRE(store.ok());
  const ModelWeights& a = (*checkpoint)->weights();
  const ModelWeights& b = (*store)->weights();
  for (size_t l = 0; l < a.layers.size(); ++l) {
    for (size_t e = 0; e < a.layers[l].experts.size(); ++e) {
      const TensorInfo& x = *a.layers[l].experts[e].w3;
      const TensorInfo& y = *b.layers[l].experts[e].w3;
      REQUIRE(x.nbytes == y.nbytes);
      CHECK(std::memcmp(x.data, y.data, x.nbytes) == 0);
    }
  }
  WeightStoreOptions quantize;
  quantize.quantize = WeightQuantization{GgmlType::kQ4_1, 32};
  auto refused = WeightStore::Load(**checkpoint, quantize);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("GGUF file"));
}

}  // namespace
}  // namespace moebatch
