// engine/plan/cpu_roofline.h: the bytes and FLOPs of a pass the engine ran (against the
// checkpoint's tensors summed field by field here), the planned decode and prefill passes
// (against the formulas written out), and which bound a pass names.
#include <catch2/catch.hpp>
#include <cmath>

#include "engine/model/checkpoint.h"
#include "engine/plan/cpu_roofline.h"
#include "tests/support/golden.h"

using namespace moebatch;

namespace {

double Bytes(const TensorInfo* t) { return t != nullptr ? static_cast<double>(t->nbytes) : 0.0; }
double Elements(const TensorInfo* t) { return t != nullptr ? static_cast<double>(t->numel()) : 0; }

}  // namespace

TEST_CASE("PassWorkOf counts the checkpoint's tensors: layers once, experts as touched") {
  for (const char* fixture :
       {"tiny-mixtral", "tiny-qwen2-moe", "tiny-olmoe", "tiny-llama", "tiny-dbrx"}) {
    INFO(fixture);
    auto checkpoint = Checkpoint::Load(testing::FixtureDir(fixture));
    REQUIRE(checkpoint.ok());
    const ModelConfig& c = (*checkpoint)->config();
    const ModelWeights& w = (*checkpoint)->weights();
    PassCounts stats;
    stats.tokens = 3;
    stats.experts_touched = 5;
    stats.expert_token_pairs = 7;
    stats.kv_tokens_read = 40;
    const double kv_per_token_layer = 2.0 * c.kv_size() * 4;  // f32 K and V
    const PassWork work = PassWorkOf(c, w, stats, kv_per_token_layer, /*logits_rows=*/2);

    // The same sums, field by field.
    double fixed_bytes = 0, fixed_matrix_elements = 0, expert_bytes = 0, expert_elements = 0;
    double experts = 0;
    for (const LayerWeights& l : w.layers) {
      for (const TensorInfo* t : {l.input_layernorm, l.post_attention_layernorm, l.q_bias, l.k_bias,
                                  l.v_bias, l.o_bias, l.q_norm, l.k_norm}) {
        fixed_bytes += Bytes(t);
      }
      for (const TensorInfo* t :
           {l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.router, l.shared_expert.w1,
            l.shared_expert.w2, l.shared_expert.w3, l.shared_expert_gate}) {
        fixed_bytes += Bytes(t);
        fixed_matrix_elements += Elements(t);
      }
      for (const ExpertWeights& e : l.experts) {
        expert_bytes += Bytes(e.w1) + Bytes(e.w2) + Bytes(e.w3);
        expert_elements += Elements(e.w1) + Elements(e.w2) + Elements(e.w3);
        experts += 1;
      }
    }
    REQUIRE(experts > 0);
    const double layers = static_cast<double>(c.num_hidden_layers);
    const double want_bytes = fixed_bytes + 5 * expert_bytes / experts +
                              3 * Bytes(w.embed_tokens) / c.vocab_size + Bytes(w.lm_head);
    const double want_flops = 2 * 3 * fixed_matrix_elements + 2 * 7 * expert_elements / experts +
                              2 * 2 * Elements(w.lm_head) + 4.0 * c.q_size() * 40 * layers;
    CHECK(work.weight_bytes == Approx(want_bytes).epsilon(1e-12));
    CHECK(work.flops == Approx(want_flops).epsilon(1e-12));
    CHECK(work.kv_bytes == 40 * layers * kv_per_token_layer);

    // No logits: no lm_head.
    const PassWork no_logits = PassWorkOf(c, w, stats, kv_per_token_layer, 0);
    CHECK(work.weight_bytes - no_logits.weight_bytes == Approx(Bytes(w.lm_head)));
  }
}

TEST_CASE("planned passes: uniform routing, decode and prefill written out") {
  auto config = KnownModelConfig("mixtral-8x7b");
  REQUIRE(config.has_value());
  auto shape = ModelShapeFromConfig(*config, DType::kBF16, DType::kBF16);
  REQUIRE(shape.ok());
  const ModelShape& m = *shape;
  CHECK(ExpectedExpertsTouched(m, 1) == Approx(2.0));
  CHECK(ExpectedExpertsTouched(m, 2) == Approx(8 * (1 - 0.75 * 0.75)));
  CHECK(ExpectedExpertsTouched(m, 1000) == Approx(8.0));

  const double h = 4096, q = 4096, kv = 1024, layers = 32, expert = 3 * 4096.0 * 14336;
  const double attention = 2 * h * q + 2 * h * kv, router = h * 8, vocab = 32000;
  // One sequence at context 100: 2 experts per layer, 2 of them computed.
  PassWork d = DecodePassWork(m, 1, 100);
  CHECK(d.weight_bytes ==
        Approx(2 * (layers * (attention + router + 2 * expert) + h + vocab * h)).epsilon(1e-12));
  CHECK(d.flops == Approx(2 * (layers * (attention + router + 2 * expert)) + 2 * vocab * h +
                          4 * q * 100 * layers)
                       .epsilon(1e-12));
  CHECK(d.kv_bytes == Approx(100 * KvBytesPerToken(m)));
  CHECK(KvBytesPerToken(m) == 131072);
  // Prefill of 2 prompts of 10 tokens: 20 rows, all 8 experts touched (nearly), 55 keys per prompt.
  PassWork p = PrefillPassWork(m, 2, 10);
  const double touched = ExpectedExpertsTouched(m, 20);
  CHECK(p.weight_bytes ==
        Approx(2 * (layers * (attention + router + touched * expert) + 20 * h + vocab * h))
            .epsilon(1e-12));
  CHECK(p.flops == Approx(2 * 20 * layers * (attention + router + 2 * expert) + 2 * 2 * vocab * h +
                          4 * q * 2 * 55 * layers)
                       .epsilon(1e-12));
  CHECK(p.kv_bytes == Approx(20 * KvBytesPerToken(m)));
}

TEST_CASE("RooflineOf names the longer side as the bound") {
  const PassWork work{2e9, 1e9, 6e11};  // 3 GB, 600 GFLOP
  const Roofline memory = RooflineOf(work, {25e9, 100e12});
  CHECK(memory.memory_seconds == Approx(0.12));
  CHECK(memory.compute_seconds == Approx(0.006));
  CHECK(memory.seconds() == Approx(0.12));
  CHECK(std::string(memory.bound_name()) == "memory");
  const Roofline compute = RooflineOf(work, {25e9, 1e12});
  CHECK(compute.seconds() == Approx(0.6));
  CHECK(std::string(compute.bound_name()) == "compute");
  const Roofline unknown = RooflineOf(work, {});
  CHECK(unknown.seconds() == 0);
}
