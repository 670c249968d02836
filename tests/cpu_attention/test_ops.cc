// cpu_attention/ops/ops.h, the oracle of the CUDA kernels (tests/cuda/test_backend_ops.cc), against
// its own oracle: float64 formulas written from transformers' modeling_mixtral.py (RMSNorm, RoPE,
// eager attention, the router's softmax / top-k, SiLU-mul, the combine), independent algorithms
// for the index ops (a stable sort for the permutation, hand-written expected ids for the ties),
// hand-derived bit patterns for the conversions, and PagedAttentionReference for PrefillAttention's
// arithmetic. Tolerances: 1e-5 relative (max abs error / max abs reference) where a float sum runs
// over a row (RMSNorm, attention), 2e-6 where only a few roundings and glibc's cosf/expf (< 1 ulp)
// enter (RoPE, router weights, SiLU-mul, combine), one rounding step of the output dtype (2^-8 of
// the value for bf16, 2^-11 for f16) for 16-bit outputs; exact for indices, copies, conversions.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "cpu_attention/attention/paged_attention.h"
#include "cpu_attention/ops/ops.h"
#include "engine/model/dtype.h"

using namespace moebatch;

namespace {

constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Values stored as `dtype`: the bytes and the exact f32 value of each element.
struct Typed {
  DType dtype;
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

Typed Store(DType dtype, const std::vector<float>& x) {
  Typed t{dtype, std::vector<unsigned char>(x.size() * DTypeSize(dtype)),
          std::vector<float>(x.size())};
  ConvertFromF32(dtype, x.data(), t.bytes.data(), x.size());
  ConvertToF32(dtype, t.bytes.data(), t.values.data(), x.size());
  return t;
}

std::vector<float> Load(DType dtype, const std::vector<unsigned char>& bytes) {
  std::vector<float> out(bytes.size() / DTypeSize(dtype));
  ConvertToF32(dtype, bytes.data(), out.data(), out.size());
  return out;
}

std::vector<float> Normal(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// max |got - want| / max |want|; infinite when got holds a NaN or an infinity.
double MaxRelError(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(got[i] - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return ref > 0 ? err / ref : err;
}

// How many elements of `got` (stored as `dtype`) are further from `want` than the dtype's rounding
// (half an ulp: at most 2^-8 of the value for bf16, 2^-11 for f16, 2^-25 absolute for f16
// subnormals; nothing for f32) plus `f32_rel` of the largest |want| (the f32 error before it).
int64_t OutsideRounding(DType dtype, const std::vector<float>& got, const std::vector<double>& want,
                        double f32_rel) {
  REQUIRE(got.size() == want.size());
  double ref = 0;
  for (double w : want) ref = std::max(ref, std::abs(w));
  const double rel = dtype == DType::kBF16 ? 0x1p-8 : dtype == DType::kF16 ? 0x1p-11 : 0.0;
  const double abs_floor = dtype == DType::kF16 ? 0x1p-25 : 0.0;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed = rel * std::abs(want[i]) + abs_floor + f32_rel * ref;
    if (!(std::abs(got[i] - want[i]) <= allowed)) ++bad;
  }
  return bad;
}

bool Invalid(const absl::Status& st) {
  INFO(st.ToString());
  return st.code() == absl::StatusCode::kInvalidArgument;
}

std::vector<float> RopeInvFreq(int64_t d, float theta) {  // as CpuDevice::Create
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  }
  return inv_freq;
}

}  // namespace

TEST_CASE("cpu_ops::EmbeddingGather widens the rows of the ids, zero rows for bad ids", "[ops]") {
  std::mt19937 rng(1);
  const int64_t vocab = 50, hidden = 33, tokens = 20;
  for (DType dtype : kAllDTypes) {
    CAPTURE(DTypeName(dtype));
    const Typed table = Store(dtype, Normal(rng, vocab * hidden));
    std::vector<int32_t> ids(tokens);
    for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 7) % vocab);
    ids[3] = -1;
    ids[4] = static_cast<int32_t>(vocab);
    ids[5] = std::numeric_limits<int32_t>::min();
    std::vector<float> h(tokens * hidden, 7.0f);
    REQUIRE(cpu_ops::EmbeddingGather(table.bytes.data(), dtype, vocab, hidden, ids.data(), tokens,
                                     h.data())
                .ok());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < hidden; ++i) {
        const bool valid = ids[t] >= 0 && ids[t] < vocab;
        const float want = valid ? table.values[ids[t] * hidden + i] : 0.0f;
        REQUIRE(h[t * hidden + i] == want);
      }
    }
  }
}

using NormFn = absl::Status (*)(const float*, const void*, DType, int64_t, int64_t, float, void*,
                                DType);

