#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace moebatch {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f && temperature <= 100.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be in [0, 100], got ", temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k: must be >= 0, got ", top_k));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p: must be in (0, 1], got ", top_p));
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: must be >= 1, got ", max_tokens));
  }
  if (n < 1 || n > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: must be in [1, ", kMaxChoices, "], got ", n));
  }
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs: must be in [0, ", kMaxTopLogprobs, "], got ", top_logprobs));
  }
  if (top_logprobs > 0 && !logprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs: needs logprobs to be true, got ", top_logprobs));
  }
  if (json_object && ignore_eos) {
    return absl::InvalidArgumentError(
        "ignore_eos: cannot be combined with JSON mode, whose reply ends at EOS once its object "
        "is closed");
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "]: must not be empty"));
    }
  }
  return absl::OkStatus();
}

uint64_t ChoiceSeed(uint64_t seed, int32_t choice) {
  if (choice == 0) return seed;
  uint64_t z = seed + static_cast<uint64_t>(choice) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

TokenLogprob TokenLogprobs(const float* logits, int32_t vocab_size, int32_t token, int32_t top_k) {
  float max = logits[0];
  for (int32_t v = 1; v < vocab_size; ++v) max = std::max(max, logits[v]);
  double sum = 0.0;
  for (int32_t v = 0; v < vocab_size; ++v) sum += std::exp(static_cast<double>(logits[v] - max));
  const double log_sum = std::log(sum);
  auto logprob = [&](int32_t v) {
    return static_cast<float>(static_cast<double>(logits[v] - max) - log_sum);
  };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob(token);
  if (top_k <= 0) return out;
  // The top_k largest logits (ties to the lower id), kept sorted in `best` by insertion.
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> best;
  best.reserve(top_k + 1);
  for (int32_t v = 0; v < vocab_size; ++v) {
    if (static_cast<int32_t>(best.size()) == top_k && !before(v, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), v, before), v);
    if (static_cast<int32_t>(best.size()) > top_k) best.pop_back();
  }
  out.top.reserve(best.size());
  for (int32_t v : best) out.top.emplace_back(v, logprob(v));
  return out;
}

namespace {
uint64_t InitialSeed(const std::optional<uint64_t>& seed, int32_t choice) {
  if (seed) return ChoiceSeed(*seed, choice);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}
}  // namespace

Sampler::Sampler(const SamplingParams& params, int32_t choice)
    : params_(params), rng_(InitialSeed(params.seed, choice)) {}

int32_t Sampler::Sample(const float* logits, int32_t vocab_size) {
  if (params_.temperature == 0.0f) {
    // torch.argmax: the first maximum wins.
    return static_cast<int32_t>(std::max_element(logits, logits + vocab_size) - logits);
  }
  const float inv_t = 1.0f / params_.temperature;
  candidates_.resize(vocab_size);
  for (int32_t i = 0; i < vocab_size; ++i) candidates_[i] = {logits[i] * inv_t, i};
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  // After filtering, candidates_[0, keep) is sorted by descending logit whenever a filter applies
  // (partial_sort for top-k, a full sort for top-p alone); without filters order does not matter.
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else if (params_.top_p < 1.0f) {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the kept candidates (max-subtracted, double accumulation).
  float max_logit = -INFINITY;
  for (size_t i = 0; i < keep; ++i) max_logit = std::max(max_logit, candidates_[i].first);
  probs_.resize(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs_[i] = std::exp(candidates_[i].first - max_logit);
    total += probs_[i];
  }
  if (params_.top_p < 1.0f) {
    // Nucleus: the smallest prefix (in descending probability) whose mass reaches top_p; the
    // most likely token is always kept.
    double mass = 0.0;
    size_t n = 0;
    while (n < keep) {
      mass += probs_[n] / total;
      ++n;
      if (mass >= params_.top_p) break;
    }
    keep = n;
    total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += probs_[i];
  }
  // One uniform draw per token (see the determinism note in the header).
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * total;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (u < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace moebatch
