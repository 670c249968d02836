// The pipeline profiler (MoE-Lens §6.3, Fig. 7): the tokens per pass n_real at which the device's
// GEMM time for a layer reaches the time to transfer that layer's weights, i.e. the measured n of
// eq. 2. Below n_real a pass waits for PCIe; above it the GPU is saturated and more tokens per pass
// only delay prefill/decode overlap, so the scheduler's token budget defaults to n_real.
//
// Method, as §6.3 describes it: time the device's task A + task B of one layer for several token
// counts (the weights resident, so no transfer is in the timing), fit a least-squares line
// time = intercept + slope * tokens, measure the time to copy one layer's weights, and take
// n_real = transfer time / slope (the paper uses the slope and the transfer time; the intercept,
// fixed per-call overhead, is reported next to it).
//
// Results are cached as JSON in `<data_dir>/profiles/<key>.json`, the key naming the model shape,
// the device and the GPU budget, so a restart does not profile again.
//
// Threading: Profile drives the device from the calling thread; the rest is pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device.h"

namespace moebatch {

struct ProfilePoint {
  int64_t tokens = 0;
  double seconds = 0;  // device time of task A + task B of one layer (best of the repetitions)
};

struct LineFit {
  double intercept = 0;  // seconds
  double slope = 0;      // seconds per token
  double r2 = 0;         // coefficient of determination of the fit
};

// Least squares over the points. InvalidArgument with fewer than two distinct token counts.
absl::StatusOr<LineFit> FitLine(const std::vector<ProfilePoint>& points);

struct PipelineProfile {
  std::vector<ProfilePoint> points;
  LineFit fit;
  double layer_transfer_seconds = 0;  // one layer's weights host -> device
  int64_t n_real = 0;                 // transfer / slope, tokens per pass
};

// n_real for a fit and a transfer time (tokens, rounded down). InvalidArgument for a slope or a
// transfer time that is not positive (e.g. the cpu backend, whose weights never move).
absl::StatusOr<int64_t> TokensToSaturate(const LineFit& fit, double layer_transfer_seconds);

// Times `device` (layer 0, micro-batch 0) at each token count, `repeats` times each (best kept),
// with synthetic token ids and positions 0..n-1. The device must hold layer 0's weights resident
// (a one-layer device: e.g. CreateCudaDevice over WeightStore::View(store, 1)). The transfer time
// is the caller's (the data mover's counters, or bench_cuda_backend). Token counts must fit the
// device's planned tokens per pass.
absl::StatusOr<std::vector<ProfilePoint>> MeasureLayerTimes(Device& device,
                                                            const std::vector<int64_t>& tokens,
                                                            int repeats);

// The cache: a key from the model shape, the device name and the budget (e.g.
// "MixtralForCausalLM-h4096-f14336-l32-e8k2-a32kv8d128-NVIDIA_H100_80GB_HBM3-16.00GiB"), and JSON
// files under <data_dir>/profiles/ (written to a temporary name, then renamed). Load: NotFound
// when absent, DataLoss naming the file when it is not a profile.
std::string ProfileKey(const ModelConfig& config, const std::string& device_name,
                       int64_t gpu_budget_bytes);
absl::Status SaveProfile(const std::string& data_dir, const std::string& key,
                         const PipelineProfile& profile);
absl::StatusOr<PipelineProfile> LoadProfile(const std::string& data_dir, const std::string& key);

}  // namespace moebatch
