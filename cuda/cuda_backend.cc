// The cuda backend in the registry (engine/backend.h), CUDA-free: it plans with
// engine/offload/gpu_memory_plan.h and creates devices through cuda/cuda_backend.h, whose functions
// a build without nvcc answers with Unavailable (cuda_backend_none.cc), so --backend=cuda there
// says why it cannot run.
//
// Its plan (MoE-Lens §6.2-6.5): the weights copied into page-locked host regions in the GPU's
// compute dtype (bf16 on sm_80+, f16 on the T4), or in their ggml blocks (a GGUF file's, or
// quantized at load: --weight_dtype int8|int4), streamed layer by layer; the GPU budget resolved
// once (--gpu_memory_gb, else the free memory less 1 GiB); the tokens per pass the budget holds
// activations for (capped), lowered to the pipeline profiler's n_real (§6.3); the first layers kept
// resident where the budget has room; VSLPipe on.
#include "cuda/cuda_backend.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda/device_probe.h"
#include "engine/backend.h"
#include "engine/engine_plan.h"
#include "engine/model/family.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_tensors.h"
#include "engine/offload/gpu_memory_plan.h"
#include "engine/offload/pipeline_profiler.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

std::string GpuName(int device) {
  if (auto gpus = ProbeGpus(); gpus.ok()) {
    for (const GpuInfo& g : *gpus) {
      if (g.index == device) return g.name;
    }
  }
  return absl::StrCat("gpu", device);
}

// What the device holds of the weights, planned before they are read: one decoder layer's region
// as WeightStore lays it out (a weight slot) and the dequantization scratch (0: nothing quantized).
struct DeviceWeightBytes {
  int64_t layer = 0;
  int64_t dequant = 0;
};

// A GGUF file's tensors keep their ggml types in the store (its float tensors take `dtype`): each
// layer's region from the file's tensor types, every tensor at a 256-byte boundary as WeightStore
// places them (an upper bound by at most the last tensor's padding); the scratch holds the largest
// quantized matrix of a layer in `dtype`. Otherwise the store's own arithmetic
// (WeightStore::LayerRegionBytes, with the quantization asked for) and GpuDequantScratchBytes.
absl::StatusOr<DeviceWeightBytes> PlanDeviceWeightBytes(const EngineOptions& options,
                                                        const ModelConfig& config, DType dtype) {
  DeviceWeightBytes out;
  if (options.weights.source == WeightSource::kSynthetic || !IsGgufFile(options.model_dir)) {
    out.layer = WeightStore::LayerRegionBytes(config, dtype, 256, options.weights.quantize);
    if (options.weights.quantize) out.dequant = GpuDequantScratchBytes(config, dtype);
    return out;
  }
  auto file = GgufFile::Open(options.model_dir);
  if (!file.ok()) return file.status();
  ModelWeights scratch;
  const auto regions = ModelTensors(config, config.num_hidden_layers, &scratch);
  int64_t largest_quantized = 0;
  for (size_t r = 1; r < regions.size(); ++r) {
    int64_t bytes = 0;
    for (const TensorSpec& spec : regions[r]) {
      auto src = FindGgufSource(**file, config, spec);
      if (!src.ok()) return src.status();
      int64_t numel = 1;
      for (int64_t d : spec.shape) numel *= d;
      const GgmlType type = src->tensor->type.type;
      const bool is_float =
          type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
      bytes = (bytes + 255) / 256 * 256 +
              (is_float ? numel * static_cast<int64_t>(DTypeSize(dtype))
                        : src->rows * GgmlRowBytes(src->tensor->type, src->cols));
      if (!is_float) largest_quantized = std::max(largest_quantized, numel);
    }
    out.layer = std::max(out.layer, bytes);
  }
  out.dequant = largest_quantized * static_cast<int64_t>(DTypeSize(dtype));
  return out;
}

