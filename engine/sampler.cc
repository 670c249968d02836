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
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "]: must not be empty"));
    }
  }
  return absl::OkStatus();
}

namespace {
uint64_t InitialSeed(const std::optional<uint64_t>& seed) {
  if (seed) return *seed;
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}
}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(InitialSeed(params.seed)) {}

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
