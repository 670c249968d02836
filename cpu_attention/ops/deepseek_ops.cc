// DeepSeek's routers and MLA helpers on the CPU (semantics: cpu_attention/ops/deepseek_ops.h).
// Checked by tests/cpu_attention/test_deepseek_ops.cc and, end to end, by the golden fixtures.
#include "cpu_attention/ops/deepseek_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu_attention/ops/ops.h"
#include "cpu_attention/ops/ops_common.h"

namespace moebatch::cpu_ops {

absl::Status RouterDeepseek(const float* logits, const float* bias, int64_t tokens, int64_t experts,
                            int64_t top_k, TopkMethod method, int64_t n_group, int64_t topk_group,
                            bool renormalize, float scaling, int32_t* ids, float* weights) {
  constexpr const char* kFn = "RouterDeepseek";
  if (method == TopkMethod::kSoftmax) return Invalid(kFn, "method kSoftmax is RouterTopK's");
  const bool grouped = method != TopkMethod::kGreedy;
  if (!grouped) n_group = topk_group = 1;
  if (tokens < 0 || experts < 1 || experts > kMaxInt32 || n_group < 1 || experts % n_group != 0 ||
      topk_group < 1 || topk_group > n_group || top_k < 1 ||
      top_k > topk_group * (experts / n_group) ||
      (method == TopkMethod::kNoauxTc && experts / n_group < 2)) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " experts=", experts, " top_k=", top_k,
                   " n_group=", n_group, " topk_group=", topk_group);
  }
  if (tokens == 0) return absl::OkStatus();
  if (logits == nullptr || ids == nullptr || weights == nullptr ||
      (method == TopkMethod::kNoauxTc && bias == nullptr)) {
    return Invalid(kFn, "null pointer");
  }
  const int64_t per_group = experts / n_group;
  std::vector<float> scores(experts), choice(experts), group_score(n_group);
  std::vector<int64_t> order(experts), group_order(n_group);
  std::vector<char> keep(n_group);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logit = logits + t * experts;
    if (method == TopkMethod::kNoauxTc) {
      for (int64_t e = 0; e < experts; ++e) {
        scores[e] = 1.0f / (1.0f + std::exp(-logit[e]));  // router_logits.sigmoid()
        choice[e] = scores[e] + bias[e];
      }
    } else {  // logits.softmax(dim=-1, dtype=float32)
      const float max_logit = *std::max_element(logit, logit + experts);
      float sum = 0.0f;
      for (int64_t e = 0; e < experts; ++e) sum += scores[e] = std::exp(logit[e] - max_logit);
      for (int64_t e = 0; e < experts; ++e) choice[e] = scores[e] /= sum;
    }
    if (grouped) {
      for (int64_t g = 0; g < n_group; ++g) {
        const float* c = choice.data() + g * per_group;
        if (method == TopkMethod::kNoauxTc) {  // topk(2).sum()
          float first = -INFINITY, second = -INFINITY;
          for (int64_t i = 0; i < per_group; ++i) {
            if (c[i] > first) {
              second = first;
              first = c[i];
            } else if (c[i] > second) {
              second = c[i];
            }
          }
          group_score[g] = first + second;
        } else {  // max(dim=-1)
          group_score[g] = *std::max_element(c, c + per_group);
        }
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::partial_sort(group_order.begin(), group_order.begin() + topk_group, group_order.end(),
                        [&](int64_t a, int64_t b) {
                          return group_score[a] > group_score[b] ||
                                 (group_score[a] == group_score[b] && a < b);
                        });
      std::fill(keep.begin(), keep.end(), 0);
      for (int64_t g = 0; g < topk_group; ++g) keep[group_order[g]] = 1;
      for (int64_t e = 0; e < experts; ++e) {
        if (!keep[e / per_group]) choice[e] = 0.0f;  // masked_fill(~score_mask, 0.0)
      }
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int64_t a, int64_t b) {
      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
    });
    float top_sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) top_sum += scores[order[j]];
    if (method == TopkMethod::kNoauxTc) top_sum += 1e-20f;
    for (int64_t j = 0; j < top_k; ++j) {
      float w = scores[order[j]];
      if (renormalize) w /= top_sum;
      ids[t * top_k + j] = static_cast<int32_t>(order[j]);
      weights[t * top_k + j] = w * scaling;
    }
  }
  return absl::OkStatus();
}

absl::Status MlaRope(float* x, int64_t tokens, int64_t heads, int64_t stride, int64_t d,
                     const int64_t* positions, const float* inv_freq, float attention_scaling,
                     bool interleave) {
  constexpr const char* kFn = "MlaRope";
  if (tokens < 0 || heads < 1 || d < 2 || d % 2 != 0 || stride < d) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " heads=", heads, " d=", d, " stride=", stride,
                   " (d even, d >= 2, stride >= d)");
  }
  if (tokens == 0) return absl::OkStatus();
  if (x == nullptr || positions == nullptr || inv_freq == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  // The vectors gathered into [tokens, heads, d], the pairs (2i, 2i + 1) moved to (i, i + d/2)
  // with interleave (apply_rotary_pos_emb_interleave's view/transpose), rotated by ApplyRope's
  // rotate_half arithmetic, and put back in that order.
  const int64_t half = d / 2, n = tokens * heads;
  std::vector<float> v(static_cast<size_t>(n * d));
  for (int64_t r = 0; r < n; ++r) {
    const float* src = x + r * stride;
    float* dst = v.data() + r * d;
    for (int64_t i = 0; i < half; ++i) {
      dst[i] = interleave ? src[2 * i] : src[i];
      dst[i + half] = interleave ? src[2 * i + 1] : src[i + half];
    }
  }
  if (absl::Status st =
          ApplyRope(v.data(), tokens, heads, d, positions, inv_freq, attention_scaling);
      !st.ok()) {
    return st;
  }
  for (int64_t r = 0; r < n; ++r) std::copy_n(v.data() + r * d, d, x + r * stride);
  return absl::OkStatus();
}

}  // namespace moebatch::cpu_ops
