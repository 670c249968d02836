// Prefill attention on the device (engine/device.h AttendsPrefill, MoE-Lens §6.4): the model
// runner's side of it, on the CPU. The cuda backend attends prefill segments on the GPU
// (gpu::PrefillAttention, checked by tests/test_cuda_kernels*.cc and the cuda backend's golden
// tests on a GPU host); here a CpuDevice wrapped to attend the segments itself, in float64 from
// the q/k/v of task A, checks what the runner does with such a device:
//  * which rows it hands to the device (sequences whose whole context is in the pass) and that
//    the CPU does not attend them (their q is poisoned with NaN after the device has used it);
//  * the logits of mixed passes (whole prompts, a continued chunk, decode tokens), with and
//    without VSLPipe, equal the plain cpu backend's within f32 rounding, sliding window included.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "cpu_attention/backend/cpu_device.h"
#include "engine/model_runner.h"
#include "tests/support/golden.h"
#include "tests/support/mixed_passes.h"

namespace moebatch {
namespace {

using testing::FixtureDir;

// A CpuDevice that also attends the prefill segments in task A.
class PrefillAttendingDevice final : public Device {
 public:
  explicit PrefillAttendingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return "cpu+prefill"; }
  const ModelConfig& config() const override { return inner_->config(); }
  void BeginPass(int micro_batches) override { inner_->BeginPass(micro_batches); }
  bool AttendsPrefill() const override { return true; }
  absl::Status Embed(int mb, const int32_t* ids, const int64_t* pos, int64_t tokens) override {
    segments_[mb].clear();
    tokens_[mb] = tokens;
    return inner_->Embed(mb, ids, pos, tokens);
  }
  absl::Status SetPrefillSegments(int mb, const int32_t* cu_rows, int64_t n) override {
    segments_[mb].assign(cu_rows, cu_rows + (n > 0 ? n + 1 : 0));
    for (size_t s = 0; s < segments_[mb].size(); ++s) {
      if (segments_[mb][s] < 0 || segments_[mb][s] > tokens_[mb] ||
          (s > 0 && segments_[mb][s] < segments_[mb][s - 1])) {
        return absl::InvalidArgumentError("bad segments");
      }
    }
    return absl::OkStatus();
  }
  absl::Status TaskA(int mb, int64_t layer, float* q, float* k, float* v, float* attn) override {
    if (auto st = inner_->TaskA(mb, layer, q, k, v, nullptr); !st.ok()) return st;
    const ModelConfig& c = config();
    const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
    const int64_t d = c.head_dim, window = c.sliding_window.value_or(0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const std::vector<int32_t>& cu = segments_[mb];
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      for (int64_t i = cu[s]; i < cu[s + 1]; ++i) {
        const int64_t first = window > 0 ? std::max<int64_t>(cu[s], i - window + 1) : cu[s];
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t g = h / (heads / kv_heads);
          const float* qi = q + (i * heads + h) * d;
          std::vector<double> score;
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j = first; j <= i; ++j) {
            const float* kj = k + (j * kv_heads + g) * d;
            double dot = 0;
            for (int64_t x = 0; x < d; ++x) dot += double(qi[x]) * kj[x];
            score.push_back(dot * scale);
            mx = std::max(mx, score.back());
          }
          double sum = 0;
          for (double& e : score) sum += (e = std::exp(e - mx));
          for (int64_t x = 0; x < d; ++x) {
            double o = 0;
            for (int64_t j = first; j <= i; ++j)
              o += score[j - first] * v[(j * kv_heads + g) * d + x];
            attn[(i * heads + h) * d + x] = static_cast<float>(o / sum);
          }
        }
        ++rows_attended;
      }
    }
    // The runner must not attend these rows on the CPU: poison their q.
    if (!cu.empty()) {
      std::fill(q + cu.front() * heads * d, q + cu.back() * heads * d,
                std::numeric_limits<float>::quiet_NaN());
    }
    return absl::OkStatus();
  }
  absl::Status TaskB(int mb, int64_t layer, const float* attn, ForwardStats* stats) override {
    return inner_->TaskB(mb, layer, attn, stats);
  }
  absl::Status Logits(int mb, const int64_t* rows, int64_t n, float* logits) override {
    return inner_->Logits(mb, rows, n, logits);
  }
  int64_t rows_attended = 0;  // summed over layers

 private:
  std::unique_ptr<Device> inner_;
  std::vector<int32_t> segments_[kMaxMicroBatches];
  int64_t tokens_[kMaxMicroBatches] = {};
};

