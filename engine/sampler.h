// Per-request sampling: greedy, temperature, top-k, top-p, seeded. Mirrors the order of
// transformers' logits processors / vLLM's sampler: temperature -> top-k -> top-p -> draw.
//
// Determinism: each sequence owns its random generator (std::mt19937_64 seeded from `seed`, or
// from std::random_device when unset) and draws exactly one number per sampled token, so the same
// seed gives the same tokens whatever else is in the batch.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moebatch {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax); must be in [0, 100]
  int32_t top_k = 0;         // 0 = off; else keep the k most likely tokens
  float top_p = 1.0f;        // (0, 1]; 1 = off; else keep the smallest set with mass >= top_p
  std::optional<uint64_t> seed;
  int32_t max_tokens = 256;       // generated tokens at most (>= 1)
  std::vector<std::string> stop;  // stop strings: generation ends when the text contains one;
                                  // the text is cut before it
  bool ignore_eos = false;        // keep generating after EOS (benchmarks, golden tests)

  // InvalidArgument naming the field ("temperature: must be in [0, 100], got -1").
  absl::Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from `logits` [vocab] (f32, unnormalised). `scratch` avoids reallocating.
  // Greedy ties go to the lowest id (torch.argmax's choice).
  int32_t Sample(const float* logits, int32_t vocab_size);
  // Temperature 0: Sample is the argmax and draws nothing, so the device may pick the token
  // (Device::GreedyTokens) without the logits ever reaching the sampler.
  bool greedy() const { return params_.temperature == 0.0f; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> probs_;
};

}  // namespace moebatch