// `op` against its float64 definition, every weight x output dtype and in place:
// out = weight * (x - mean) / sqrt(mean((x - mean)^2) + eps), mean = 0 unless `centered`
// (RmsNorm: MixtralRMSNorm; LayerNorm: nn.LayerNorm(bias=False)). A centered op gets rows whose
// mean is far from 0.
void CheckNorm(NormFn op, bool centered, uint32_t seed,
               std::initializer_list<std::pair<int64_t, int64_t>> shapes) {
  std::mt19937 rng(seed);
  const float eps = 1e-5f;
  for (auto [rows, n] : shapes) {
    std::vector<float> x = Normal(rng, rows * n, 3.0f);
    for (int64_t r = 0; centered && r < rows; ++r) {
      for (int64_t i = 0; i < n; ++i) x[r * n + i] += 4.0f * static_cast<float>(r % 3) - 2.5f;
    }
    for (DType wtype : kAllDTypes) {
      const Typed w = Store(wtype, Normal(rng, n));
      std::vector<double> want(rows * n);
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; centered && i < n; ++i) mean += x[r * n + i];
        mean /= n;
        for (int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean);
        const double inv = 1.0 / std::sqrt(var / n + eps);
        for (int64_t i = 0; i < n; ++i)
          want[r * n + i] = w.values[i] * ((x[r * n + i] - mean) * inv);
      }
      for (DType otype : kAllDTypes) {
        CAPTURE(rows, n, DTypeName(wtype), DTypeName(otype));
        std::vector<unsigned char> out(rows * n * DTypeSize(otype));
        REQUIRE(op(x.data(), w.bytes.data(), wtype, rows, n, eps, out.data(), otype).ok());
        const std::vector<float> got = Load(otype, out);
        if (otype == DType::kF32) {
          const double err = MaxRelError(got, want);
          CAPTURE(err);
          CHECK(err <= 1e-5);
        } else {
          CHECK(OutsideRounding(otype, got, want, 1e-5) == 0);
        }
      }
      std::vector<float> inplace = x;  // in place, f32 out
      REQUIRE(op(inplace.data(), w.bytes.data(), wtype, rows, n, eps, inplace.data(), DType::kF32)
                  .ok());
      CHECK(MaxRelError(inplace, want) <= 1e-5);
    }
  }
}

TEST_CASE("cpu_ops::RmsNorm matches MixtralRMSNorm in float64", "[ops]") {
  CheckNorm(cpu_ops::RmsNorm, false, 2, {{1, 4096}, {37, 100}, {3, 1}, {9, 6144}});
}

TEST_CASE("cpu_ops::LayerNorm matches nn.LayerNorm(bias=False) in float64", "[ops]") {
  CheckNorm(cpu_ops::LayerNorm, true, 12, {{1, 6144}, {37, 72}, {3, 1}, {9, 100}});
  std::vector<float> f(8, 1.0f);
  CHECK(!cpu_ops::LayerNorm(f.data(), f.data(), DType::kF32, 1, 0, 1e-5f, f.data(), DType::kF32)
             .ok());
  CHECK(!cpu_ops::LayerNorm(f.data(), f.data(), DType::kF32, 1, 4, -1.0f, f.data(), DType::kF32)
             .ok());
}

TEST_CASE("cpu_ops::NormalizeTopKWeights divides by torch.norm(p) in float64", "[ops]") {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  const int64_t tokens = 23;
  for (int64_t top_k : {1, 3, 8}) {
    for (float p : {2.0f, 3.0f, 0.5f, 1.5f}) {
      CAPTURE(top_k, p);
      std::vector<float> w(tokens * top_k);
      for (float& v : w) v = u(rng);
      std::vector<double> want(w.size());
      for (int64_t t = 0; t < tokens; ++t) {
        double s = 0;
        for (int64_t j = 0; j < top_k; ++j) s += std::pow(double(w[t * top_k + j]), double(p));
        const double norm = std::pow(s, 1.0 / p);
        for (int64_t j = 0; j < top_k; ++j) want[t * top_k + j] = w[t * top_k + j] / norm;
      }
      REQUIRE(cpu_ops::NormalizeTopKWeights(w.data(), tokens, top_k, p).ok());
      CHECK(MaxRelError(w, want) <= 1e-5);
    }
  }
  std::vector<float> w(4, 0.5f);
  CHECK(!cpu_ops::NormalizeTopKWeights(w.data(), 2, 2, 0.0f).ok());
  CHECK(!cpu_ops::NormalizeTopKWeights(w.data(), 2, 0, 2.0f).ok());
  CHECK(!cpu_ops::NormalizeTopKWeights(nullptr, 2, 2, 2.0f).ok());
}

TEST_CASE("cpu_ops::ApplyRope matches rotate_half in float64 with f32 angles", "[ops]") {
  std::mt19937 rng(3);
  struct Shape {
    int64_t tokens, heads, d;
  };
  for (Shape s : {Shape{37, 8, 128}, Shape{1, 4, 64}, Shape{5, 3, 2}, Shape{4, 2, 2048}}) {
    CAPTURE(s.tokens, s.heads, s.d);
    const int64_t half = s.d / 2;
    const std::vector<float> inv_freq = RopeInvFreq(s.d, 1e6f);
    std::uniform_int_distribution<int64_t> pick(0, 32767);
    std::vector<int64_t> positions(s.tokens);
    for (int64_t& p : positions) p = pick(rng);
    positions[0] = 0;
    const std::vector<float> x = Normal(rng, s.tokens * s.heads * s.d);
    // q_embed = q * cos + rotate_half(q) * sin, rotate_half(q) = [-q2, q1]; the angle is the f32
    // product pos * inv_freq (MixtralRotaryEmbedding's float matmul), cos/sin in float64.
    std::vector<double> want(x.size());
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[t]) * inv_freq[i];
        const double c = std::cos(double{angle}), sn = std::sin(double{angle});
        for (int64_t h = 0; h < s.heads; ++h) {
          const int64_t base = (t * s.heads + h) * s.d;
          const double a = x[base + i], b = x[base + i + half];
          want[base + i] = a * c - b * sn;
          want[base + i + half] = b * c + a * sn;
        }
      }
    }
    std::vector<float> got = x;
    REQUIRE(
        cpu_ops::ApplyRope(got.data(), s.tokens, s.heads, s.d, positions.data(), inv_freq.data())
            .ok());
    const double err = MaxRelError(got, want);
    CAPTURE(err);
    CHECK(err <= 2e-6);
  }
}

