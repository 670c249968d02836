// The cpu backend in the registry (engine/backend.h): tasks A and B on the CPU (CpuDevice), the
// weights read where they are (mapped, or a host copy), tokens per pass kCpuTokensPerPass unless
// the options say otherwise, no pipeline profile, VSLPipe off (its device tasks would share the
// CPU with attention: measured slower, docs/performance.md).
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cpu_attention/backend/cpu_device.h"
#include "cpu_attention/runtime/cpu_isa.h"
#include "cpu_attention/runtime/cpu_threads.h"
#include "engine/backend.h"
#include "engine/engine_plan.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  bool automatic() const override { return true; }

  absl::StatusOr<std::string> Probe(const EngineOptions& options) const override {
    const int threads = options.cpu.threads > 0 ? options.cpu.threads : DefaultCpuThreads();
    const int allowed = static_cast<int>(AllowedCpus().size());
    return absl::StrCat("x86-64 ", CpuIsaName(SelectedCpuIsa()), ", ", threads, " threads",
                        options.cpu.pin_threads ? " (pinned)" : "",
                        options.cpu.threads == 0 && threads < allowed
                            ? absl::StrCat(" (the cgroup's CPU quota; ", allowed, " CPUs allowed)")
                            : "");
  }

  absl::StatusOr<BackendPlan> Plan(const EngineOptions& options,
                                   const ModelConfig& config) const override {
    const DType compute = options.cpu.compute_dtype;
    if (compute != DType::kF32 && compute != DType::kBF16 && compute != DType::kF16) {
      return absl::InvalidArgumentError(
          absl::StrCat("compute_dtype: the cpu backend computes in f32, bf16 or f16, got ",
                       std::string(DTypeName(compute))));
    }
    if (options.weights.dtype && options.weights.source == WeightSource::kMapped) {
      return absl::InvalidArgumentError(
          "weight_dtype: needs host or synthetic weights (mapped weights are read as stored)");
    }
    BackendPlan plan;
    auto device = Probe(options);
    if (!device.ok()) return device.status();
    plan.device = *std::move(device);
    plan.weight_source = options.weights.source;
    // Weights quantized at load are a copy.
    if (options.weights.quantize && plan.weight_source == WeightSource::kMapped) {
      plan.weight_source = WeightSource::kHostCopy;
    }
    plan.weight_dtype = options.weights.dtype;
    plan.compute_dtype = compute;
    plan.max_tokens_per_pass = options.schedule.max_tokens_per_pass > 0
                                   ? options.schedule.max_tokens_per_pass
                                   : kCpuTokensPerPass;
    plan.vslpipe = false;
    plan.profile_token_budget = false;
    return plan;
  }

  absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const LoadedWeights& weights,
                                                       const EngineOptions& options,
                                                       const BackendPlan& plan,
                                                       int64_t /*tokens_per_pass*/) const override {
    const bool q8_0_f32 = options.cpu.q8_0_f32_activations.value_or(DefaultQ8_0F32Activations());
    auto device = CpuDevice::Create(
        *weights.config, *weights.weights,
        CpuDeviceOptions{plan.compute_dtype, options.cpu.widened_weight_budget_bytes,
                         options.cpu.batch_invariant, options.cpu.mxfp4_f32_activations, q8_0_f32});
    if (!device.ok()) return device.status();
    spdlog::info("cpu backend: GEMMs on {}; Q8_0 weights (if any) with {} activations{}",
                 (*device)->matmul().Describe(), q8_0_f32 ? "f32 (widened exactly)" : "int8",
                 options.cpu.q8_0_f32_activations ? "" : " (this host's faster path)");
    return std::unique_ptr<Device>(*std::move(device));
  }
};

const BackendRegistrar<CpuBackend> registrar;

}  // namespace
}  // namespace moebatch
