// The portable paged attention kernel against a float64 reference written the plain way (dense
// keys, two-pass softmax), on fresh random inputs with blocks scattered in memory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>

#include "cpu_attention/paged_attention.h"
#include "engine/kv_cache.h"

using namespace moebatch;

namespace {

struct Case {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> context_lens, num_queries;
  std::optional<int64_t> window;
  DType dtype;
};

void RunCase(const Case& tc, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t d = tc.head_dim;
  const int64_t n_seqs = static_cast<int64_t>(tc.context_lens.size());
  int64_t total_blocks = 0;
  for (int64_t len : tc.context_lens) total_blocks += BlocksForTokens(len, tc.block_size);
  KvCacheConfig kc{1, tc.kv_heads, d, tc.block_size, total_blocks + 3, tc.dtype};
  auto cache_or = PagedKvCache::Create(kc);
  REQUIRE(cache_or.ok());
  PagedKvCache& cache = **cache_or;
  // Scatter: a shuffled permutation of block ids.
  std::vector<int32_t> ids(kc.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<int32_t>> tables(n_seqs);
  std::vector<std::vector<float>> keys(n_seqs), values(n_seqs);  // rounded to the cache dtype
  size_t next = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t len = tc.context_lens[s];
    for (int64_t b = 0; b < BlocksForTokens(len, tc.block_size); ++b)
      tables[s].push_back(ids[next++]);
    keys[s].resize(len * tc.kv_heads * d);
    values[s].resize(len * tc.kv_heads * d);
    for (int64_t p = 0; p < len; ++p) {
      float* k = keys[s].data() + p * tc.kv_heads * d;
      float* v = values[s].data() + p * tc.kv_heads * d;
      for (int64_t i = 0; i < tc.kv_heads * d; ++i) {
        k[i] = normal(rng);
        v[i] = normal(rng);
      }
      cache.Write(0, tables[s], p, k, v);
      std::vector<uint16_t> tmp(tc.kv_heads * d);
      if (tc.dtype != DType::kF32) {  // the reference sees what the cache holds
        ConvertFromF32(tc.dtype, k, tmp.data(), tmp.size());
        ConvertToF32(tc.dtype, tmp.data(), k, tmp.size());
        ConvertFromF32(tc.dtype, v, tmp.data(), tmp.size());
        ConvertToF32(tc.dtype, tmp.data(), v, tmp.size());
      }
    }
  }
  std::vector<AttentionSequence> seqs;
  int64_t rows = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    seqs.push_back({tables[s].data(), rows, tc.num_queries[s], tc.context_lens[s]});
    rows += tc.num_queries[s];
  }
  std::vector<float> q(rows * tc.heads * d);
  for (float& x : q) x = normal(rng);
  std::vector<float> out(q.size(), std::nanf(""));  // poisoned
  KvLayerView view{cache.LayerBase(0),
                   tc.dtype,
                   tc.kv_heads,
                   d,
                   tc.block_size,
                   cache.block_stride_bytes(),
                   cache.value_offset_bytes()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  PagedAttentionReference(view, seqs.data(), n_seqs, q.data(), tc.heads, scale, tc.window,
                          out.data());

  double max_err = 0.0, max_ref = 0.0;
  const int64_t group = tc.heads / tc.kv_heads;
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t i = 0; i < tc.num_queries[s]; ++i) {
      const int64_t pos = tc.context_lens[s] - tc.num_queries[s] + i;
      const int64_t first = tc.window ? std::max<int64_t>(0, pos - *tc.window + 1) : 0;
      const int64_t row = seqs[s].query_start + i;
      for (int64_t h = 0; h < tc.heads; ++h) {
        const int64_t g = h / group;
        const float* qv = q.data() + (row * tc.heads + h) * d;
        std::vector<double> score(pos + 1, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = first; j <= pos; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < d; ++x)
            dot += double(qv[x]) * keys[s][(j * tc.kv_heads + g) * d + x];
          score[j] = dot * scale;
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int64_t j = first; j <= pos; ++j) sum += std::exp(score[j] - mx);
        for (int64_t x = 0; x < d; ++x) {
          double acc = 0;
          for (int64_t j = first; j <= pos; ++j) {
            acc += std::exp(score[j] - mx) / sum * values[s][(j * tc.kv_heads + g) * d + x];
          }
          const float got = out[(row * tc.heads + h) * d + x];
          REQUIRE(std::isfinite(got));
          max_err = std::max(max_err, std::abs(got - acc));
          max_ref = std::max(max_ref, std::abs(acc));
        }
      }
    }
  }
  INFO("max abs error " << max_err << " over max abs value " << max_ref);
  REQUIRE(max_err / max_ref < 1e-4);
}

}  // namespace

TEST_CASE("paged attention matches a float64 reference: decode, GQA ratios, lengths") {
  const int64_t bs = 16;
  for (int64_t d : {64, 128}) {
    for (int64_t ratio : {1, 4, 8}) {
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        Case tc{8,    8 / ratio, d, bs, {1, bs - 1, bs, bs + 1, 300}, {1, 1, 1, 1, 1}, std::nullopt,
                dtype};
        RunCase(tc, 1000 + d + ratio);
      }
    }
  }
}

TEST_CASE("paged attention: causal prefill chunks beside decode tokens") {
  // Sequence 0: a whole prompt of 37; 1: a chunk of 20 after 50 cached; 2: decode at 129.
  Case tc{4, 2, 64, 16, {37, 70, 130}, {37, 20, 1}, std::nullopt, DType::kF32};
  RunCase(tc, 7);
}

TEST_CASE("paged attention: sliding window") {
  for (int64_t window : {1, 5, 32}) {
    Case tc{4, 2, 64, 16, {100, 33, 7}, {100, 3, 1}, window, DType::kBF16};
    RunCase(tc, 11 + window);
  }
}

TEST_CASE("paged attention: a long sequence (4097 tokens)") {
  Case tc{8, 2, 128, 16, {4097}, {2}, std::nullopt, DType::kBF16};
  RunCase(tc, 99);
}