namespace {

struct AttentionCase {
  int64_t heads, kv_heads, d, window;
  std::vector<int32_t> cu_seqlens;
  int64_t tokens;
};

const std::vector<AttentionCase>& AttentionCases() {
  static const std::vector<AttentionCase> cases = {
      {8, 2, 64, 0, {0, 1, 18, 90}, 90},   // lengths 1, 17, 72; GQA 4
      {8, 2, 64, 16, {0, 1, 18, 90}, 90},  // sliding window 16
      {4, 4, 33, 0, {0, 37, 37, 42}, 42},  // MHA, an empty sequence, odd d
      {6, 3, 80, 5, {0, 70}, 70},          // small window
      {2, 1, 16, 1, {0, 9}, 9},            // window 1: each query sees itself only
      {2, 1, 300, 20, {3, 10, 40}, 43},    // rows 0-2 and 40-42 in no sequence; d > 256
  };
  return cases;
}

}  // namespace

TEST_CASE("cpu_ops::PrefillAttention matches causal GQA attention in float64, sinks too", "[ops]") {
  std::mt19937 rng(10);
  // gpt-oss's sinks (modeling_gpt_oss.py's eager_attention_forward): one more logit per head in
  // the softmax, its probability dropped; head 0's above every score.
  const bool with_sinks = GENERATE(false, true);
  for (const AttentionCase& c : AttentionCases()) {
    CAPTURE(c.heads, c.kv_heads, c.d, c.window, c.tokens, with_sinks);
    std::vector<float> sinks;
    if (with_sinks) {
      sinks = Normal(rng, c.heads);
      sinks[0] = 30.0f;
    }
    const int64_t num_seqs = static_cast<int64_t>(c.cu_seqlens.size()) - 1;
    const std::vector<float> q = Normal(rng, c.tokens * c.heads * c.d);
    const std::vector<float> k = Normal(rng, c.tokens * c.kv_heads * c.d);
    const std::vector<float> v = Normal(rng, c.tokens * c.kv_heads * c.d);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const float untouched = 7.0f;
    // eager_attention_forward: softmax(q kᵀ * scale + causal / sliding-window mask) v, repeat_kv.
    std::vector<double> want(c.tokens * c.heads * c.d, untouched);
    const int64_t group = c.heads / c.kv_heads;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t start = c.cu_seqlens[s], end = c.cu_seqlens[s + 1];
      for (int64_t i = start; i < end; ++i) {
        for (int64_t h = 0; h < c.heads; ++h) {
          const int64_t g = h / group;
          std::vector<double> score(c.tokens, -INFINITY);
          double max_score = -INFINITY;
          for (int64_t j = start; j <= i; ++j) {
            if (c.window > 0 && (i - start) - c.window >= (j - start)) continue;  // masked
            double dot = 0;
            for (int64_t x = 0; x < c.d; ++x) {
              dot += double(q[(i * c.heads + h) * c.d + x]) * k[(j * c.kv_heads + g) * c.d + x];
            }
            score[j] = dot * scale;
            max_score = std::max(max_score, score[j]);
          }
          if (with_sinks) max_score = std::max(max_score, double(sinks[h]));
          double sum = with_sinks ? std::exp(sinks[h] - max_score) : 0.0;
          for (int64_t j = start; j <= i; ++j) sum += std::exp(score[j] - max_score);
          double* o = want.data() + (i * c.heads + h) * c.d;
          std::fill(o, o + c.d, 0.0);
          for (int64_t j = start; j <= i; ++j) {
            const double p = std::exp(score[j] - max_score) / sum;
            for (int64_t x = 0; x < c.d; ++x) o[x] += p * v[(j * c.kv_heads + g) * c.d + x];
          }
        }
      }
    }
    std::vector<float> out(c.tokens * c.heads * c.d, untouched);
    REQUIRE(cpu_ops::PrefillAttention(q.data(), k.data(), v.data(), c.cu_seqlens.data(), num_seqs,
                                      c.tokens, c.heads, c.kv_heads, c.d, scale, c.window,
                                      out.data(), with_sinks ? sinks.data() : nullptr)
                .ok());
    const double err = MaxRelError(out, want);
    CAPTURE(err);
    CHECK(err <= 1e-5);
  }
}

