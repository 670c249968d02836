// engine/plan/perf_model.h against the MoE-Lens paper's own figures: Table 2 (tokens and KV cache
// to saturate an A40, L40 and A100 with Mixtral-8x7B), the model sizes of §7, and equations 1-13 on
// cases worked by hand (the arithmetic is in the comments). Then the properties §5.5 states:
// Stage 2 tends to Stage 1 as K grows and b -> 1; and the limiting-bound switch points.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>

#include "engine/model/model_config.h"
#include "engine/model/weight_store.h"
#include "engine/plan/perf_model.h"

namespace moebatch {
namespace {

constexpr double kGB = 1e9;

// Mixtral-8x7B-v0.1's config.json.
ModelConfig Mixtral8x7BConfig() { return *KnownModelConfig("mixtral-8x7b"); }

ModelShape Mixtral8x7B() {
  auto shape = ModelShapeFromConfig(Mixtral8x7BConfig(), DType::kBF16);
  REQUIRE(shape.ok());
  return *shape;
}

// The paper's A40 host (§5.1 example: C_GPU = 150 TFLOPS, B = 32 GB/s). CPU memory bandwidth
// effectively unlimited unless a test sets it: the paper's equations have no CPU bound.
HardwareSpec A40(double kv_memory_bytes = 70 * kGB) {
  HardwareSpec hw;
  hw.pcie_bytes_per_s = 32 * kGB;
  hw.gpu_flops = 150e12;
  hw.cpu_mem_bytes_per_s = 1e18;
  hw.kv_memory_bytes = kv_memory_bytes;
  return hw;
}

// MTBench (Table 3: p = 98) at g = 128, the paper's batch of 20k, 16-token blocks.
Workload MtBench(double kv_bytes = 70 * kGB) {
  Workload w;
  w.prompt_tokens = 98;
  w.gen_tokens = 128;
  w.batch_size = 20000;
  w.block_size = 16;
  w.kv_budget_bytes = kv_bytes;
  return w;
}

double RelDiff(double ours, double paper) { return ours / paper - 1; }

TEST_CASE("Table 2: tokens and KV cache to saturate A40/L40/A100 on Mixtral-8x7B, within 5%",
          "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  struct Row {
    const char* gpu;
    double tflops, tokens, kv256_gb, kv512_gb;  // the paper's Table 2
  };
  // B = 32 GB/s for all three (PCIe 4.0 x16, the paper's eq. 2 example).
  // Ours (eq. 2, n = C/B * N_e/N_k; KV = n * seq_len * 131072 bytes, GB = 1e9 bytes):
  //   A40  150e12 / 32e9 * 4 = 18750 (-2.3%); 18750 * 256 * 131072 = 629.1 GB (+2.5%), 1258.3 GB
  //   L40  181e12 / 32e9 * 4 = 22625 (-2.5%); 759.2 GB (+2.5%), 1518.3 GB (+2.5%)
  //   A100 312e12 / 32e9 * 4 = 39000 (-2.5%); 1308.6 GB (+2.5%), 2617.2 GB (+2.5%)
  // The paper's tokens are C[TFLOPS] * 128 exactly (19200 = 150 * 1024 / 32 * 4: a TFLOP read as
  // 1024 GFLOP), and its KV sizes are those tokens * seq_len * 0.125 MiB / 1000.
  const Row rows[] = {{"A40", 150, 19.2e3, 614, 1228},
                      {"L40", 181, 23.2e3, 741, 1482},
                      {"A100", 312, 40.0e3, 1277, 2554}};
  for (const Row& row : rows) {
    HardwareSpec hw = A40();
    hw.gpu_flops = row.tflops * 1e12;
    const double tokens = TokensToSaturateGpuEq2(m, hw);
    const double kv256 = KvBytesToSaturateGpu(m, hw, 256) / kGB;
    const double kv512 = KvBytesToSaturateGpu(m, hw, 512) / kGB;
    INFO(row.gpu << ": tokens " << tokens << " vs " << row.tokens << ", KV(256) " << kv256
                 << " GB vs " << row.kv256_gb << ", KV(512) " << kv512 << " GB vs "
                 << row.kv512_gb);
    CHECK(std::abs(RelDiff(tokens, row.tokens)) < 0.05);
    CHECK(std::abs(RelDiff(kv256, row.kv256_gb)) < 0.05);
    CHECK(std::abs(RelDiff(kv512, row.kv512_gb)) < 0.05);
  }
  // §5.1's text: "supporting 512-token sequences would require 1.2TB" (A40).
  CHECK(std::abs(RelDiff(KvBytesToSaturateGpu(m, A40(), 512), 1.2e12)) < 0.05);
  // Exact values, so a change in the formula shows: 18750 tokens, 18750 * 256 * 131072 bytes.
  CHECK(TokensToSaturateGpuEq2(m, A40()) == Approx(18750).epsilon(1e-12));
  CHECK(KvBytesToSaturateGpu(m, A40(), 256) == Approx(18750.0 * 256 * 131072).epsilon(1e-12));
}

TEST_CASE("Model sizes of §7 and KV bytes per token", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  // Per layer: q, o 2 * 4096^2 = 33554432; k, v 2 * 4096 * 1024 = 8388608; router 8 * 4096 =
  // 32768; experts 3 * 8 * 4096 * 14336 = 1409286144; norms 8192; sum 1451270144. x 32 layers
  // = 46440644608, + embedding and lm_head 2 * 32000 * 4096 = 262144000, + final norm 4096
  // = 46702792704 parameters (Mixtral-8x7B's published count); x 2 bytes.
  CHECK(ModelWeightBytes(m) == 2.0 * 46702792704);
  CHECK(LayerWeightBytes(m) == 2.0 * 1451270144);  // one layer region, what moebatch streams
  // The engine's weight store agrees: a layer region of Mixtral-8x7B in bf16.
  CHECK(LayerWeightBytes(m) ==
        static_cast<double>(WeightStore::RequiredBytes(Mixtral8x7BConfig(), 1, DType::kBF16) -
                            WeightStore::RequiredBytes(Mixtral8x7BConfig(), 0, DType::kBF16)));
  CHECK(std::abs(RelDiff(ModelWeightBytes(m), 94 * kGB)) < 0.01);  // "94GB" (§7)
  // 2 (K, V) * 32 layers * 8 KV heads * 128 * 2 bytes.
  CHECK(KvBytesPerToken(m) == 131072);

  ModelConfig c = Mixtral8x7BConfig();  // Mixtral-8x22B: "141B ... 282GB" (§7)
  c.vocab_size = 32768;
  c.hidden_size = 6144;
  c.intermediate_size = 16384;
  c.num_hidden_layers = 56;
  c.num_attention_heads = 48;
  auto big = ModelShapeFromConfig(c, DType::kBF16);
  REQUIRE(big.ok());
  CHECK(std::abs(RelDiff(ModelWeightBytes(*big), 282 * kGB)) < 0.01);

  // A real config.json through LoadModelConfig: tiny-mixtral (4 layers, 2 KV heads x 16).
  auto tiny_config = LoadModelConfig(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral");
  REQUIRE(tiny_config.ok());
  auto tiny = ModelShapeFromConfig(*tiny_config, tiny_config->torch_dtype, DType::kF32);
  REQUIRE(tiny.ok());
  CHECK(tiny->num_layers == 4);
  CHECK(tiny->head_dim == 16);
  CHECK(tiny->weight_bytes_per_element == 2);
  CHECK(KvBytesPerToken(*tiny) == 2.0 * 4 * 2 * 16 * 4);
}

// The families' shapes (shared experts, dense layers, dense models): the weights the model counts
// against the published parameter counts and against the weight store's layer regions.
TEST_CASE("Model sizes of the families: shared experts and dense layers counted", "[perf_model]") {
  for (const auto& [name, billions] :
       {std::pair{"qwen2-57b-a14b", 57.41}, std::pair{"qwen3-30b-a3b", 30.53},
        std::pair{"olmoe-1b-7b", 6.92}, std::pair{"llama-3.1-8b", 8.03}, std::pair{"dbrx", 132.0},
        std::pair{"deepseek-v2-lite", 15.71}}) {
    INFO(name);
    const std::optional<ModelConfig> c = KnownModelConfig(name);
    REQUIRE(c.has_value());
    auto m = ModelShapeFromConfig(*c, DType::kBF16);
    REQUIRE(m.ok());
    // The published sizes (Hugging Face model cards), within 1%.
    CHECK(std::abs(RelDiff(ModelWeightBytes(*m) / 2, billions * 1e9)) < 0.01);
    // Against the weight store's byte count of all layers (within 0.5%: norms and alignment).
    const double store =
        static_cast<double>(WeightStore::RequiredBytes(*c, c->num_hidden_layers, DType::kBF16) -
                            WeightStore::RequiredBytes(*c, 0, DType::kBF16));
    CHECK(std::abs(RelDiff(c->num_hidden_layers * LayerWeightBytes(*m), store)) < 0.005);
  }
}

// gpt-oss-20b: 20.9B parameters (openai/gpt-oss-20b's model card: 21B), 19.1B of them the experts',
// which the store (and the official files) keep in MXFP4: 17 bytes per 32 weights.
TEST_CASE("Model size of gpt-oss-20b: MXFP4 experts at 4.25 bits", "[perf_model]") {
  const std::optional<ModelConfig> c = KnownModelConfig("gpt-oss-20b");
  REQUIRE(c.has_value());
  REQUIRE(c->mxfp4_experts);
  auto m = ModelShapeFromConfig(*c, DType::kBF16);
  REQUIRE(m.ok());
  const double params = ModelWeightBytes(*m) / 2;
  CHECK(std::abs(RelDiff(params, 20.91e9)) < 0.01);
  const double experts = 24.0 * 32 * 3 * 2880 * 2880;
  const double want = experts * 17 / 32 + (params - experts) * 2;  // 13.76 GB
  const double store =
      static_cast<double>(WeightStore::RequiredBytes(*c, c->num_hidden_layers, DType::kBF16));
  CHECK(std::abs(RelDiff(store, want)) < 0.005);
}

// KV bytes per token of each family's preset against Mixtral-8x7B's (docs/performance.md):
// 2 (K, V) x layers x KV heads x head_dim x 2 bytes (bf16).
TEST_CASE("KV bytes per token of the families' presets", "[perf_model]") {
  for (const auto& [name, bytes] :
       {std::pair{"mixtral-8x7b", 131072}, std::pair{"mixtral-8x22b", 229376},
        std::pair{"qwen3-30b-a3b", 98304}, std::pair{"qwen2-57b-a14b", 57344},
        std::pair{"olmoe-1b-7b", 131072}, std::pair{"llama-3.1-8b", 131072},
        std::pair{"dbrx", 163840}, std::pair{"deepseek-v2-lite", 31104},
        std::pair{"gpt-oss-20b", 49152}}) {
    INFO(name);
    const std::optional<ModelConfig> c = KnownModelConfig(name);
    REQUIRE(c.has_value());
    auto m = ModelShapeFromConfig(*c, DType::kBF16);
    REQUIRE(m.ok());
    CHECK(KvBytesPerToken(*m) == bytes);
  }
}

// gpt-oss-20b's 12 sliding layers (window 128) keep only their window: a sequence's KV bytes per
// token fall from 49152 (every layer, up to 128 tokens) toward the 12 full layers' 24576; models
// without window layers are unchanged. The performance model's stages use the figure at p + g.
TEST_CASE("KV bytes per token of a sequence: window layers stop growing", "[perf_model]") {
  const std::optional<ModelConfig> oss = KnownModelConfig("gpt-oss-20b");
  REQUIRE(oss.has_value());
  auto m = ModelShapeFromConfig(*oss, DType::kBF16);
  REQUIRE(m.ok());
  CHECK(m->window_layers == 12);
  CHECK(m->sliding_window == 128);
  CHECK(KvBytesPerSequenceToken(*m, 100) == 49152.0);
  CHECK(KvBytesPerSequenceToken(*m, 128) == 49152.0);
  CHECK(KvBytesPerSequenceToken(*m, 1024) == 27648.0);
  CHECK(KvBytesPerSequenceToken(*m, 4096) == 25344.0);
  auto x = ModelShapeFromConfig(*KnownModelConfig("mixtral-8x7b"), DType::kBF16);
  REQUIRE(x.ok());
  CHECK(x->window_layers == 0);
  CHECK(KvBytesPerSequenceToken(*x, 4096) == 131072.0);
  // Stage 1 holds more tokens of gpt-oss's sequences in the same budget at p + g = 1024 than the
  // every-layer figure would.
  HardwareSpec hw;
  hw.pcie_bytes_per_s = 12e9;
  hw.gpu_flops = 65e12;
  hw.cpu_mem_bytes_per_s = 100e9;
  hw.kv_memory_bytes = 64e9;
  Workload w;
  w.prompt_tokens = 512;
  w.gen_tokens = 512;
  w.batch_size = 1000;
  w.block_size = 16;
  w.kv_budget_bytes = 64e9;
  auto r = PredictStage1(*m, hw, w);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->kv_tokens == Approx(64e9 / 27648.0));
}

// MLA's latent cache: one row of kv_lora_rank + qk_rope_head_dim values per token and layer
// (DeepSeek-V2-Lite: 27 x 576 x 2 bytes = 31104 in bf16), against Mixtral-8x7B's K and V of
// 8 heads x 128 in 32 layers (131072): 4.2x fewer bytes per token.
TEST_CASE("KV bytes per token: MLA's latent rows against GQA's K and V", "[perf_model]") {
  const std::optional<ModelConfig> lite = KnownModelConfig("deepseek-v2-lite");
  REQUIRE(lite.has_value());
  REQUIRE(lite->mla.has_value());
  auto m = ModelShapeFromConfig(*lite, DType::kBF16);
  REQUIRE(m.ok());
  CHECK(KvBytesPerToken(*m) == 27.0 * 576 * 2);
  const std::optional<ModelConfig> mixtral = KnownModelConfig("mixtral-8x7b");
  auto x = ModelShapeFromConfig(*mixtral, DType::kBF16);
  REQUIRE(x.ok());
  CHECK(KvBytesPerToken(*x) == 131072.0);
}

TEST_CASE("Eq. 1 and 2 by hand: GEMM intensity and tokens to saturate", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  // h = 4096, h_i = 14336 = 3.5 h, s = 4. Numerator / h^2: 6 * 2 * 3.5 + 4 + 4/4 = 47;
  // denominator / h^2: 6 * 8 * 3.5 + 5 = 173. (The paper's middle form, (6mN_k + 2 + 2/s) /
  // (6mN_e + 2 + 2/s), divides the h^2 terms by 2 but not the expert term; we use the first.)
  CHECK(GemmFlopsPerTokenPerLayer(m) == 47.0 * 4096 * 4096);
  CHECK(GemmWeightBytesPerLayer(m) == 173.0 * 4096 * 4096);
  CHECK(GemmIntensity(m, 1) == Approx(47.0 / 173));
  CHECK(GemmIntensity(m, 1000) == Approx(1000 * 47.0 / 173));
  // ~ n N_k / N_e = n / 4 within 10% (the attention projections are the difference).
  CHECK(std::abs(RelDiff(GemmIntensity(m, 1), 0.25)) < 0.1);
  // Eq. 2 on the A40: as printed 150e12 / 32e9 * 8 / 2 = 18750 (the paper rounds to 19.2k);
  // with eq. 1's exact intensity 4687.5 * 173 / 47 = 17253.99.
  CHECK(TokensToSaturateGpuEq2(m, A40()) == Approx(18750));
  CHECK(TokensToSaturateGpu(m, A40()) == Approx(4687.5 * 173 / 47));
  // T_GPU = 150e12 / (32 * 47 * 4096^2) = 5944.61 tokens/s; delta = 93405585408 / 32e9 s.
  CHECK(GpuTokensPerSecond(m, A40()) == Approx(150e12 / (32 * 47.0 * 4096 * 4096)));
  CHECK(WeightTransferSeconds(m, A40()) == Approx(93405585408.0 / 32e9));
  // f32 weights move twice the bytes for the same FLOP: twice the tokens to saturate.
  ModelShape f32 = m;
  f32.weight_bytes_per_element = 4;
  CHECK(TokensToSaturateGpuEq2(f32, A40()) == Approx(2 * 18750));
  CHECK(TokensToSaturateGpu(f32, A40()) == Approx(2 * 4687.5 * 173 / 47));
}

TEST_CASE("Eq. 3 by hand: parallelism-memory efficiency", "[perf_model]") {
  // 2 (p + g) / ((2p + g) g). p = 100, g = 128: 456 / (328 * 128) = 456 / 41984 = 0.0108613.
  CHECK(ParallelismMemoryEfficiency(100, 128) == Approx(456.0 / 41984));
  CHECK(ParallelismMemoryEfficiency(100, 128) == Approx(0.0108613).epsilon(1e-5));
  // p = 1, g = 1: 4 / 3. p = 98, g = 128 (MTBench): 452 / (324 * 128) = 0.0108989.
  CHECK(ParallelismMemoryEfficiency(1, 1) == Approx(4.0 / 3));
  CHECK(ParallelismMemoryEfficiency(98, 128) == Approx(452.0 / 41472));
  // Prompt tokens are cheaper in memory than generated ones: longer g lowers PME at equal p + g.
  CHECK(ParallelismMemoryEfficiency(192, 64) > ParallelismMemoryEfficiency(64, 192));
  // The printed sum, sum_{j=0..g} (p + j), has g + 1 terms = (g + 1)(2p + g) / 2; the closed
  // form is (p + g) over g (2p + g) / 2. For p = 100, g = 128: sum = 129 * 164 = 21156,
  // (p + g) / sum = 228 / 21156, and the closed form is that times (g + 1) / g.
  CHECK(ParallelismMemoryEfficiency(100, 128) == Approx(228.0 / 21156 * 129 / 128));
}

TEST_CASE("Eq. 4: Stage 1 on the paper's A40 host, by hand", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  auto r = PredictStage1(m, A40(), MtBench());
  REQUIRE(r.ok());
  // M = 70e9 / 131072 = 534057.6 tokens; PME = 0.0108989; PME * M = 5820.65 tokens per
  // iteration; delta = 2.918925 s -> 1994.11 tokens/s < T_GPU = 5944.61: KV capacity.
  // Generated: 1994.11 * 128 / 226 = 1129.41 tokens/s.
  CHECK(r->kv_tokens == Approx(534057.6171875));
  CHECK(r->parallel_tokens == Approx(5820.651).epsilon(1e-6));
  CHECK(r->delta_s == Approx(2.918924544));
  CHECK(r->max_tokens_per_s == Approx(1994.108).epsilon(1e-6));
  CHECK(r->max_generated_tokens_per_s == Approx(1129.406).epsilon(1e-6));
  CHECK(r->gpu_utilization == Approx(1994.108 / 5944.612).epsilon(1e-6));
  CHECK(r->bound == LimitingBound::kKvCapacity);
  CHECK(MaxThroughput(0.01, 1e6, 2, 1e9) == Approx(5000));
  CHECK(MaxThroughput(0.01, 1e6, 2, 4000) == 4000);
  // Figure 3(b)'s roofline: utilization rises linearly with the KV cache, then stays at 1.
  auto doubled = PredictStage1(m, A40(140 * kGB), MtBench(140 * kGB));
  REQUIRE(doubled.ok());
  CHECK(doubled->max_tokens_per_s == Approx(2 * r->max_tokens_per_s));
  auto huge = PredictStage1(m, A40(1000 * kGB), MtBench(1000 * kGB));
  REQUIRE(huge.ok());
  CHECK(huge->max_tokens_per_s == Approx(huge->gpu_tokens_per_s));
  CHECK(huge->bound == LimitingBound::kGpuCompute);
  // A system that moves 7/8 of Model Size per iteration (resident weights): delta shrinks by 1/8,
  // and the KV-capacity-bound throughput, PME * M / delta, grows by 8/7.
  ModelShape lighter = m;
  lighter.transferred_weight_bytes = ModelWeightBytes(m) * 7 / 8;
  CHECK(TransferredWeightBytes(m) == ModelWeightBytes(m));
  auto less = PredictStage1(lighter, A40(), MtBench());
  REQUIRE(less.ok());
  CHECK(less->delta_s == Approx(r->delta_s * 7 / 8));
  CHECK(less->model_bytes == Approx(ModelWeightBytes(m) * 7 / 8));
  CHECK(less->max_tokens_per_s == Approx(r->max_tokens_per_s * 8 / 7));
  CHECK(less->bound == LimitingBound::kKvCapacity);
}

TEST_CASE("Eq. 5 and 7 by hand", "[perf_model]") {
  // §5.3's example: KV cache twice the weights, B_IO = 20 GB/s -> B_Mem = 3 * 20 = 60 GB/s.
  CHECK(RequiredCpuMemoryBandwidth(188 * kGB, 94 * kGB, 20 * kGB) == Approx(60 * kGB));
  CHECK(CpuMemorySeconds(188 * kGB, 94 * kGB, 60 * kGB) == Approx(4.7));  // 282 / 60
  // Eq. 7: (p + g) / (p + g/2). p = 98, g = 128: 226 / 162 = 1.39506; 70 GB -> 97.654 GB.
  CHECK(EffectiveKvCapacity(70 * kGB, 98, 128) == Approx(70 * kGB * 226 / 162));
  CHECK(EffectiveKvCapacity(70, 98, 128) == Approx(97.654).epsilon(1e-5));
  // p = g: 4/3. A long prompt gains little: p = 926, g = 128 (RAG): 1054 / 990 = 1.0646.
  CHECK(EffectiveKvCapacity(3, 100, 100) == Approx(4));
  CHECK(EffectiveKvCapacity(1, 926, 128) == Approx(1054.0 / 990));
}

TEST_CASE("Eq. 8 and 9 by hand: q and the sequences decoding at once", "[perf_model]") {
  // p = 100, g = 128, b = 16: ceil((100 + i) / 16) for p + i = 100..228: 100..112 -> 7 (13
  // values, 91), 113..128 -> 8 (128), 129..144 -> 9 (144), 145..160 -> 10 (160), 161..176 -> 11
  // (176), 177..192 -> 12 (192), 193..208 -> 13 (208), 209..224 -> 14 (224), 225..228 -> 15 (4
  // values, 60); sum 1383 over 129 terms.
  CHECK(LifetimeKvBlocks(100, 128, 16) == 1383);
  // b = 1: sum_{i=0..128} (100 + i) = 129 * 100 + 128 * 129 / 2 = 21156.
  CHECK(LifetimeKvBlocks(100, 128, 1) == 21156);
  // N = 10000 blocks: q = 10000 / 1383 = 7.2307, g q = 925.52 sequences decoding; separate
  // stages: N / ceil(228 / 16) = 10000 / 15 = 666.67. Eq. 9 holds: 925.5 > 666.7.
  CHECK(PrefillSequencesPerIteration(10000, 100, 128, 16) == Approx(10000.0 / 1383));
  CHECK(128 * PrefillSequencesPerIteration(10000, 100, 128, 16) == Approx(925.524).epsilon(1e-5));
  CHECK(SeparateDecodeSequences(10000, 100, 128, 16) == Approx(10000.0 / 15));
  // b = 1, N = 10000 tokens: q = 0.472679, g q = 60.50 > N / (p + g) = 43.86.
  CHECK(PrefillSequencesPerIteration(10000, 100, 128, 1) == Approx(10000.0 / 21156));
  CHECK(SeparateDecodeSequences(10000, 100, 128, 1) == Approx(10000.0 / 228));
  // Eq. 9's middle step takes sum_{i=0..g} (p + i) < g (p + g), i.e. g^2 - g > 2p (b = 1). It
  // fails for long prompts and short generations: RAG's p = 926 with g = 32 gives sum = 33 * 926
  // + 528 = 31086 > 32 * 958 = 30656, so there g q < N / (p + g).
  CHECK(LifetimeKvBlocks(926, 32, 1) == 31086);
  CHECK(32 * PrefillSequencesPerIteration(10000, 926, 32, 1) <
        SeparateDecodeSequences(10000, 926, 32, 1));
  // The closed form of the block sum against the plain loop.
  for (int64_t p : {1, 7, 16, 98, 926}) {
    for (int64_t g : {1, 2, 15, 16, 17, 128, 513}) {
      for (int64_t b : {1, 3, 16, 32, 1000}) {
        int64_t sum = 0;
        for (int64_t i = 0; i <= g; ++i) sum += (p + i + b - 1) / b;
        INFO("p " << p << " g " << g << " b " << b);
        CHECK(LifetimeKvBlocks(p, g, b) == sum);
      }
    }
  }
}

TEST_CASE("Eq. 10-13 by hand", "[perf_model]") {
  // Eq. 10: K = 1000, g = 10, q = 5, delta = 2 s: 1000 * 10 / ((200 + 10) * 2) = 23.8095.
  CHECK(MemoryBoundThroughput(1000, 10, 5, 2) == Approx(10000.0 / 420));
  CHECK(MemoryBoundThroughput(1000, 10, 0, 2) == 0);
  // Eq. 11: T_GPU = 1000 tokens/iteration, p = 90, g = 10: 1000 * 90 / 100 = 900.
  CHECK(PrefillTokensPerIteration(1000, 90, 10) == Approx(900));
  // Eq. 12: prologue (900 + 1000) / 2 * 10 = 9500 tokens; K = 1000: K p = 90000,
  // It = 20 + (90000 - 9500) / 900 = 109.444. Eq. 13, delta = 2: 10000 / 218.889 = 45.685.
  CHECK(PipelineIterations(1000, 90, 10, 1000) == Approx(20 + 80500.0 / 900));
  CHECK(ComputeBoundThroughput(1000, 10, 20 + 80500.0 / 900, 2) == Approx(45.685).epsilon(1e-4));
  // Small batch (our floor g + K p / T_GPU): K = 5: eq. 12 would give 20 + (450 - 9500) / 900
  // = 9.94 iterations, less than the 10 decode steps; the floor gives 10 + 450 / 1000 = 10.45.
  CHECK(PipelineIterations(5, 90, 10, 1000) == Approx(10.45));
  // The floor meets eq. 12 at K = g T_GPU / (2p) = 10000 / 180 = 55.6 (both 15 iterations),
  // below the prologue's threshold K p = 9500 (K = 105.6): continuous, and eq. 12 itself for
  // every batch that fills the prologue.
  const double k_meet = 10000.0 / 180;
  CHECK(20 + (k_meet * 90 - 9500) / 900 == Approx(15));
  CHECK(PipelineIterations(56, 90, 10, 1000) == Approx(20 + (56 * 90 - 9500) / 900.0));
  CHECK(PipelineIterations(55, 90, 10, 1000) == Approx(10 + 55 * 90 / 1000.0));
  // g > 2p: eq. 12 = g + K (p + g) / T_GPU - g^2 / (2p) falls below the GPU's work K (p + g) /
  // T_GPU. p = 10, g = 100, T_GPU = 1000, K = 10^6: eq. 12 = 100 + 110000 - 500 = 109600 <
  // 110000, so It = 110000 and T2 = K g / (It delta) is exactly the GPU's generated-token rate.
  CHECK(PipelineIterations(1000000, 10, 100, 1000) == Approx(110000));
}

TEST_CASE("Stage 2 on the paper's A40 host", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  auto r = PredictStage2(m, A40(), MtBench());
  REQUIRE(r.ok());
  // N = floor(70e9 / (16 * 131072)) = 33378 blocks.
  CHECK(r->kv_blocks == 33378);
  CHECK(r->lifetime_blocks == LifetimeKvBlocks(98, 128, 16));
  CHECK(r->q == Approx(33378.0 / r->lifetime_blocks));
  CHECK(r->decode_sequences == Approx(128 * r->q));
  CHECK(r->decode_sequences > r->separate_decode_sequences);
  CHECK(r->t1_tokens_per_s == Approx(MemoryBoundThroughput(20000, 128, r->q, r->delta_s)));
  CHECK(r->gpu_tokens_per_iteration ==
        Approx(GpuTokensPerSecond(m, A40()) * WeightTransferSeconds(m, A40())));
  CHECK(r->tokens_per_s == std::min(r->t1_tokens_per_s, r->t2_tokens_per_s));
  CHECK(r->bound == LimitingBound::kKvCapacity);  // g q ~ 3100 < K = 20000, T1 < T2
  // Below Stage 1's generated-token bound (bounded batch, 16-token blocks).
  auto s1 = PredictStage1(m, A40(), MtBench());
  REQUIRE(s1.ok());
  CHECK(r->tokens_per_s < s1->max_generated_tokens_per_s);
  CHECK(r->tokens_per_s > 0.7 * s1->max_generated_tokens_per_s);
}

TEST_CASE("Stage 2 tends to Stage 1 as K grows and b -> 1 (§5.5)", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  for (double kv_gb : {70.0, 2000.0}) {  // KV-capacity-bound and GPU-bound
    const HardwareSpec hw = A40(kv_gb * kGB);
    Workload w = MtBench(kv_gb * kGB);
    auto s1 = PredictStage1(m, hw, w);
    REQUIRE(s1.ok());
    const double target = s1->max_generated_tokens_per_s;
    double previous = 0;
    for (int64_t k :
         {int64_t{1000}, int64_t{10000}, int64_t{100000}, int64_t{1000000}, int64_t{100000000}}) {
      w.batch_size = k;
      w.block_size = 1;
      auto s2 = PredictStage2(m, hw, w);
      REQUIRE(s2.ok());
      INFO("KV " << kv_gb << " GB, K " << k << ": " << s2->tokens_per_s << " vs " << target);
      CHECK(s2->tokens_per_s > previous);
      CHECK(s2->tokens_per_s <= target * (1 + 1e-9));
      previous = s2->tokens_per_s;
    }
    // At K = 1e8, b = 1: within 1% of Stage 1. What is left in the KV-bound case is the printed
    // sum of eq. 8 having g + 1 terms where eq. 3's closed form has g: the ratio tends to
    // g / (g + 1) = 128 / 129.
    CHECK(std::abs(RelDiff(previous, target)) < 0.01);
    if (kv_gb == 70.0) CHECK(previous / target == Approx(128.0 / 129).epsilon(1e-3));
    // b -> 1 at K = 1e8: larger blocks waste more of the cache.
    double with_larger_blocks = 0;
    for (int64_t b : {64, 16, 4, 1}) {
      w.block_size = b;
      auto s2 = PredictStage2(m, hw, w);
      REQUIRE(s2.ok());
      INFO("b " << b);
      CHECK(s2->tokens_per_s >= with_larger_blocks);
      with_larger_blocks = s2->tokens_per_s;
    }
    CHECK(with_larger_blocks == Approx(previous));
  }
}

TEST_CASE("Stage 1 bound switches: KV capacity, GPU compute, CPU attention", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  HardwareSpec hw = A40();
  const Workload w = MtBench();
  auto r = PredictStage1(m, hw, w);
  REQUIRE(r.ok());
  // PME * M = T_GPU * delta: M = 17351.87 / 0.0108989 = 1592079 tokens = 208.68 GB.
  CHECK(r->saturating_kv_bytes == Approx(208.676e9).epsilon(1e-5));
  auto t = FindBoundTransitions(m, hw, w, PerfStage::kStage1, 1 * kGB, 10000 * kGB);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 1);
  CHECK((*t)[0].below == LimitingBound::kKvCapacity);
  CHECK((*t)[0].above == LimitingBound::kGpuCompute);
  CHECK((*t)[0].kv_budget_bytes == Approx(r->saturating_kv_bytes).epsilon(1e-5));
  CHECK_FALSE((*t)[0].within_kv_memory);  // 208.7 GB > the host's 70 GB