struct Run {
  std::vector<float> logits1, logits2;
  ForwardStats stats1, stats2;
  int64_t device_rows = 0;  // PrefillAttendingDevice::rows_attended, over both passes
};

// tests/support/mixed_passes.h's two passes on a fixture: the whole prompts (all 84 rows of pass 1, the
// new 17-token prompt of pass 2) go to the device, the continued chunk and decode tokens to the
// CPU; its 40-token prompt is longer than tiny-mixtral-swa's sliding window, so the window
// applies on the device side too.
Run RunTwoPasses(const Checkpoint& checkpoint, bool device_prefill, bool vslpipe) {
  const ModelConfig& c = checkpoint.config();
  auto cpu = CpuDevice::Create(c, checkpoint.weights(), CpuDeviceOptions{DType::kF32});
  REQUIRE(cpu.ok());
  PrefillAttendingDevice* wrapped = nullptr;
  std::unique_ptr<Device> device = *std::move(cpu);
  if (device_prefill) {
    auto w = std::make_unique<PrefillAttendingDevice>(std::move(device));
    wrapped = w.get();
    device = std::move(w);
  }
  ModelRunner runner(std::move(device), ModelRunnerOptions{vslpipe});
  KvCacheConfig kc{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, 32, DType::kF32};
  auto cache = PagedKvCache::Create(kc);
  REQUIRE(cache.ok());
  const auto passes = testing::MakeMixedPasses(c.vocab_size);
  Run run;
  REQUIRE(runner.Forward(passes->first, **cache, &run.logits1, &run.stats1).ok());
  REQUIRE(runner.Forward(passes->second, **cache, &run.logits2, &run.stats2).ok());
  if (wrapped != nullptr) run.device_rows = wrapped->rows_attended;
  return run;
}

void CheckClose(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, ref = 0;
  size_t not_finite = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    not_finite += !std::isfinite(got[i]);
    err = std::max(err, double(std::abs(got[i] - want[i])));
    ref = std::max(ref, double(std::abs(want[i])));
  }
  INFO("max abs difference " << err << " of max " << ref);
  REQUIRE(not_finite == 0);
  REQUIRE(ref > 0);
  REQUIRE(err <= 1e-5 * ref);
}

TEST_CASE("device prefill: whole-context sequences go to the device, the rest to the CPU",
          "[device_prefill]") {
  for (const char* fixture : {"tiny-mixtral", "tiny-mixtral-swa", "tiny-mixtral-hd128"}) {
    auto checkpoint = Checkpoint::Load(FixtureDir(fixture));
    REQUIRE(checkpoint.ok());
    const int64_t layers = (*checkpoint)->config().num_hidden_layers;
    const Run plain = RunTwoPasses(**checkpoint, false, false);
    REQUIRE(plain.stats1.device_attention_tokens == 0);
    for (bool vslpipe : {false, true}) {
      INFO(fixture << (vslpipe ? ", VSLPipe" : ", plain pass"));
      const Run dev = RunTwoPasses(**checkpoint, true, vslpipe);
      // Pass 1: all 84 rows are whole contexts; pass 2: only the new 17-token prompt.
      REQUIRE(dev.stats1.device_attention_tokens == 84);
      REQUIRE(dev.stats2.device_attention_tokens == 17);
      REQUIRE(dev.device_rows == (84 + 17) * layers);
      CheckClose(dev.logits1, plain.logits1);
      CheckClose(dev.logits2, plain.logits2);
    }
  }
}

TEST_CASE("device prefill: a device without it refuses segments", "[device_prefill]") {
  auto checkpoint = Checkpoint::Load(FixtureDir("tiny-mixtral"));
  REQUIRE(checkpoint.ok());
  auto cpu = CpuDevice::Create((*checkpoint)->config(), (*checkpoint)->weights(),
                               CpuDeviceOptions{DType::kF32});
  REQUIRE(cpu.ok());
  REQUIRE_FALSE((*cpu)->AttendsPrefill());
  const int32_t cu[] = {0, 4};
  REQUIRE((*cpu)->SetPrefillSegments(0, cu, 1).code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE((*cpu)->SetPrefillSegments(0, cu, 0).ok());
}

}  // namespace
}  // namespace moebatch