TEST_CASE("cpu_ops::PrefillAttention is PagedAttentionReference's arithmetic, bit for bit",
          "[ops]") {
  // The same q/k/v through an f32 paged cache (blocks of 16 slots, each sequence's blocks
  // consecutive): the two must agree exactly.
  std::mt19937 rng(11);
  const int64_t block_size = 16;
  for (const AttentionCase& c : AttentionCases()) {
    CAPTURE(c.heads, c.kv_heads, c.d, c.window, c.tokens);
    const int64_t num_seqs = static_cast<int64_t>(c.cu_seqlens.size()) - 1;
    const std::vector<float> q = Normal(rng, c.tokens * c.heads * c.d);
    const std::vector<float> k = Normal(rng, c.tokens * c.kv_heads * c.d);
    const std::vector<float> v = Normal(rng, c.tokens * c.kv_heads * c.d);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));

    // Cache layout (kv_cache.h): block b holds keys [kv_heads][block_size][d], then the values.
    const int64_t block_floats = 2 * c.kv_heads * block_size * c.d;
    std::vector<std::vector<int32_t>> tables(num_seqs);
    int32_t next_block = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t len = c.cu_seqlens[s + 1] - c.cu_seqlens[s];
      for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) {
        tables[s].push_back(next_block++);
      }
    }
    std::vector<float> cache(std::max<int32_t>(next_block, 1) * block_floats, NAN);
    std::vector<AttentionSequence> seqs(num_seqs);
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t start = c.cu_seqlens[s], len = c.cu_seqlens[s + 1] - start;
      for (int64_t j = 0; j < len; ++j) {
        float* block = cache.data() + tables[s][j / block_size] * block_floats;
        for (int64_t g = 0; g < c.kv_heads; ++g) {
          float* key = block + (g * block_size + j % block_size) * c.d;
          std::copy_n(k.data() + ((start + j) * c.kv_heads + g) * c.d, c.d, key);
          std::copy_n(v.data() + ((start + j) * c.kv_heads + g) * c.d, c.d,
                      key + c.kv_heads * block_size * c.d);
        }
      }
      seqs[s] = AttentionSequence{tables[s].data(), start, len, len};
    }
    KvLayerView kv;
    kv.base = reinterpret_cast<std::byte*>(cache.data());
    kv.dtype = DType::kF32;
    kv.num_kv_heads = c.kv_heads;
    kv.head_dim = c.d;
    kv.block_size = block_size;
    kv.block_stride_bytes = block_floats * sizeof(float);
    kv.value_offset_bytes = c.kv_heads * block_size * c.d * sizeof(float);
    std::vector<float> want(c.tokens * c.heads * c.d, 7.0f), got = want;
    PagedAttentionReference(kv, seqs.data(), num_seqs, q.data(), c.heads, scale,
                            c.window > 0 ? std::optional<int64_t>(c.window) : std::nullopt,
                            want.data());
    REQUIRE(cpu_ops::PrefillAttention(q.data(), k.data(), v.data(), c.cu_seqlens.data(), num_seqs,
                                      c.tokens, c.heads, c.kv_heads, c.d, scale, c.window,
                                      got.data())
                .ok());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("cpu_ops::RouterTopK matches softmax / top-k / renormalise in float64", "[ops]") {
  std::mt19937 rng(4);
  struct Shape {
    int64_t experts, top_k;
  };
  for (Shape s : {Shape{8, 2}, Shape{64, 6}, Shape{5, 5}, Shape{1, 1}, Shape{100, 3}}) {
    const int64_t tokens = 50;
    CAPTURE(s.experts, s.top_k);
    const std::vector<float> logits = Normal(rng, tokens * s.experts, 2.0f);
    std::vector<int32_t> ids(tokens * s.top_k);
    std::vector<float> weights(tokens * s.top_k);
    REQUIRE(
        cpu_ops::RouterTopK(logits.data(), tokens, s.experts, s.top_k, ids.data(), weights.data())
            .ok());
    std::vector<double> want_weights;
    std::vector<int32_t> want_ids;
    for (int64_t t = 0; t < tokens; ++t) {
      // routing_weights = softmax(logits); topk; /= sum(topk).
      std::vector<double> p(s.experts);
      double max_logit = -INFINITY, sum = 0;
      for (int64_t e = 0; e < s.experts; ++e)
        max_logit = std::max<double>(max_logit, logits[t * s.experts + e]);
      for (int64_t e = 0; e < s.experts; ++e)
        sum += p[e] = std::exp(logits[t * s.experts + e] - max_logit);
      for (double& x : p) x /= sum;
      std::vector<int32_t> order(s.experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return p[a] > p[b]; });
      double top_sum = 0;
      for (int64_t j = 0; j < s.top_k; ++j) top_sum += p[order[j]];
      for (int64_t j = 0; j < s.top_k; ++j) {
        want_ids.push_back(order[j]);
        want_weights.push_back(p[order[j]] / top_sum);
      }
    }
    CHECK(ids == want_ids);
    const double err = MaxRelError(weights, want_weights);
    CAPTURE(err);
    CHECK(err <= 2e-6);
  }
}

TEST_CASE("cpu_ops::RouterTopK breaks ties to the lower expert id, descending order", "[ops]") {
  const int64_t experts = 8, top_k = 3;
  const std::vector<float> logits = {
      0,    0,    0,    0,    0,  0, 0,  0,   // all tied: 0, 1, 2
      1,    3,    3,    0,    3,  0, 0,  0,   // three tied at the top: 1, 2, 4
      0.1f, 0.5f, 0.3f, 0.7f, 0,  0, 0,  -1,  // distinct: 3, 1, 2
      -5,   -5,   2,    -5,   -5, 1, -5, 1,   // one top, then a tie: 2, 5, 7
  };
  const int64_t tokens = static_cast<int64_t>(logits.size()) / experts;
  std::vector<int32_t> ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  REQUIRE(
      cpu_ops::RouterTopK(logits.data(), tokens, experts, top_k, ids.data(), weights.data()).ok());
  CHECK(ids == std::vector<int32_t>{0, 1, 2, 1, 2, 4, 3, 1, 2, 2, 5, 7});
  for (int64_t j = 0; j < 3; ++j) CHECK(weights[j] == weights[0]);  // all tied
  for (int64_t j = 3; j < 6; ++j) CHECK(weights[j] == weights[3]);  // three tied
  CHECK(weights[10] == weights[11]);                                // the tie after the top
  for (int64_t t = 0; t < tokens; ++t) {
    CHECK(std::abs(double{weights[t * 3]} + weights[t * 3 + 1] + weights[t * 3 + 2] - 1.0) <= 1e-6);
  }
}

