// engine/offload/gpu_memory_plan.h on the Mixtral-8x7B shape: the budget of a T4 / L4.
#include <catch2/catch.hpp>
#include <string>

#include "engine/offload/gpu_memory_plan.h"
#include "engine/model/weight_store.h"

namespace moebatch {
namespace {

// Mixtral-8x7B-v0.1's config.json.
ModelConfig Mixtral8x7B() { return *KnownModelConfig("mixtral-8x7b"); }

constexpr int64_t kGiB = int64_t{1} << 30;

TEST_CASE("GPU memory plan: Mixtral-8x7B on a 16 GiB and a 24 GiB budget", "[gpu_memory]") {
  const ModelConfig c = Mixtral8x7B();
  const int64_t layer = WeightStore::RequiredBytes(c, 1, DType::kBF16) -
                        WeightStore::RequiredBytes(c, 0, DType::kBF16);
  // 8 experts x 3 x [14336, 4096] bf16 + attention (q, o 32 MiB; k, v 8 MiB) + norms and router.
  REQUIRE(layer == 8 * 3 * int64_t{14336} * 4096 * 2 + 2 * 32 * (int64_t{1} << 20) +
                       2 * 8 * (int64_t{1} << 20) + 2 * 4096 * 2 + 8 * 4096 * 2);

  auto plan = PlanGpuMemory(c, DType::kBF16, layer, 4096, 16 * kGiB);
  REQUIRE(plan.ok());
  REQUIRE(plan->total_bytes ==
          2 * layer + plan->resident_bytes + plan->activation_bytes + plan->workspace_bytes);
  REQUIRE(plan->total_bytes <= 16 * kGiB);
  REQUIRE(plan->resident_bytes == int64_t{32001} * 4096 * 2);
  REQUIRE(plan->activation_bytes == 4096 * GpuActivationBytesPerToken(c, DType::kBF16));
  INFO(plan->ToString());
  REQUIRE(plan->ToString().find("4096 tokens/pass") != std::string::npos);

  for (int64_t budget : {16 * kGiB, 24 * kGiB}) {
    const int64_t most = MaxTokensPerPassForBudget(c, DType::kBF16, layer, budget);
    INFO("budget " << budget << ": " << most << " tokens");
    REQUIRE(most > 4096);
    REQUIRE(PlanGpuMemory(c, DType::kBF16, layer, most, budget).ok());
    auto over = PlanGpuMemory(c, DType::kBF16, layer, most + 1, budget);
    REQUIRE(over.status().code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(over.status().message().find("at most " + std::to_string(most) + " tokens") !=
            std::string::npos);
  }
  REQUIRE(MaxTokensPerPassForBudget(c, DType::kBF16, layer, 24 * kGiB) >
          MaxTokensPerPassForBudget(c, DType::kBF16, layer, 16 * kGiB));
  // f16 (T4) takes the same bytes as bf16; f32 activations and weights take more.
  REQUIRE(GpuActivationBytesPerToken(c, DType::kF16) ==
          GpuActivationBytesPerToken(c, DType::kBF16));
  REQUIRE(GpuActivationBytesPerToken(c, DType::kF32) > GpuActivationBytesPerToken(c, DType::kBF16));
}

TEST_CASE("GPU memory plan: resident layers in the room the pass leaves", "[gpu_memory]") {
  const ModelConfig c = Mixtral8x7B();
  const int64_t layer = WeightStore::RequiredBytes(c, 1, DType::kBF16) -
                        WeightStore::RequiredBytes(c, 0, DType::kBF16);
  const int64_t aligned = (layer + 255) / 256 * 256;
  // An L4 (24 GiB) at a pass of 12,000 tokens (about n_real there): slots, lm_head and activations
  // take ~12.3 GiB, so four 2.70 GiB layers fit beside them, a fifth does not.
  const int64_t r = MaxResidentLayers(c, DType::kBF16, layer, 12000, 24 * kGiB, 32);
  REQUIRE(r == 4);
  auto plan = PlanGpuMemory(c, DType::kBF16, layer, 12000, 24 * kGiB, r);
  REQUIRE(plan.ok());
  REQUIRE(plan->resident_layer_bytes == r * aligned);
  REQUIRE(plan->total_bytes == 2 * layer + plan->resident_bytes + r * aligned +
                                   plan->activation_bytes + plan->workspace_bytes);
  REQUIRE(plan->total_bytes <= 24 * kGiB);
  REQUIRE(plan->ToString().find("4 resident layers") != std::string::npos);
  REQUIRE(PlanGpuMemory(c, DType::kBF16, layer, 12000, 24 * kGiB, r + 1).status().code() ==
          absl::StatusCode::kResourceExhausted);
  // A budget the pass fills leaves none; two layers must always stream (the slots); a model of
  // two layers or fewer keeps them in the slots.
  const int64_t most = MaxTokensPerPassForBudget(c, DType::kBF16, layer, 16 * kGiB);
  REQUIRE(MaxResidentLayers(c, DType::kBF16, layer, most, 16 * kGiB, 32) == 0);
  REQUIRE(MaxResidentLayers(c, DType::kBF16, layer, 16, 80 * kGiB, 32) > 20);
  REQUIRE(MaxResidentLayers(c, DType::kBF16, layer, 16, 1000 * kGiB, 32) == 30);
  REQUIRE(MaxResidentLayers(c, DType::kBF16, layer, 16, 80 * kGiB, 2) == 0);
  REQUIRE(MaxResidentLayers(c, DType::kBF16, layer, most + 1, 16 * kGiB, 32) == 0);  // no plan
  REQUIRE(PlanGpuMemory(c, DType::kBF16, layer, 16, 16 * kGiB, -1).status().code() ==
          absl::StatusCode::kInvalidArgument);
  // The hint of a refused plan counts the resident layers.
  const int64_t beside = MaxTokensPerPassForBudget(c, DType::kBF16, layer, 24 * kGiB, 2);
  REQUIRE(beside < MaxTokensPerPassForBudget(c, DType::kBF16, layer, 24 * kGiB) -
                       2 * aligned / GpuActivationBytesPerToken(c, DType::kBF16) + 1);
  auto over = PlanGpuMemory(c, DType::kBF16, layer, beside + 1, 24 * kGiB, 2);
  REQUIRE(over.status().code() == absl::StatusCode::kResourceExhausted);
  INFO(over.status().message());
  REQUIRE(over.status().message().find("at most " + std::to_string(beside) +
                                       " tokens per pass fit beside 2 resident layers") !=
          std::string::npos);
  REQUIRE(PlanGpuMemory(c, DType::kBF16, layer, beside, 24 * kGiB, 2).ok());
}

TEST_CASE("GPU memory plan: the automatic tokens per pass", "[gpu_memory]") {
  const ModelConfig c = Mixtral8x7B();
  const int64_t layer = WeightStore::RequiredBytes(c, 1, DType::kBF16) -
                        WeightStore::RequiredBytes(c, 0, DType::kBF16);
  // A T4 budget: all the activations fit below the cap (an L4's 34,420 tokens are just above it);
  // resident layers asked for come first, automatic ones (-1) do not (they take what the pass
  // leaves).
  REQUIRE(MaxTokensPerPassForBudget(c, DType::kBF16, layer, 16 * kGiB) <
          kMaxAutomaticTokensPerPass);
  for (int64_t budget : {16 * kGiB, 24 * kGiB}) {
    const int64_t all = MaxTokensPerPassForBudget(c, DType::kBF16, layer, budget);
    CAPTURE(budget, all);
    const int64_t automatic = std::min(all, kMaxAutomaticTokensPerPass);
    REQUIRE(AutomaticTokensPerPass(c, DType::kBF16, layer, budget, 32, -1) == automatic);
    REQUIRE(AutomaticTokensPerPass(c, DType::kBF16, layer, budget, 32, 0) == automatic);
    const int64_t with_two = AutomaticTokensPerPass(c, DType::kBF16, layer, budget, 32, 2);
    REQUIRE(with_two == std::min(kMaxAutomaticTokensPerPass,
                                 MaxTokensPerPassForBudget(c, DType::kBF16, layer, budget, 2)));
    REQUIRE(with_two > 0);
    REQUIRE(with_two < all - (2 * layer) / GpuActivationBytesPerToken(c, DType::kBF16) + 1);
    REQUIRE(PlanGpuMemory(c, DType::kBF16, layer, with_two, budget, 2).ok());
  }
  // A large GPU: capped. Resident layers beyond num_layers - 2 count as num_layers - 2.
  REQUIRE(AutomaticTokensPerPass(c, DType::kBF16, layer, 77 * kGiB, 32, -1) ==
          kMaxAutomaticTokensPerPass);
  REQUIRE(AutomaticTokensPerPass(c, DType::kBF16, layer, 77 * kGiB, 4, 100) ==
          std::min(kMaxAutomaticTokensPerPass,
                   MaxTokensPerPassForBudget(c, DType::kBF16, layer, 77 * kGiB, 2)));
  REQUIRE(AutomaticTokensPerPass(c, DType::kBF16, layer, 4 * kGiB, 32, -1) == 0);
}

TEST_CASE("GPU memory plan: budgets too small and bad arguments", "[gpu_memory]") {
  const ModelConfig c = Mixtral8x7B();
  const int64_t layer = int64_t{3} << 30;
  auto small = PlanGpuMemory(c, DType::kBF16, layer, 1, 4 * kGiB);
  REQUIRE(small.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(small.status().message().find("alone do not fit") != std::string::npos);
  REQUIRE(MaxTokensPerPassForBudget(c, DType::kBF16, layer, 4 * kGiB) == 0);
  REQUIRE(PlanGpuMemory(c, DType::kBF16, layer, 0, 16 * kGiB).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(PlanGpuMemory(c, DType::kBF16, 0, 16, 16 * kGiB).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(PlanGpuMemory(c, DType::kBF16, layer, 16, -1).status().code() ==
          absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moebatch