  // CPU memory at 60 GB/s: the iteration exceeds delta once (KV + 93.41 GB) / 60 GB/s > 2.9189 s,
  // i.e. KV > 60 * 2.918925 - 93.406 = 81.73 GB, where eq. 5 asks exactly 60 GB/s. The CPU's
  // asymptotic rate PME * 60e9 / 131072 = 4989 tokens/s < T_GPU = 5945: the GPU never saturates.
  hw.cpu_mem_bytes_per_s = 60 * kGB;
  t = FindBoundTransitions(m, hw, w, PerfStage::kStage1, 1 * kGB, 10000 * kGB);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 1);
  CHECK((*t)[0].below == LimitingBound::kKvCapacity);
  CHECK((*t)[0].above == LimitingBound::kCpuAttention);
  CHECK((*t)[0].kv_budget_bytes == Approx(81.72989e9).epsilon(1e-5));
  CHECK(RequiredCpuMemoryBandwidth((*t)[0].kv_budget_bytes, ModelWeightBytes(m), 32 * kGB) ==
        Approx(60 * kGB).epsilon(1e-5));
  r = PredictStage1(m, hw, w);
  REQUIRE(r.ok());
  CHECK(std::isinf(r->saturating_kv_bytes));

  // 100 GB/s: CPU attention from 100 * 2.918925 - 93.406 = 198.49 GB, then the GPU saturates
  // where PME * M * 100e9 / (M * 131072 + 93.406e9) = T_GPU: M = 5944.61 * 93.406e9 /
  // (0.0108989 * 100e9 - 5944.61 * 131072) = 1.78701e6 tokens = 234.23 GB.
  hw.cpu_mem_bytes_per_s = 100 * kGB;
  t = FindBoundTransitions(m, hw, w, PerfStage::kStage1, 1 * kGB, 10000 * kGB);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 2);
  CHECK((*t)[0].above == LimitingBound::kCpuAttention);
  CHECK((*t)[0].kv_budget_bytes == Approx(198.4869e9).epsilon(1e-5));
  CHECK((*t)[1].below == LimitingBound::kCpuAttention);
  CHECK((*t)[1].above == LimitingBound::kGpuCompute);
  CHECK((*t)[1].kv_budget_bytes == Approx(234.2272e9).epsilon(1e-5));
  r = PredictStage1(m, hw, w);
  REQUIRE(r.ok());
  CHECK(r->saturating_kv_bytes == Approx((*t)[1].kv_budget_bytes).epsilon(1e-5));
  // Past it the GPU is saturated and the CPU reads only the KV of what the GPU processes,
  // c = T_GPU * 131072 / PME = 71.49 GB/s per second of iteration: t = W / (B - c) = 93.406 /
  // 28.51 = 3.276 s, longer than delta but the GPU's rate is reached: GPU compute.
  Workload big = w;
  big.kv_budget_bytes = 500 * kGB;
  r = PredictStage1(m, A40(500 * kGB), big);
  REQUIRE(r.ok());
  hw.kv_memory_bytes = 500 * kGB;
  r = PredictStage1(m, hw, big);
  REQUIRE(r.ok());
  const double c = r->gpu_tokens_per_s / r->pme * 131072;
  CHECK(r->iteration_s == Approx(ModelWeightBytes(m) / (100 * kGB - c)));
  CHECK(r->iteration_s == Approx(3.276).epsilon(1e-3));
  CHECK(r->kv_read_bytes == Approx(r->saturating_kv_bytes));
  CHECK(r->max_tokens_per_s == Approx(r->gpu_tokens_per_s));
  CHECK(r->bound == LimitingBound::kGpuCompute);
}

