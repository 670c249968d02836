// DeepSeek's cpu ops (cpu_attention/ops/deepseek_ops.h) against float64 formulas of the
// transformers code they follow: DeepseekV2MoEGate (greedy, group_limited_greedy),
// DeepseekV3TopkRouter (noaux_tc) and MLA's RoPE (interleaved pairs and
// halves) checked by the dot products transformers' rotated q and k give. (The absorbed query
// itself is checked end to end by the golden fixtures tiny-deepseek-v2 / -v3.)
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cpu_attention/ops/deepseek_ops.h"

using namespace moebatch;

namespace {

// The expected top-k (as a sorted id list) and weights by id, the plain way in float64.
struct Expected {
  std::vector<int32_t> ids;
  std::vector<double> weight_of;  // [experts]
};

Expected Route(const std::vector<float>& logit, const std::vector<float>& bias, TopkMethod method,
               int64_t top_k, int64_t n_group, int64_t topk_group, bool renorm, double scaling) {
  const int64_t e = static_cast<int64_t>(logit.size());
  std::vector<double> score(e), choice(e);
  if (method == TopkMethod::kNoauxTc) {
    for (int64_t i = 0; i < e; ++i) {
      score[i] = 1.0 / (1.0 + std::exp(-double(logit[i])));
      choice[i] = score[i] + bias[i];
    }
  } else {
    double mx = *std::max_element(logit.begin(), logit.end()), sum = 0;
    for (int64_t i = 0; i < e; ++i) sum += score[i] = std::exp(double(logit[i]) - mx);
    for (int64_t i = 0; i < e; ++i) choice[i] = score[i] /= sum;
  }
  if (method != TopkMethod::kGreedy) {
    const int64_t per = e / n_group;
    std::vector<std::pair<double, int64_t>> groups;
    for (int64_t g = 0; g < n_group; ++g) {
      std::vector<double> c(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(c.rbegin(), c.rend());
      groups.push_back({method == TopkMethod::kNoauxTc ? c[0] + c[1] : c[0], g});
    }
    std::sort(groups.begin(), groups.end(), [](auto a, auto b) { return a.first > b.first; });
    for (int64_t g = topk_group; g < n_group; ++g) {
      for (int64_t i = 0; i < per; ++i) choice[groups[g].second * per + i] = 0.0;
    }
  }
  std::vector<int32_t> order(e);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  Expected x;
  x.ids.assign(order.begin(), order.begin() + top_k);
  double sum = 0;
  for (int32_t id : x.ids) sum += score[id];
  x.weight_of.assign(e, 0.0);
  for (int32_t id : x.ids) x.weight_of[id] = (renorm ? score[id] / sum : score[id]) * scaling;
  std::sort(x.ids.begin(), x.ids.end());
  return x;
}

}  // namespace

TEST_CASE("RouterDeepseek: greedy, group_limited_greedy and noaux_tc as transformers'",
          "[ops][deepseek]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  struct Setting {
    TopkMethod method;
    int64_t experts, top_k, n_group, topk_group;
    bool renorm;
    float scaling;
  };
  for (const Setting& st : {Setting{TopkMethod::kGreedy, 12, 3, 1, 1, false, 1.5f},
                            Setting{TopkMethod::kGreedy, 64, 6, 1, 1, true, 1.0f},
                            Setting{TopkMethod::kGroupLimitedGreedy, 12, 3, 4, 2, false, 1.5f},
                            Setting{TopkMethod::kGroupLimitedGreedy, 160, 6, 8, 3, false, 16.f},
                            Setting{TopkMethod::kNoauxTc, 16, 4, 4, 2, true, 2.5f},
                            Setting{TopkMethod::kNoauxTc, 256, 8, 8, 4, true, 2.5f},
                            Setting{TopkMethod::kNoauxTc, 18, 5, 3, 3, false, 1.0f}}) {
    const int64_t tokens = 9, e = st.experts;
    std::vector<float> logits(tokens * e), bias(e);
    for (float& x : logits) x = normal(rng);
    for (float& x : bias) x = 0.3f * normal(rng);
    std::vector<int32_t> ids(tokens * st.top_k);
    std::vector<float> weights(tokens * st.top_k);
    REQUIRE(cpu_ops::RouterDeepseek(logits.data(), bias.data(), tokens, e, st.top_k, st.method,
                                    st.n_group, st.topk_group, st.renorm, st.scaling, ids.data(),
                                    weights.data())
                .ok());
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> logit(logits.begin() + t * e, logits.begin() + (t + 1) * e);
      const Expected x =
          Route(logit, bias, st.method, st.top_k, st.n_group, st.topk_group, st.renorm, st.scaling);
      std::vector<int32_t> got(ids.begin() + t * st.top_k, ids.begin() + (t + 1) * st.top_k);
      INFO("method " << static_cast<int>(st.method) << ", experts " << e << ", token " << t);
      for (int64_t j = 0; j < st.top_k; ++j) {
        CHECK(weights[t * st.top_k + j] == Approx(x.weight_of[got[j]]).epsilon(1e-5).margin(1e-7));
      }
      std::sort(got.begin(), got.end());
      CHECK(got == x.ids);
    }
  }
  // Bad arguments.
  std::vector<float> l(12), w(3);
  std::vector<int32_t> i(3);
  CHECK(!cpu_ops::RouterDeepseek(l.data(), nullptr, 1, 12, 3, TopkMethod::kSoftmax, 1, 1, false,
                                 1.0f, i.data(), w.data())
             .ok());
  CHECK(!cpu_ops::RouterDeepseek(l.data(), nullptr, 1, 12, 3, TopkMethod::kNoauxTc, 4, 2, false,
                                 1.0f, i.data(), w.data())
             .ok());  // no bias
  CHECK(!cpu_ops::RouterDeepseek(l.data(), l.data(), 1, 12, 7, TopkMethod::kGroupLimitedGreedy, 4,
                                 2, false, 1.0f, i.data(), w.data())
             .ok());  // top-7 of 2 groups of 3
  CHECK(!cpu_ops::RouterDeepseek(l.data(), l.data(), 1, 12, 3, TopkMethod::kGroupLimitedGreedy, 5,
                                 2, false, 1.0f, i.data(), w.data())
             .ok());  // 5 groups do not divide 12
}

