// engine/offload/pipeline_profiler.h: the least-squares line, n_real, a real measurement on the cpu
// backend's device, and the profile cache.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "cpu_attention/backend/cpu_device.h"
#include "engine/offload/pipeline_profiler.h"
#include "engine/model/weight_store.h"

namespace moebatch {
namespace {

TEST_CASE("pipeline profiler: the line through the points and n_real", "[profiler]") {
  // Exactly on a line: 2 ms + 0.01 ms per token.
  std::vector<ProfilePoint> exact;
  for (int64_t n : {256, 512, 1024, 2048, 4096}) exact.push_back({n, 2e-3 + 1e-5 * n});
  auto fit = FitLine(exact);
  REQUIRE(fit.ok());
  REQUIRE(fit->slope == Approx(1e-5).epsilon(1e-9));
  REQUIRE(fit->intercept == Approx(2e-3).epsilon(1e-9));
  REQUIRE(fit->r2 == Approx(1.0));
  // A layer that takes 100 ms to transfer saturates at 100 ms / 0.01 ms = 10,000 tokens (§6.3).
  auto n = TokensToSaturate(*fit, 0.1);
  REQUIRE(n.ok());
  REQUIRE(*n == 10000);

  // Noisy points: the least-squares slope of (1,1), (2,3), (3,2) is 0.5, intercept 1.
  auto noisy = FitLine({{1, 1.0}, {2, 3.0}, {3, 2.0}});
  REQUIRE(noisy.ok());
  REQUIRE(noisy->slope == Approx(0.5));
  REQUIRE(noisy->intercept == Approx(1.0));
  REQUIRE(noisy->r2 == Approx(0.25));

  REQUIRE(FitLine({{64, 1.0}, {64, 2.0}}).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(TokensToSaturate(*fit, 0.0).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(TokensToSaturate(LineFit{1.0, -1e-6, 0.5}, 0.1).status().code() ==
          absl::StatusCode::kInvalidArgument);
}

TEST_CASE("pipeline profiler: measures a real device; time grows with tokens", "[profiler]") {
  auto config = LoadModelConfig(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral");
  REQUIRE(config.ok());
  // A wider synthetic layer than the fixture's so the GEMMs dominate the timing.
  ModelConfig c = *config;
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  auto store = WeightStore::Synthetic(c, 2, 1, WeightStoreOptions{});
  REQUIRE(store.ok());
  auto one = WeightStore::View(**store, 1);
  REQUIRE(one.ok());
  REQUIRE((*one)->num_layers() == 1);
  REQUIRE((*one)->layer(0).data == (*store)->layer(0).data);  // shared, not copied
  auto device = CpuDevice::Create((*one)->config(), (*one)->weights(), CpuDeviceOptions{});
  REQUIRE(device.ok());
  auto points = MeasureLayerTimes(**device, {64, 256, 1024}, 2);
  REQUIRE(points.ok());
  REQUIRE(points->size() == 3);
  for (const ProfilePoint& p : *points) REQUIRE(p.seconds > 0);
  auto fit = FitLine(*points);
  REQUIRE(fit.ok());
  INFO("slope " << fit->slope << " s/token, intercept " << fit->intercept << ", r2 " << fit->r2);
  REQUIRE(fit->slope > 0);
  REQUIRE(points->back().seconds > points->front().seconds);
  REQUIRE(WeightStore::View(**store, 3).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("pipeline profiler: profiles are cached per model, device and budget", "[profiler]") {
  const std::string dir = "/tmp/moebatch_profile_test_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto config = LoadModelConfig(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral");
  REQUIRE(config.ok());
  const std::string key = ProfileKey(*config, "NVIDIA H100 80GB HBM3", int64_t{16} << 30);
  INFO(key);
  REQUIRE(key.find("MixtralForCausalLM-h64") == 0);
  REQUIRE(key.find("NVIDIA_H100_80GB_HBM3-16.00GiB") != std::string::npos);
  REQUIRE(key.find('/') == std::string::npos);
  REQUIRE(ProfileKey(*config, "NVIDIA H100 80GB HBM3", int64_t{24} << 30) != key);

  REQUIRE(LoadProfile(dir, key).status().code() == absl::StatusCode::kNotFound);
  PipelineProfile p;
  p.points = {{256, 0.010}, {512, 0.015}};
  p.fit = LineFit{0.005, 2e-5, 1.0};
  p.layer_transfer_seconds = 0.09;
  p.n_real = 4500;
  REQUIRE(SaveProfile(dir, key, p).ok());
  auto back = LoadProfile(dir, key);
  REQUIRE(back.ok());
  REQUIRE(back->n_real == 4500);
  REQUIRE(back->points.size() == 2);
  REQUIRE(back->points[1].tokens == 512);
  REQUIRE(back->fit.slope == 2e-5);
  REQUIRE(back->layer_transfer_seconds == 0.09);

  {
    std::ofstream broken(dir + "/profiles/" + key + ".json");
    broken << "{\"points\": [";
  }
  auto bad = LoadProfile(dir, key);
  REQUIRE(bad.status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(bad.status().message().find(key) != std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moebatch