TEST_CASE("cpu_ops::BuildExpertPermutation is a stable sort of the pairs by expert", "[ops]") {
  std::mt19937 rng(5);
  struct Case {
    int64_t tokens, top_k, experts;
    bool bad_ids;
  };
  for (Case c : {Case{1, 2, 8, false}, Case{37, 2, 8, false}, Case{300, 6, 64, true},
                 Case{500, 1, 300, false}, Case{0, 2, 8, false}}) {
    CAPTURE(c.tokens, c.top_k, c.experts, c.bad_ids);
    const int64_t pairs = c.tokens * c.top_k;
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.experts) - 1);
    std::vector<int32_t> ids(pairs);
    for (int32_t& id : ids) id = pick(rng);  // repeats within a token are fine for the sort
    if (c.bad_ids) {
      ids[3] = -1;
      ids[10] = static_cast<int32_t>(c.experts);
      ids[11] = 1 << 30;
    }
    std::vector<int32_t> offsets(c.experts + 1, -5), sorted(pairs, -5), slot_of(pairs, -5);
    REQUIRE(cpu_ops::BuildExpertPermutation(ids.data(), c.tokens, c.top_k, c.experts,
                                            offsets.data(), sorted.data(), slot_of.data())
                .ok());
    // The valid pairs, stably sorted by expert: sorted row r is pair order[r].
    std::vector<int64_t> order;
    for (int64_t p = 0; p < pairs; ++p) {
      if (ids[p] >= 0 && ids[p] < c.experts) order.push_back(p);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    const int64_t valid = static_cast<int64_t>(order.size());
    REQUIRE(offsets[c.experts] == valid);
    std::vector<int32_t> want_slot(pairs, -1);
    for (int64_t r = 0; r < valid; ++r) {
      const int64_t p = order[r];
      CHECK(sorted[r] == p / c.top_k);
      want_slot[p] = static_cast<int32_t>(r);
      CHECK(offsets[ids[p]] <= r);
      CHECK(r < offsets[ids[p] + 1]);
    }
    for (int64_t r = valid; r < pairs; ++r) CHECK(sorted[r] == -5);  // not written
    CHECK(slot_of == want_slot);
    CHECK(offsets[0] == 0);
    for (int64_t e = 0; e < c.experts; ++e) {
      CHECK(offsets[e + 1] - offsets[e] == std::count(ids.begin(), ids.end(), e));
    }
  }
}

TEST_CASE("cpu_ops::GatherRows copies the indexed rows, zero rows for bad indices", "[ops]") {
  std::mt19937 rng(6);
  const int64_t src_rows = 9, rows = 20;
  for (DType dtype : kAllDTypes) {
    for (int64_t n : {1, 3, 64}) {
      CAPTURE(DTypeName(dtype), n);
      const Typed src = Store(dtype, Normal(rng, src_rows * n));
      std::vector<int32_t> index(rows);
      for (int64_t r = 0; r < rows; ++r) index[r] = static_cast<int32_t>((r * 5) % src_rows);
      index[2] = -1;
      index[3] = static_cast<int32_t>(src_rows);
      const size_t row_bytes = n * DTypeSize(dtype);
      std::vector<unsigned char> dst(rows * row_bytes, 0xab);
      REQUIRE(
          cpu_ops::GatherRows(src.bytes.data(), dtype, src_rows, n, index.data(), rows, dst.data())
              .ok());
      for (int64_t r = 0; r < rows; ++r) {
        const bool valid = index[r] >= 0 && index[r] < src_rows;
        for (size_t b = 0; b < row_bytes; ++b) {
          REQUIRE(dst[r * row_bytes + b] ==
                  (valid ? src.bytes[index[r] * row_bytes + b] : static_cast<unsigned char>(0)));
        }
      }
    }
  }
}

TEST_CASE("cpu_ops::SiluMul is silu(gate) * up in float64", "[ops]") {
  std::mt19937 rng(7);
  const int64_t rows = 7, inter = 301;
  std::vector<float> gate32 = Normal(rng, rows * inter, 3.0f);
  gate32[0] = 0.0f;
  gate32[1] = -100.0f;  // expf(100) overflows to inf: silu(-100) = -0 (float64: -4e-42)
  gate32[2] = 100.0f;
  const std::vector<float> up32 = Normal(rng, rows * inter);
  for (DType in : kAllDTypes) {
    const Typed gate = Store(in, gate32), up = Store(in, up32);
    std::vector<double> want(rows * inter);
    for (size_t i = 0; i < want.size(); ++i) {
      const double g = gate.values[i];
      want[i] = g / (1.0 + std::exp(-g)) * up.values[i];  // SiLU(g) = g * sigmoid(g)
    }
    for (DType out : kAllDTypes) {
      CAPTURE(DTypeName(in), DTypeName(out));
      std::vector<unsigned char> got(rows * inter * DTypeSize(out));
      REQUIRE(cpu_ops::SiluMul(gate.bytes.data(), up.bytes.data(), in, rows, inter, got.data(), out)
                  .ok());
      CHECK(OutsideRounding(out, Load(out, got), want, 2e-6) == 0);
    }
    std::vector<unsigned char> inplace = gate.bytes;  // in place into gate
    REQUIRE(cpu_ops::SiluMul(inplace.data(), up.bytes.data(), in, rows, inter, inplace.data(), in)
                .ok());
    CHECK(OutsideRounding(in, Load(in, inplace), want, 2e-6) == 0);
  }
}