TEST_CASE("Stage 2 bound switches: KV capacity, PCIe, GPU compute", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  const HardwareSpec hw = A40();
  Workload w = MtBench();

  // K = 20000: KV capacity until T1 reaches T2, then GPU compute; T1 = T2 there.
  auto t = FindBoundTransitions(m, hw, w, PerfStage::kStage2, 1 * kGB, 10000 * kGB);
  REQUIRE(t.ok());
  REQUIRE_FALSE(t->empty());
  CHECK((*t)[0].below == LimitingBound::kKvCapacity);
  CHECK((*t)[0].above == LimitingBound::kGpuCompute);
  const double switch_bytes = (*t)[0].kv_budget_bytes;
  CHECK(switch_bytes > 70 * kGB);
  CHECK_FALSE((*t)[0].within_kv_memory);
  for (double f : {0.999, 1.001}) {
    Workload at = w;
    at.kv_budget_bytes = switch_bytes * f;
    auto r = PredictStage2(m, A40(switch_bytes * 2), at);
    REQUIRE(r.ok());
    CHECK(r->bound == (f < 1 ? LimitingBound::kKvCapacity : LimitingBound::kGpuCompute));
    CHECK(r->t1_tokens_per_s == Approx(r->t2_tokens_per_s).epsilon(0.01));
  }

  // K = 100: the whole batch fits in a 70 GB cache (g q ~ 3100 > K); every iteration waits for
  // the weights: PCIe, at most K / delta.
  w.batch_size = 100;
  auto r = PredictStage2(m, hw, w);
  REQUIRE(r.ok());
  CHECK(r->bound == LimitingBound::kPcie);
  CHECK(r->tokens_per_s <= 100 / r->delta_s);
  CHECK(r->kv_in_use_fraction < 0.05);

  // K = 2000: KV capacity below the budget where g q = K (~45 GB), PCIe above it, for good:
  // past ~510 GB T2 < T1 (the GPU prefills the 196000 prompt tokens in 11.3 iterations, the KV
  // side would admit the batch faster), but those 11.3 iterations are few next to the g = 128
  // iterations that each wait for the weights.
  w.batch_size = 2000;
  t = FindBoundTransitions(m, hw, w, PerfStage::kStage2, 1 * kGB, 10000 * kGB);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 1);
  CHECK((*t)[0].below == LimitingBound::kKvCapacity);
  CHECK((*t)[0].above == LimitingBound::kPcie);
  CHECK((*t)[0].within_kv_memory);
  w.kv_budget_bytes = (*t)[0].kv_budget_bytes;
  r = PredictStage2(m, hw, w);
  REQUIRE(r.ok());
  CHECK(r->decode_sequences == Approx(2000).epsilon(1e-3));
  w.kv_budget_bytes = 1000 * kGB;
  r = PredictStage2(m, A40(1000 * kGB), w);
  REQUIRE(r.ok());
  CHECK(r->t2_tokens_per_s < r->t1_tokens_per_s);
  CHECK(r->iterations - 128 == Approx(2000 * 98 / r->gpu_tokens_per_iteration));
  CHECK(r->bound == LimitingBound::kPcie);

  // A slow CPU: CPU attention. 10 GB/s reads the 93.4 GB of weights alone in 9.3 s > delta.
  HardwareSpec slow = hw;
  slow.cpu_mem_bytes_per_s = 10 * kGB;
  w = MtBench();
  r = PredictStage2(m, slow, w);
  REQUIRE(r.ok());
  CHECK(r->bound == LimitingBound::kCpuAttention);
  CHECK(r->iteration_s == Approx(r->cpu_iteration_s));
  CHECK(r->iteration_s > r->delta_s);
}

