// Sampling: greedy, temperature, top-k, top-p, seeds, validation.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "engine/sampler.h"

using namespace moebatch;

TEST_CASE("greedy picks the argmax, the first on ties") {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p);
  std::vector<float> logits = {0.1f, 3.0f, -2.0f, 3.0f};
  REQUIRE(s.Sample(logits.data(), 4) == 1);
}

TEST_CASE("top_k = 1 and a tiny top_p are greedy") {
  std::vector<float> logits = {0.1f, 0.3f, 2.5f, 2.4f, -1.0f};
  for (int i = 0; i < 20; ++i) {
    SamplingParams p;
    p.top_k = 1;
    p.seed = i;
    REQUIRE(Sampler(p).Sample(logits.data(), 5) == 2);
    SamplingParams q;
    q.top_p = 1e-6f;
    q.seed = i;
    REQUIRE(Sampler(q).Sample(logits.data(), 5) == 2);
  }
}

TEST_CASE("the same seed gives the same tokens; another seed other tokens") {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f);
  SamplingParams p;
  p.seed = 42;
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  int differ = 0;
  for (int i = 0; i < 50; ++i) {
    const int32_t x = a.Sample(logits.data(), 1000);
    REQUIRE(x == b.Sample(logits.data(), 1000));
    differ += x != c.Sample(logits.data(), 1000);
  }
  REQUIRE(differ > 10);
}

TEST_CASE("temperature sampling follows softmax(logits / T)") {
  std::vector<float> logits = {1.0f, 2.0f, 0.0f, 1.5f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 7;
    Sampler s(p);
    std::map<int, int> counts;
    const int n = 40000;
    for (int i = 0; i < n; ++i) ++counts[s.Sample(logits.data(), 4)];
    double z = 0;
    for (float l : logits) z += std::exp(l / t);
    for (int k = 0; k < 4; ++k) {
      const double want = std::exp(logits[k] / t) / z;
      REQUIRE(std::abs(counts[k] / double(n) - want) < 0.01);
    }
  }
}

TEST_CASE("top_k and top_p keep only the allowed tokens") {
  std::vector<float> logits = {0.0f, 3.0f, 2.9f, 2.8f, 0.1f, -5.0f};
  SamplingParams p;
  p.top_k = 3;
  p.seed = 1;
  Sampler s(p);
  for (int i = 0; i < 2000; ++i) {
    const int x = s.Sample(logits.data(), 6);
    REQUIRE((x == 1 || x == 2 || x == 3));
  }
  // Probabilities ~ {.03, .36, .33, .30, ...}: top_p 0.6 keeps exactly tokens 1 and 2.
  SamplingParams q;
  q.top_p = 0.6f;
  q.seed = 2;
  Sampler t(q);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[t.Sample(logits.data(), 6)];
  REQUIRE(seen.size() == 2);
  REQUIRE(seen.count(1) == 1);
  REQUIRE(seen.count(2) == 1);
}

TEST_CASE("SamplingParams::Validate names the field") {
  auto check = [](SamplingParams p, const std::string& field) {
    absl::Status st = p.Validate();
    REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(st.message()).rfind(field, 0) == 0);
  };
  SamplingParams p;
  REQUIRE(p.Validate().ok());
  p.temperature = -1;
  check(p, "temperature");
  p = {};
  p.top_p = 0;
  check(p, "top_p");
  p = {};
  p.top_k = -2;
  check(p, "top_k");
  p = {};
  p.max_tokens = 0;
  check(p, "max_tokens");
  p = {};
  p.stop = {"ok", ""};
  check(p, "stop[1]");
}