TEST_CASE("MlaRope: q . k after rotation equals transformers' (interleaved and halves)",
          "[ops][deepseek]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t d = 16, half = d / 2, stride = 21;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / d);
  const float scaling = 1.07f;
  for (bool interleave : {true, false}) {
    const int64_t qpos = 37, kpos = 5;
    std::vector<float> q(stride), k(stride);
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    // Expected: the pairs (2i, 2i+1) (interleave) or (i, i + d/2) rotated by pos * inv_freq[i],
    // times the scaling (complex multiply, as DeepSeek-V2's apply_rotary_emb), in float64.
    auto rotate = [&](const std::vector<float>& x, int64_t pos) {
      std::vector<double> y(d);
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
        const double f = double(pos) * inv_freq[i], c = std::cos(f) * scaling,
                     s = std::sin(f) * scaling;
        y[a] = x[a] * c - x[b] * s;
        y[b] = x[b] * c + x[a] * s;
      }
      return y;
    };
    const std::vector<double> qe = rotate(q, qpos), ke = rotate(k, kpos);
    double want = 0;
    for (int64_t i = 0; i < d; ++i) want += qe[i] * ke[i];
    const float tail_q = q[d], tail_k = k[d];
    const int64_t qp[] = {qpos}, kp[] = {kpos};
    REQUIRE(
        cpu_ops::MlaRope(q.data(), 1, 1, stride, d, qp, inv_freq.data(), scaling, interleave).ok());
    REQUIRE(
        cpu_ops::MlaRope(k.data(), 1, 1, stride, d, kp, inv_freq.data(), scaling, interleave).ok());
    double got = 0;
    for (int64_t i = 0; i < d; ++i) got += double(q[i]) * k[i];
    INFO("interleave " << interleave);
    CHECK(got == Approx(want).epsilon(1e-5));
    CHECK(q[d] == tail_q);  // past d: untouched
    CHECK(k[d] == tail_k);
  }
  float x[4];
  const int64_t pos[] = {0};
  CHECK(!cpu_ops::MlaRope(x, 1, 1, 4, 3, pos, x, 1.0f, true).ok());  // odd d
}