TEST_CASE("cpu_ops::ClampedSwiglu is GptOssExperts' clamped SwiGLU in float64", "[ops]") {
  std::mt19937 rng(17);
  const int64_t rows = 5, inter = 96;
  const float limit = 7.0f;
  std::vector<float> gate = Normal(rng, rows * inter, 5.0f), up = Normal(rng, rows * inter, 5.0f);
  gate[0] = 9.0f;  // clamped to 7 above; not below
  gate[1] = -60.0f;
  up[0] = -9.0f;  // clamped to -7
  up[1] = 8.0f;   // clamped to 7
  int64_t clamped = 0;
  std::vector<double> want(rows * inter);
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = std::min<double>(gate[i], limit);
    const double u = std::min<double>(std::max<double>(up[i], -limit), limit);
    clamped += gate[i] > limit || std::abs(up[i]) > limit;
    want[i] = (u + 1.0) * (g / (1.0 + std::exp(-1.702 * g)));
  }
  REQUIRE(clamped > 10);
  std::vector<float> got(rows * inter);
  REQUIRE(cpu_ops::ClampedSwiglu(gate.data(), up.data(), rows, inter, limit, got.data()).ok());
  CHECK(OutsideRounding(DType::kF32, got, want, 2e-6) == 0);
  std::vector<float> inplace = gate;  // in place into gate
  REQUIRE(
      cpu_ops::ClampedSwiglu(inplace.data(), up.data(), rows, inter, limit, inplace.data()).ok());
  CHECK(inplace == got);
  CHECK(Invalid(cpu_ops::ClampedSwiglu(gate.data(), up.data(), rows, inter, 0.0f, got.data())));
  CHECK(Invalid(cpu_ops::ClampedSwiglu(gate.data(), up.data(), rows, 0, limit, got.data())));
  CHECK(Invalid(cpu_ops::ClampedSwiglu(nullptr, up.data(), rows, inter, limit, got.data())));
}

TEST_CASE("cpu_ops::CombineExperts adds the weighted expert rows, in expert id order", "[ops]") {
  std::mt19937 rng(8);
  SECTION("random routing against float64") {
    const int64_t tokens = 23, top_k = 3, hidden = 40;
    const int64_t slots = tokens * top_k;
    const std::vector<float> expert_out = Normal(rng, slots * hidden);
    const std::vector<float> h = Normal(rng, tokens * hidden, 4.0f);
    std::vector<int32_t> ids(slots), slot_of(slots);
    std::vector<float> weights = Normal(rng, slots);
    std::vector<int32_t> perm(slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t p = 0; p < slots; ++p) {
      ids[p] = static_cast<int32_t>((p * 5) % 8);
      slot_of[p] = perm[p];
    }
    slot_of[4] = -1;                           // skipped
    slot_of[7] = static_cast<int32_t>(slots);  // skipped
    std::vector<double> want(h.begin(), h.end());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < top_k; ++j) {
        const int32_t s = slot_of[t * top_k + j];
        if (s < 0 || s >= slots) continue;
        for (int64_t c = 0; c < hidden; ++c) {
          want[t * hidden + c] += double{expert_out[s * hidden + c]} * weights[t * top_k + j];
        }
      }
    }
    std::vector<float> got = h;
    REQUIRE(cpu_ops::CombineExperts(expert_out.data(), slot_of.data(), ids.data(), weights.data(),
                                    tokens, top_k, hidden, got.data())
                .ok());
    const double err = MaxRelError(got, want);
    CAPTURE(err);
    CHECK(err <= 2e-6);
  }
  SECTION("the f32 sum runs in expert id order, not choice order") {
    // Choices (expert 7: 1), (expert 2: 1e8), (expert 4: -1e8), weights 1: in id order
    // (1e8 - 1e8) + 1 = 1; in choice order (1 + 1e8) - 1e8 = 0.
    const std::vector<float> expert_out = {1.0f, 1e8f, -1e8f};
    const std::vector<int32_t> ids = {7, 2, 4}, slot_of = {0, 1, 2};
    const std::vector<float> weights = {1.0f, 1.0f, 1.0f};
    std::vector<float> h = {0.5f};
    REQUIRE(cpu_ops::CombineExperts(expert_out.data(), slot_of.data(), ids.data(), weights.data(),
                                    1, 3, 1, h.data())
                .ok());
    CHECK(h[0] == 1.5f);
  }
}