class CudaBackend final : public Backend {
 public:
  const char* name() const override { return "cuda"; }
  // Not chosen by --backend=auto until it has passed its tests on a GPU (docs/performance.md).
  bool automatic() const override { return false; }

  absl::StatusOr<std::string> Probe(const EngineOptions& options) const override {
    auto gpus = ProbeGpus();
    if (!gpus.ok()) return gpus.status();
    for (const GpuInfo& g : *gpus) {
      if (g.index != options.gpu.device) continue;
      return absl::StrFormat("cuda:%d %s (sm_%d%d, %.1f GiB)", g.index, g.name, g.sm_major,
                             g.sm_minor, g.total_memory_bytes / 1073741824.0);
    }
    return absl::UnavailableError(
        absl::StrCat("no CUDA device ", options.gpu.device, " (", gpus->size(), " GPUs found)"));
  }

  absl::StatusOr<BackendPlan> Plan(const EngineOptions& options,
                                   const ModelConfig& config) const override {
    auto device = Probe(options);
    if (!device.ok()) return device.status();
    auto compute = CudaComputeDType(options.gpu.device);
    if (!compute.ok()) return compute.status();
    BackendPlan plan;
    plan.device = *std::move(device);
    // The weights stream from page-locked host regions, in the dtype the GPU computes in (the
    // float ones; quantized ones in their blocks, dequantized on the GPU before each GEMM).
    plan.weight_source = options.weights.source == WeightSource::kSynthetic
                             ? WeightSource::kSynthetic
                             : WeightSource::kHostCopy;
    plan.weight_dtype = options.weights.dtype.value_or(*compute);
    plan.pinned_weights = true;
    plan.compute_dtype = *plan.weight_dtype;
    CudaBackendOptions cuda;
    cuda.device = options.gpu.device;
    cuda.gpu_memory_bytes = options.gpu.memory_bytes;
    auto budget = CudaMemoryBudget(cuda);
    if (!budget.ok()) return budget.status();
    // The layer regions as the store will hold them (ggml blocks stay blocks: a quantized layer
    // streams and occupies a slot at its real size) and the scratch they are dequantized into.
    auto weight_bytes = PlanDeviceWeightBytes(options, config, plan.compute_dtype);
    if (!weight_bytes.ok()) return weight_bytes.status();
    auto memory = PlanGpuDevice(config, plan.compute_dtype, weight_bytes->layer,
                                config.num_hidden_layers, options.schedule.max_tokens_per_pass,
                                *budget, options.gpu.resident_layers, weight_bytes->dequant);
    if (!memory.ok()) return memory.status();
    plan.max_tokens_per_pass = memory->tokens_per_pass;
    plan.device_memory_bytes = *budget;
    plan.resident_layers = memory->resident_layers;
    plan.device_memory_plan = memory->ToString();
    plan.vslpipe = true;
    plan.profile_token_budget = options.schedule.profile_token_budget;
    return plan;
  }

  HostAllocator* pinned_allocator() const override { return PinnedHostAllocator(); }