TEST_CASE("Invalid inputs are InvalidArgument naming the field", "[perf_model]") {
  const ModelShape m = Mixtral8x7B();
  const HardwareSpec hw = A40();
  const Workload w = MtBench();
  REQUIRE(ValidatePerfInputs(m, hw, w).ok());
  auto expect_error = [](const absl::Status& s, const std::string& field) {
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find(field) != std::string::npos);
  };
  {
    ModelShape bad = m;
    bad.hidden_size = 0;
    expect_error(PredictStage1(bad, hw, w).status(), "model.hidden_size");
    bad = m;
    bad.top_k = 9;
    expect_error(PredictStage2(bad, hw, w).status(), "model.top_k");
    bad = m;
    bad.num_kv_heads = 3;
    expect_error(ValidatePerfInputs(bad, hw, w), "model.num_heads");
    bad = m;
    bad.weight_bytes_per_element = -2;
    expect_error(ValidatePerfInputs(bad, hw, w), "model.weight_bytes_per_element");
    bad = m;
    bad.transferred_weight_bytes = -1;
    expect_error(ValidatePerfInputs(bad, hw, w), "model.transferred_weight_bytes");
  }
  {
    HardwareSpec bad = hw;
    bad.pcie_bytes_per_s = 0;
    expect_error(PredictStage1(m, bad, w).status(), "hardware.pcie_bytes_per_s");
    bad = hw;
    bad.gpu_flops = std::numeric_limits<double>::quiet_NaN();
    expect_error(PredictStage2(m, bad, w).status(), "hardware.gpu_flops");
    bad = hw;
    bad.cpu_mem_bytes_per_s = -1;
    expect_error(ValidatePerfInputs(m, bad, w), "hardware.cpu_mem_bytes_per_s");
    bad = hw;
    bad.kv_memory_bytes = std::numeric_limits<double>::infinity();
    expect_error(ValidatePerfInputs(m, bad, w), "hardware.kv_memory_bytes");
  }
  {
    Workload bad = w;
    bad.prompt_tokens = 0;
    expect_error(PredictStage1(m, hw, bad).status(), "workload.prompt_tokens");
    bad = w;
    bad.gen_tokens = -5;
    expect_error(PredictStage2(m, hw, bad).status(), "workload.gen_tokens");
    bad = w;
    bad.gen_tokens = 2'000'000'000;
    expect_error(PredictStage2(m, hw, bad).status(), "workload.gen_tokens");
    bad = w;
    bad.batch_size = 0;
    expect_error(ValidatePerfInputs(m, hw, bad), "workload.batch_size");
    bad = w;
    bad.block_size = 0;
    expect_error(ValidatePerfInputs(m, hw, bad), "workload.block_size");
    bad = w;
    bad.kv_budget_bytes = 0;
    expect_error(ValidatePerfInputs(m, hw, bad), "workload.kv_budget_bytes");
    bad = w;
    bad.kv_budget_bytes = 71 * kGB;  // more than the host's 70 GB
    expect_error(PredictStage1(m, hw, bad).status(), "workload.kv_budget_bytes");
  }
  expect_error(FindBoundTransitions(m, hw, w, PerfStage::kStage1, 10 * kGB, 1 * kGB).status(),
               "min_kv_bytes");
  expect_error(FindBoundTransitions(m, hw, w, PerfStage::kStage1, 0, 1 * kGB).status(),
               "min_kv_bytes");
  ModelConfig c = Mixtral8x7BConfig();
  c.num_key_value_heads = 0;
  expect_error(ModelShapeFromConfig(c, DType::kBF16).status(), "num_key_value_heads");
  CHECK(LimitingBoundName(LimitingBound::kPcie) == "PCIe");
  CHECK(LimitingBoundName(LimitingBound::kGpuCompute) == "GPU compute");
  CHECK(LimitingBoundName(LimitingBound::kKvCapacity) == "KV capacity");
  CHECK(LimitingBoundName(LimitingBound::kCpuAttention) == "CPU attention");
}

}  // namespace
}  // namespace moebatch