TEST_CASE("cpu_ops::ArgmaxRows: the first maximum wins", "[ops]") {
  std::mt19937 rng(12);
  const int64_t n = 1000, rows = 6;
  std::vector<float> x = Normal(rng, rows * n);
  x[1 * n + 1] = x[1 * n + n - 1] = 100.0f;                    // row 1: 1
  x[2 * n + 500] = x[2 * n + 501] = 50.0f;                     // row 2: 500
  std::fill(x.begin() + 3 * n, x.begin() + 4 * n, -INFINITY);  // row 3: not finite, -1
  x[4 * n + n - 1] = 1000.0f;                                  // row 4: n - 1
  std::fill(x.begin() + 5 * n, x.begin() + 6 * n, 2.0f);       // row 5: 0
  std::vector<int32_t> ids(rows, -1);
  REQUIRE(cpu_ops::ArgmaxRows(x.data(), rows, n, ids.data()).ok());
  int32_t first = 0;  // row 0: a plain scan
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[first]) first = i;
  }
  CHECK(ids == std::vector<int32_t>{first, 1, 500, -1, static_cast<int32_t>(n - 1), 0});
  // One NaN anywhere, or one infinity, makes the row -1 (the engine fails such a request).
  for (const float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> row = Normal(rng, n);
    row[733] = bad;
    int32_t id = 0;
    REQUIRE(cpu_ops::ArgmaxRows(row.data(), 1, n, &id).ok());
    CHECK(id == -1);
  }
  std::vector<int32_t> one(1);
  const float single = -3.0f;
  REQUIRE(cpu_ops::ArgmaxRows(&single, 1, 1, one.data()).ok());
  CHECK(one[0] == 0);
}

TEST_CASE("cpu_ops::AddResidual and the conversions", "[ops]") {
  std::vector<float> h = {1.0f, -2.0f, 1e8f, 0.0f};
  const std::vector<float> x = {0.5f, 2.0f, 1.0f, -0.0f};
  REQUIRE(cpu_ops::AddResidual(h.data(), x.data(), 4).ok());
  CHECK(h == std::vector<float>{1.5f, 0.0f, 1e8f, 0.0f});
  CHECK(!std::signbit(h[3]));

  // Round to nearest even, hand-derived: 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7 (even: 1);
  // 1 + 3 * 2^-8 rounds up to 1 + 2^-6 (even); f16: 65520 is halfway to the next power (inf),
  // 1e-7 is 1.68 subnormal steps of 2^-24 (2); 1e-40 is an f32 subnormal (bf16 0x0001).
  struct Corner {
    float f;
    uint16_t bf16, f16;
  };
  const std::vector<Corner> corners = {
      {1.0f, 0x3f80, 0x3c00},           {-0.0f, 0x8000, 0x8000},
      {1.0f + 0x1p-8f, 0x3f80, 0x3c04}, {1.0f + 3 * 0x1p-8f, 0x3f82, 0x3c0c},
      {65520.0f, 0x4780, 0x7c00},       {70000.0f, 0x4789, 0x7c00},
      {1e-7f, 0x33d7, 0x0002},          {1e-40f, 0x0001, 0x0000},
      {INFINITY, 0x7f80, 0x7c00},       {-INFINITY, 0xff80, 0xfc00},
  };
  std::vector<float> src;
  for (const Corner& c : corners) src.push_back(c.f);
  const int64_t n = static_cast<int64_t>(src.size());
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    CAPTURE(DTypeName(dtype));
    std::vector<uint16_t> got(n);
    REQUIRE(cpu_ops::ConvertF32To(src.data(), n, got.data(), dtype).ok());
    for (int64_t i = 0; i < n; ++i) {
      CAPTURE(corners[i].f);
      CHECK(got[i] == (dtype == DType::kBF16 ? corners[i].bf16 : corners[i].f16));
    }
    // Every finite 16-bit pattern widens exactly and rounds back to itself.
    std::vector<uint16_t> all(65536);
    std::iota(all.begin(), all.end(), uint16_t{0});
    std::vector<float> wide(all.size());
    REQUIRE(cpu_ops::ConvertToF32(all.data(), dtype, 65536, wide.data()).ok());
    std::vector<uint16_t> back(all.size());
    REQUIRE(cpu_ops::ConvertF32To(wide.data(), 65536, back.data(), dtype).ok());
    int64_t mismatches = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      if (std::isnan(wide[i])) continue;
      mismatches += back[i] != all[i];
    }
    CHECK(mismatches == 0);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    uint16_t nan16 = 0;
    REQUIRE(cpu_ops::ConvertF32To(&nan, 1, &nan16, dtype).ok());
    float nan_back = 0;
    REQUIRE(cpu_ops::ConvertToF32(&nan16, dtype, 1, &nan_back).ok());
    CHECK(std::isnan(nan_back));
  }
  std::vector<float> f32(n);
  REQUIRE(cpu_ops::ConvertF32To(src.data(), n, f32.data(), DType::kF32).ok());
  CHECK(std::memcmp(f32.data(), src.data(), n * sizeof(float)) == 0);
}