  // n_real from a one-layer device (weights resident), the layer's transfer time from the data
  // mover's first fill; cached under options.schedule.profile_dir, keyed by the model, the GPU, the
  // resolved budget and, for quantized weights, a layer's bytes. nullopt (with a warning) when the
  // timings give no usable line (e.g. a model so small that the time does not grow with tokens).
  // Device errors are errors.
  absl::StatusOr<std::optional<int64_t>> ProfileTokenBudget(
      const LoadedWeights& weights, const EngineOptions& options,
      const BackendPlan& plan) const override {
    const WeightStore& store = *weights.store;
    // A quantized store moves fewer bytes a layer and dequantizes before its GEMMs: its own n_real,
    // keyed by its layer's bytes.
    const std::string key = ProfileKey(
        store.config(),
        store.quantized()
            ? absl::StrCat(GpuName(options.gpu.device), "-quantized-layer", store.max_layer_bytes())
            : GpuName(options.gpu.device),
        plan.device_memory_bytes);
    const std::string& dir = options.schedule.profile_dir;
    if (!dir.empty()) {
      auto cached = LoadProfile(dir, key);
      if (cached.ok()) {
        spdlog::info("pipeline profile {}: n_real {} tokens per pass (cached)", key,
                     cached->n_real);
        return std::optional<int64_t>(cached->n_real);
      }
      if (cached.status().code() != absl::StatusCode::kNotFound) {
        spdlog::warn("{}; profiling again", cached.status().ToString());
      }
    }
    auto one_layer = WeightStore::View(store, 1);
    if (!one_layer.ok()) return one_layer.status();
    auto device =
        CreateCudaDevice(**one_layer, DeviceOptions(options, plan, plan.max_tokens_per_pass));
    if (!device.ok()) return device.status();
    const int64_t most = plan.max_tokens_per_pass;
    std::vector<int64_t> tokens;
    for (int64_t n = 128; n <= most; n *= 2) tokens.push_back(n);
    if (tokens.size() < 2) tokens = {1, std::max<int64_t>(2, most)};
    PipelineProfile profile;
    auto points = MeasureLayerTimes(**device, tokens, 3);
    if (!points.ok()) return points.status();
    profile.points = *std::move(points);
    auto unusable = [&](const absl::Status& st) {
      spdlog::warn("pipeline profile {}: {}; the token budget stays at the ceiling of {} tokens",
                   key, std::string(st.message()), most);
      return std::optional<int64_t>();
    };
    auto fit = FitLine(profile.points);
    if (!fit.ok()) return unusable(fit.status());
    profile.fit = *fit;
    const DeviceCounters moved = (*device)->counters();
    if (moved.weight_bytes <= 0 || moved.weight_busy_seconds <= 0) {
      return absl::InternalError("pipeline profile: the layer's weights were never copied");
    }
    profile.layer_transfer_seconds = static_cast<double>(store.max_layer_bytes()) /
                                     (moved.weight_bytes / moved.weight_busy_seconds);
    auto n_real = TokensToSaturate(profile.fit, profile.layer_transfer_seconds);
    if (!n_real.ok()) return unusable(n_real.status());
    profile.n_real = *n_real;
    spdlog::info(
        "pipeline profile {}: layer time {:.3f} ms + {:.4f} ms/token (r2 {:.3f}), transfer {:.2f} "
        "ms -> n_real {} tokens per pass",
        key, profile.fit.intercept * 1e3, profile.fit.slope * 1e3, profile.fit.r2,
        profile.layer_transfer_seconds * 1e3, profile.n_real);
    if (!dir.empty()) {
      if (auto st = SaveProfile(dir, key, profile); !st.ok()) spdlog::warn("{}", st.ToString());
    }
    return std::optional<int64_t>(profile.n_real);
  }

  absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const LoadedWeights& weights,
                                                       const EngineOptions& options,
                                                       const BackendPlan& plan,
                                                       int64_t tokens_per_pass) const override {
    if (weights.store == nullptr) {
      return absl::FailedPreconditionError(
          "the cuda backend streams from a weight store; the weights were mapped");
    }
    return CreateCudaDevice(*weights.store, DeviceOptions(options, plan, tokens_per_pass));
  }

 private:
  static CudaBackendOptions DeviceOptions(const EngineOptions& options, const BackendPlan& plan,
                                          int64_t tokens_per_pass) {
    CudaBackendOptions cuda;
    cuda.device = options.gpu.device;
    cuda.gpu_memory_bytes = plan.device_memory_bytes;  // resolved once, in Plan
    cuda.max_tokens_per_pass = tokens_per_pass;
    cuda.packet_bytes = static_cast<size_t>(options.gpu.packet_bytes);
    cuda.resident_layers = options.gpu.resident_layers;
    return cuda;
  }
};

const BackendRegistrar<CudaBackend> registrar;

}  // namespace
}  // namespace moebatch
