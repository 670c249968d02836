// Per-request sampling: greedy, temperature, top-k, top-p, seeded. Mirrors the order of
// transformers' logits processors / vLLM's sampler: temperature -> top-k -> top-p -> draw.
//
// Determinism: each sequence owns its random generator (std::mt19937_64 seeded from `seed`, or
// from std::random_device when unset) and draws exactly one number per sampled token, so the same
// seed gives the same tokens whatever else is in the batch. A request's choice i (n > 1) seeds its
// generator with ChoiceSeed(seed, i): choice 0 uses the seed itself (what n = 1 draws), the others
// differ, and the whole set is reproducible.
//
// Log-probabilities (TokenLogprobs): the log-softmax of the model's raw logits, before temperature,
// top-k and top-p: the distribution OpenAI and vLLM report by default.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace moebatch {

constexpr int32_t kMaxChoices = 16;      // SamplingParams::n at most
constexpr int32_t kMaxTopLogprobs = 20;  // SamplingParams::top_logprobs at most (OpenAI's limit)

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax); must be in [0, 100]
  int32_t top_k = 0;         // 0 = off; else keep the k most likely tokens
  float top_p = 1.0f;        // (0, 1]; 1 = off; else keep the smallest set with mass >= top_p
  std::optional<uint64_t> seed;
  int32_t max_tokens = 256;       // generated tokens at most (>= 1)
  std::vector<std::string> stop;  // stop strings: generation ends when the text contains one;
                                  // the text is cut before it
  bool ignore_eos = false;        // keep generating after EOS (benchmarks, golden tests)
  int32_t n = 1;                  // choices generated from the prompt, [1, kMaxChoices]
  bool logprobs = false;          // report each generated token's log-probability
  int32_t top_logprobs = 0;       // [0, kMaxTopLogprobs]: also the most likely tokens at each
                                  // position; > 0 needs logprobs
  bool json_object = false;       // JSON mode: the reply is a JSON object (engine/text/
                                  // json_output.h masks the logits); not with ignore_eos

  // InvalidArgument naming the field ("temperature: must be in [0, 100], got -1").
  absl::Status Validate() const;
};

// The seed of choice `choice` of a request seeded with `seed`: `seed` for choice 0, else
// splitmix64(seed + choice * 0x9E3779B97F4A7C15) (Steele et al. 2014's finaliser, as
// std::seed_seq-free seeding of independent streams).
uint64_t ChoiceSeed(uint64_t seed, int32_t choice);

// One generated token's log-probabilities: natural logs of the softmax of the raw logits.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first; equal values
                                               // in increasing id order
};

// log_softmax(logits)[token] and the top_k largest entries of a row `logits` [vocab] (f32, finite),
// as torch.log_softmax(logits.float(), dim=-1) computes it (what transformers'
// compute_transition_scores(normalize_logits=True) applies to raw scores): max-subtracted, the sum
// of exponentials in f64, then logits[v] - max - log(sum) rounded to f32. top_k in [0, vocab].
// O(vocab * log(top_k)).
TokenLogprob TokenLogprobs(const float* logits, int32_t vocab_size, int32_t token, int32_t top_k);

class Sampler {
 public:
  // `choice`: which of the request's n choices this sampler draws for (ChoiceSeed).
  explicit Sampler(const SamplingParams& params, int32_t choice = 0);
  // Picks the next token from `logits` [vocab] (f32, unnormalised). `scratch` avoids reallocating.
  // Greedy ties go to the lowest id (torch.argmax's choice).
  int32_t Sample(const float* logits, int32_t vocab_size);
  // Temperature 0: Sample is the argmax and draws nothing, so the device may pick the token
  // (Device::GreedyTokens) without the logits ever reaching the sampler.
  bool greedy() const { return params_.temperature == 0.0f; }
  // Greedy, no log-probabilities asked and no JSON mode: only then may the device pick the
  // token, since log-probabilities and JSON mode's mask need the whole row of logits.
  bool device_greedy() const { return greedy() && !params_.logprobs && !params_.json_object; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> probs_;
};

}  // namespace moebatch