TEST_CASE("cpu_ops: bad sizes are InvalidArgument, zero rows write nothing", "[ops]") {
  std::vector<float> f(64, 1.0f);
  std::vector<int32_t> i32(64, 0);
  std::vector<int64_t> i64(8, 0);
  const auto bad_dtype = static_cast<DType>(7);
  CHECK(Invalid(cpu_ops::EmbeddingGather(f.data(), bad_dtype, 4, 4, i32.data(), 1, f.data())));
  CHECK(Invalid(cpu_ops::EmbeddingGather(f.data(), DType::kF32, 0, 4, i32.data(), 1, f.data())));
  CHECK(Invalid(cpu_ops::EmbeddingGather(nullptr, DType::kF32, 4, 4, i32.data(), 1, f.data())));
  CHECK(Invalid(
      cpu_ops::RmsNorm(f.data(), f.data(), DType::kF32, 1, 0, 1e-5f, f.data(), DType::kF32)));
  CHECK(Invalid(
      cpu_ops::RmsNorm(f.data(), f.data(), DType::kF32, -1, 4, 1e-5f, f.data(), DType::kF32)));
  CHECK(Invalid(
      cpu_ops::RmsNorm(f.data(), f.data(), DType::kF32, 1, 4, -1.0f, f.data(), DType::kF32)));
  CHECK(Invalid(cpu_ops::RmsNorm(f.data(), f.data(), DType::kF32, 1, 4, 1e-5f, f.data(),
                                 DType::kBF16)));  // in place into another dtype
  CHECK(Invalid(cpu_ops::ApplyRope(f.data(), 1, 1, 3, i64.data(), f.data())));  // odd d
  CHECK(Invalid(cpu_ops::ApplyRope(f.data(), 1, 0, 4, i64.data(), f.data())));
  CHECK(Invalid(cpu_ops::PrefillAttention(f.data(), f.data(), f.data(), i32.data(), 1, 4, 6, 4, 2,
                                          0.5f, 0, f.data())));  // heads % kv_heads
  CHECK(Invalid(cpu_ops::PrefillAttention(f.data(), f.data(), f.data(), i32.data(), 1, 4, 2, 1, 2,
                                          0.5f, -1, f.data())));  // window < 0
  CHECK(Invalid(cpu_ops::PrefillAttention(f.data(), f.data(), f.data(), i32.data(), 1, 4, 2, 1, 2,
                                          INFINITY, 0, f.data())));
  const std::vector<int32_t> decreasing = {0, 3, 2}, beyond = {0, 5};
  CHECK(Invalid(cpu_ops::PrefillAttention(f.data(), f.data(), f.data(), decreasing.data(), 2, 4, 2,
                                          1, 2, 0.5f, 0, f.data())));
  CHECK(Invalid(cpu_ops::PrefillAttention(f.data(), f.data(), f.data(), beyond.data(), 1, 4, 2, 1,
                                          2, 0.5f, 0, f.data())));
  CHECK(Invalid(cpu_ops::RouterTopK(f.data(), 1, 8, 0, i32.data(), f.data())));
  CHECK(Invalid(cpu_ops::RouterTopK(f.data(), 1, 8, 9, i32.data(), f.data())));
  CHECK(Invalid(cpu_ops::RouterTopK(f.data(), 1, 0, 1, i32.data(), f.data())));
  CHECK(Invalid(
      cpu_ops::BuildExpertPermutation(i32.data(), 1, 2, 0, i32.data(), i32.data(), i32.data())));
  CHECK(Invalid(
      cpu_ops::BuildExpertPermutation(i32.data(), 1, 2, 8, nullptr, i32.data(), i32.data())));
  CHECK(Invalid(cpu_ops::BuildExpertPermutation(i32.data(), int64_t{1} << 30, 2, 8, i32.data(),
                                                i32.data(), i32.data())));  // 2^31 pairs
  CHECK(Invalid(cpu_ops::GatherRows(f.data(), DType::kF32, 4, 0, i32.data(), 1, f.data())));
  CHECK(Invalid(cpu_ops::GatherRows(f.data(), bad_dtype, 4, 4, i32.data(), 1, f.data())));
  CHECK(Invalid(cpu_ops::SiluMul(f.data(), f.data(), DType::kF32, 1, 4, f.data(), DType::kF16)));
  CHECK(Invalid(cpu_ops::SiluMul(f.data(), f.data(), DType::kF32, 1, 0, f.data(), DType::kF32)));
  CHECK(Invalid(
      cpu_ops::CombineExperts(f.data(), i32.data(), i32.data(), f.data(), 1, 0, 4, f.data())));
  CHECK(Invalid(
      cpu_ops::CombineExperts(f.data(), i32.data(), i32.data(), f.data(), 1, 2, 0, f.data())));
  CHECK(Invalid(cpu_ops::ArgmaxRows(f.data(), 1, 0, i32.data())));
  CHECK(Invalid(cpu_ops::ArgmaxRows(nullptr, 1, 4, i32.data())));
  CHECK(Invalid(cpu_ops::AddResidual(f.data(), f.data(), -1)));
  CHECK(Invalid(cpu_ops::ConvertF32To(f.data(), 4, f.data(), bad_dtype)));
  CHECK(Invalid(cpu_ops::ConvertToF32(nullptr, DType::kBF16, 4, f.data())));
  // Nothing above wrote anything.
  CHECK(f == std::vector<float>(64, 1.0f));
  CHECK(i32 == std::vector<int32_t>(64, 0));
  // Zero rows: OK with null pointers; the permutation still zeroes its offsets.
  CHECK(cpu_ops::RmsNorm(nullptr, nullptr, DType::kF32, 0, 4, 1e-5f, nullptr, DType::kF32).ok());
  CHECK(cpu_ops::PrefillAttention(nullptr, nullptr, nullptr, nullptr, 0, 0, 8, 2, 64, 0.125f, 0,
                                  nullptr)
            .ok());
  CHECK(cpu_ops::EmbeddingGather(nullptr, DType::kF32, 4, 4, nullptr, 0, nullptr).ok());
  std::vector<int32_t> offsets(9, 5);
  REQUIRE(cpu_ops::BuildExpertPermutation(nullptr, 0, 2, 8, offsets.data(), nullptr, nullptr).ok());
  CHECK(offsets == std::vector<int32_t>(9, 0));
}
