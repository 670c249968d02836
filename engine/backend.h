// Backends: where tasks A and B of a pass run (engine/device.h), each registered by its own folder
// as ggml's backend registry does (cpu_attention/backend/cpu_backend.cc, cuda/cuda_backend.cc).
// The engine reaches a backend only through this interface, so engine/ includes nothing of
// cpu_attention/backend/ or cuda/, and a build without nvcc registers a cuda backend that says so.
//
// A backend answers three questions, in the order Engine::Create asks them:
//   1. Probe: is a device there, and what is it ("cuda:0 NVIDIA L4, sm_89, 22.1 GiB free")?
//   2. Plan: given the options and the model's config (no weights read), how the weights are kept
//      (source, dtype, pinned or not), the compute dtype, the ceiling of tokens per pass, the GPU
//      budget and the layers kept on the GPU: computed once, here, and printed by --dry_run
//      (engine/engine_plan.h puts it into the EnginePlan with the KV cache and the scheduler).
//   3. CreateDevice: the Device over the loaded weights, sized for the scheduler's budget. A
//      backend may first profile the pipeline (MoE-Lens §6.3) to lower that budget to n_real.
//
// Registration: a static BackendRegistrar in the backend's own file. Programs link the backend
// libraries whole (CMake: moebatch_link_backends), so the registrar runs even though nothing
// refers to it.
//
// Threading: registration happens during static initialisation; afterwards the registry is
// read-only and every function here may be called from any thread. A Backend's methods are const
// and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device.h"
#include "engine/model/dtype.h"
#include "engine/model/host_memory.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_store.h"

namespace moebatch {

struct EngineOptions;

// Where the weights live (engine/model/weight_store.h):
//   kMapped     the checkpoint's safetensors files, read in place (memory-mapped)
//   kHostCopy   copied into one contiguous host region per layer (what the cuda backend streams)
//   kSynthetic  generated from config.json, no safetensors needed (benchmarks)
enum class WeightSource { kMapped, kHostCopy, kSynthetic };
// "mapped", "host", "synthetic" (the --weights flag's spelling); nullopt for anything else.
std::optional<WeightSource> WeightSourceFromString(std::string_view name);
const char* WeightSourceName(WeightSource source);

// What a backend decided for a model before any weight is read.
struct BackendPlan {
  std::string device;  // what Probe found, for logs and --dry_run
  // How the weights are kept: the source (the options', or kHostCopy where the backend streams
  // from host regions), their dtype, and whether their memory is page-locked.
  WeightSource weight_source = WeightSource::kMapped;
  std::optional<DType> weight_dtype;  // nullopt: as stored in the checkpoint
  bool pinned_weights = false;
  DType compute_dtype = DType::kF32;  // what the device's GEMMs compute in
  // The ceiling of prefill + decode tokens per pass (MoE-Lens §6.2-6.3), >= 1: the options' value,
  // or the backend's automatic one.
  int64_t max_tokens_per_pass = 0;
  bool vslpipe = false;  // VSLPipe unless the options say otherwise (MoE-Lens §6.4)
  // The device memory the backend may use and its plan (cuda: the GPU budget, bytes, and the
  // GpuMemoryPlan at the ceiling, one line); 0 and "" on the cpu.
  int64_t device_memory_bytes = 0;
  int64_t resident_layers = 0;  // layers kept on the device for good
  std::string device_memory_plan;
  // Whether CreateDevice should be preceded by ProfileTokenBudget.
  bool profile_token_budget = false;
};

// The weights a device runs from: the checkpoint's mapping or a WeightStore (which the backend's
// plan asked for). `store` is null for mapped weights. Both outlive the device.
struct LoadedWeights {
  const ModelConfig* config = nullptr;
  const ModelWeights* weights = nullptr;
  const WeightStore* store = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // The name --backend takes: "cpu", "cuda".
  virtual const char* name() const = 0;

  // Whether --backend=auto may choose this backend when its device is present. The cpu backend
  // always; the cuda backend not until it has been validated on a GPU (docs/performance.md).
  virtual bool automatic() const = 0;

  // The device the options name, described in one line; Unavailable (with the reason: no driver,
  // no such device, a build without CUDA) when there is none.
  virtual absl::StatusOr<std::string> Probe(const EngineOptions& options) const = 0;

  // The plan for `config` (the model's config.json, with the layer count the engine will run).
  // Pure but for the device queries the backend needs (the GPU's free memory and compute
  // capability). InvalidArgument naming the option for a value the backend cannot run with;
  // ResourceExhausted when the model cannot be planned into the device's memory.
  virtual absl::StatusOr<BackendPlan> Plan(const EngineOptions& options,
                                           const ModelConfig& config) const = 0;

  // The host allocator for the weights when the plan wants them pinned (null: pageable). Lives as
  // long as the process.
  virtual HostAllocator* pinned_allocator() const { return nullptr; }

  // MoE-Lens §6.3: n_real, the tokens per pass at which a layer's compute time covers its
  // transfer, measured on the device over the loaded weights (cached under the options'
  // profile_dir); nullopt when the measurement gives no usable line. Only called when
  // plan.profile_token_budget.
  virtual absl::StatusOr<std::optional<int64_t>> ProfileTokenBudget(const LoadedWeights& weights,
                                                                    const EngineOptions& options,
                                                                    const BackendPlan& plan) const {
    return std::optional<int64_t>();
  }

  // The Device over `weights`, its activations sized for `tokens_per_pass` tokens (the scheduler's
  // budget, <= plan.max_tokens_per_pass). Errors: the backend's (Unavailable, ResourceExhausted,
  // Internal, InvalidArgument).
  virtual absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const LoadedWeights& weights,
                                                               const EngineOptions& options,
                                                               const BackendPlan& plan,
                                                               int64_t tokens_per_pass) const = 0;
};

// Adds a backend to the registry (static initialisation only). Names are unique: a second backend
// of a name already registered is dropped.
void RegisterBackend(std::unique_ptr<Backend> backend);

// The registered backend called `name`; NotFound listing the registered ones otherwise. "auto":
// the first automatic() backend, in registration order, whose Probe succeeds.
absl::StatusOr<const Backend*> FindBackend(std::string_view name, const EngineOptions& options);

// Every registered backend, in registration order.
std::vector<const Backend*> RegisteredBackends();

// Registers T (default-constructed) at static initialisation: `static BackendRegistrar<T> r;`.
template <typename T>
struct BackendRegistrar {
  BackendRegistrar() { RegisterBackend(std::make_unique<T>()); }
};

}  // namespace moebatch
