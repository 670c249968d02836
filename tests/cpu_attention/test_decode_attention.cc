// The paged attention kernels (decode_attention.h), every ISA level this CPU has (the portable
// reference of paged_attention.h included, as kPortable),
// against a float64 reference written the plain way (dense keys, two-pass softmax) and against the
// portable kernel, on fresh random inputs with blocks scattered in memory and poisoned outputs.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "cpu_attention/attention/decode_attention.h"
#include "cpu_attention/attention/decode_attention_internal.h"
#include "engine/kv/kv_cache.h"

using namespace moebatch;

namespace {

struct Case {
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> context_lens, num_queries;
  std::optional<int64_t> window;
  DType dtype;
  // > 0: MLA's latent cache, the value is the key row's first value_dim values (KvCacheConfig).
  int64_t value_dim = 0;
  // gpt-oss's attention sinks: one random logit per query head (head 0's far above every score,
  // head 1's far below) in the softmax's denominator.
  bool sinks = false;
  // > 0: key row p (and so its value, for MLA) scaled by 1 + key_ramp * p / context_len: scores
  // that grow along the keys, so a kernel's running max moves by far more than the softmax's
  // range at later keys (AMX's lagging max rescales O then).
  float key_ramp = 0;
};

// A filled cache and the float64 answer for one Case.
struct Fixture {
  std::unique_ptr<PagedKvCache> cache;
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionSequence> seqs;
  std::vector<float> q;
  std::vector<double> expected;  // [rows, heads, head_dim]; rows past the last query are spare
  int64_t rows = 0, spare_rows = 1;
  KvLayerView view;
  float scale = 0;
  std::vector<float> sinks;  // [heads] when Case::sinks
};

Fixture Build(const Case& tc, uint64_t seed) {
  Fixture f;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t d = tc.head_dim;
  const int64_t n_seqs = static_cast<int64_t>(tc.context_lens.size());
  int64_t total_blocks = 0;
  for (int64_t len : tc.context_lens) total_blocks += BlocksForTokens(len, tc.block_size);
  KvCacheConfig kc{1, tc.kv_heads, d, tc.block_size, total_blocks + 3, tc.dtype};
  kc.value_dim = tc.value_dim;
  auto cache_or = PagedKvCache::Create(kc);
  REQUIRE(cache_or.ok());
  f.cache = std::move(*cache_or);
  PagedKvCache& cache = *f.cache;
  std::vector<int32_t> ids(kc.num_blocks);  // scattered: a shuffled permutation of block ids
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  f.tables.resize(n_seqs);
  std::vector<std::vector<float>> keys(n_seqs), values(n_seqs);  // rounded to the cache dtype
  size_t next = 0;
  std::vector<uint16_t> tmp(tc.kv_heads * d);
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t len = tc.context_lens[s];
    for (int64_t b = 0; b < BlocksForTokens(len, tc.block_size); ++b)
      f.tables[s].push_back(ids[next++]);
    keys[s].resize(len * tc.kv_heads * d);
    values[s].resize(len * tc.kv_heads * d);
    for (int64_t p = 0; p < len; ++p) {
      float* k = keys[s].data() + p * tc.kv_heads * d;
      float* v = values[s].data() + p * tc.kv_heads * d;
      const float gain = 1.0f + tc.key_ramp * static_cast<float>(p) / static_cast<float>(len);
      for (int64_t i = 0; i < tc.kv_heads * d; ++i) {
        k[i] = gain * normal(rng);
        v[i] = normal(rng);
      }
      if (tc.value_dim > 0) std::copy(k, k + tc.kv_heads * d, v);  // V = the key row's prefix
      cache.Write(0, f.tables[s], p, k, v);
      if (tc.dtype != DType::kF32) {  // the reference sees what the cache holds
        ConvertFromF32(tc.dtype, k, tmp.data(), tmp.size());
        ConvertToF32(tc.dtype, tmp.data(), k, tmp.size());
        ConvertFromF32(tc.dtype, v, tmp.data(), tmp.size());
        ConvertToF32(tc.dtype, tmp.data(), v, tmp.size());
      }
    }
  }
  for (int64_t s = 0; s < n_seqs; ++s) {
    f.seqs.push_back({f.tables[s].data(), f.rows, tc.num_queries[s], tc.context_lens[s]});
    f.rows += tc.num_queries[s];
  }
  const int64_t total_rows = f.rows + f.spare_rows;  // a spare row no sequence names
  f.q.resize(total_rows * tc.heads * d);
  for (float& x : f.q) x = normal(rng);
  f.view = KvLayerView{cache.LayerBase(0),
                       tc.dtype,
                       tc.kv_heads,
                       d,
                       tc.block_size,
                       cache.block_stride_bytes(),
                       cache.value_offset_bytes(),
                       tc.value_dim};
  f.scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (tc.sinks) {
    for (int64_t h = 0; h < tc.heads; ++h) f.sinks.push_back(2.0f * normal(rng));
    f.sinks[0] = 30.0f;  // exp(sink - max) would overflow without the rescaled form
    if (tc.heads > 1) f.sinks[1] = -30.0f;
  }
  const int64_t dv = tc.value_dim > 0 ? tc.value_dim : d;

  f.expected.assign(f.q.size(), 0.0);
  const int64_t group = tc.heads / tc.kv_heads;
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t i = 0; i < tc.num_queries[s]; ++i) {
      const int64_t pos = tc.context_lens[s] - tc.num_queries[s] + i;
      const int64_t first = tc.window ? std::max<int64_t>(0, pos - *tc.window + 1) : 0;
      const int64_t row = f.seqs[s].query_start + i;
      std::vector<double> w(pos + 1);
      for (int64_t h = 0; h < tc.heads; ++h) {
        const int64_t g = h / group;
        const float* qv = f.q.data() + (row * tc.heads + h) * d;
        double mx = -INFINITY;
        for (int64_t j = first; j <= pos; ++j) {
          const float* k = keys[s].data() + (j * tc.kv_heads + g) * d;
          double dot = 0;
          for (int64_t x = 0; x < d; ++x) dot += double(qv[x]) * k[x];
          w[j] = dot * f.scale;
          mx = std::max(mx, w[j]);
        }
        // eager_attention_forward (gpt-oss): the sink joins the max and the denominator.
        if (tc.sinks) mx = std::max(mx, double(f.sinks[h]));
        double sum = tc.sinks ? std::exp(double(f.sinks[h]) - mx) : 0.0;
        for (int64_t j = first; j <= pos; ++j) sum += (w[j] = std::exp(w[j] - mx));
        double* o = f.expected.data() + (row * tc.heads + h) * d;
        for (int64_t j = first; j <= pos; ++j) {
          const float* v = values[s].data() + (j * tc.kv_heads + g) * d;
          const double p = w[j] / sum;
          for (int64_t x = 0; x < dv; ++x) o[x] += p * v[x];  // 0 past value_dim
        }
      }
    }
  }
  return f;
}

// A kernel choice: a vector ISA, and for AVX-512 with or without AMX tiles (MLA's bf16 cache).
struct Variant {
  CpuIsa isa;
  bool amx;
  std::string Name() const { return std::string(CpuIsaName(isa)) + (amx ? "+amx" : ""); }
};

// Every ISA this CPU has, and AVX-512 with AMX where CpuAmxUsable().
std::vector<Variant> Variants() {
  std::vector<Variant> v;
  for (CpuIsa isa : SupportedCpuIsas()) v.push_back({isa, false});
  if (CpuAmxUsable()) v.push_back({CpuIsa::kAvx512, true});
  return v;
}

// Runs `variant` (or, without one, the portable reference) on a poisoned output; returns it.
std::vector<float> Run(const Fixture& f, const Case& tc, std::optional<Variant> variant) {
  std::vector<float> out(f.q.size(), std::nanf(""));
  const float* sinks = f.sinks.empty() ? nullptr : f.sinks.data();
  if (variant) {
    decode_attention_internal::PagedAttentionWith(variant->isa, variant->amx, f.view, f.seqs.data(),
                                                  static_cast<int64_t>(f.seqs.size()), f.q.data(),
                                                  tc.heads, f.scale, tc.window, out.data(), sinks);
  } else {
    PagedAttentionReference(f.view, f.seqs.data(), static_cast<int64_t>(f.seqs.size()), f.q.data(),
                            tc.heads, f.scale, tc.window, out.data(), sinks);
  }
  return out;
}

// Every ISA against float64 (max abs error / max abs value < tol) and against the portable kernel.
void Check(const Case& tc, uint64_t seed, double tol = -1) {
  if (tol < 0) tol = tc.dtype == DType::kBF16 ? 1e-3 : 1e-4;
  const Fixture f = Build(tc, seed);
  const int64_t live = f.rows * tc.heads * tc.head_dim;
  const std::vector<float> portable = Run(f, tc, std::nullopt);
  for (const Variant& variant : Variants()) {
    INFO("isa " << variant.Name() << ", head_dim " << tc.head_dim << ", value_dim " << tc.value_dim
                << ", heads " << tc.heads << "/" << tc.kv_heads << ", dtype "
                << DTypeName(tc.dtype));
    const std::vector<float> out = Run(f, tc, variant);
    double max_err = 0, max_ref = 0, max_diff = 0;
    for (int64_t x = 0; x < live; ++x) {
      REQUIRE(std::isfinite(out[x]));
      max_err = std::max(max_err, std::abs(out[x] - f.expected[x]));
      max_ref = std::max(max_ref, std::abs(f.expected[x]));
      max_diff = std::max(max_diff, double(std::abs(out[x] - portable[x])));
    }
    for (size_t x = live; x < out.size(); ++x) REQUIRE(std::isnan(out[x]));  // spare row untouched
    if (tc.value_dim > 0) {  // a head's values past value_dim are written 0
      for (int64_t x = 0; x < live; ++x) {
        if (x % tc.head_dim >= tc.value_dim) REQUIRE(out[x] == 0.0f);
      }
    }
    INFO("max abs error " << max_err << " over max abs value " << max_ref
                          << "; max abs diff from portable " << max_diff);
    REQUIRE(max_err / max_ref < tol);
    // AMX splits the f32 query and probabilities into bf16 hi + lo parts: f32-like, not bf16's
    // 4e-3 (a kernel that dropped the lo parts would pass `tol`).
    if (variant.amx) REQUIRE(max_err / max_ref < 2e-5);
    REQUIRE(max_diff / max_ref < 2 * tol);
  }
}

// Each sequence's rows come out bit for bit the same attended alone as beside the others, with
// one thread or all, for every kernel variant.
void CheckBatchInvariance(const Case& tc, uint64_t seed) {
  const Fixture f = Build(tc, seed);
  const int64_t row_floats = tc.heads * tc.head_dim;
  const int max_threads = omp_get_max_threads();
  for (const Variant& variant : Variants()) {
    const std::vector<float> batched = Run(f, tc, variant);
    for (size_t s = 0; s < f.seqs.size(); ++s) {
      for (int threads : {1, max_threads}) {
        omp_set_num_threads(threads);
        std::vector<float> alone(f.q.size(), std::nanf(""));
        decode_attention_internal::PagedAttentionWith(variant.isa, variant.amx, f.view, &f.seqs[s],
                                                      1, f.q.data(), tc.heads, f.scale, tc.window,
                                                      alone.data());
        omp_set_num_threads(max_threads);
        const int64_t begin = f.seqs[s].query_start * row_floats;
        const int64_t count = f.seqs[s].num_queries * row_floats;
        INFO("isa " << variant.Name() << ", sequence " << s << " (context " << f.seqs[s].context_len
                    << "), threads " << threads);
        CHECK(std::memcmp(alone.data() + begin, batched.data() + begin, count * sizeof(float)) ==
              0);
      }
    }
  }
}

}  // namespace

TEST_CASE("decode attention, every ISA: head dims, GQA ratios, dtypes, short lengths",
          "[decode_attention]") {
  const int64_t bs = 16;
  uint64_t seed = 1;
  for (int64_t d : {64, 128}) {
    for (int64_t kv_heads : {32, 8, 4}) {  // GQA ratios 1, 4, 8
      for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
        Check({32,
               kv_heads,
               d,
               bs,
               {1, bs - 1, bs, bs + 1, 100},
               {1, 1, 1, 1, 1},
               std::nullopt,
               dtype},
              seed++);
      }
    }
  }
}

TEST_CASE("decode attention, every ISA: long contexts (4097, 32768), chunked and merged",
          "[decode_attention]") {
  // One KV head: a single work unit, so it is always split into chunks.
  Check({8, 1, 64, 16, {4097}, {1}, std::nullopt, DType::kF16}, 41);
  Check({32, 8, 128, 16, {4097, 17}, {1, 1}, std::nullopt, DType::kBF16}, 42);
  Check({32, 32, 64, 16, {4097}, {1}, std::nullopt, DType::kF32}, 43);
  Check({32, 4, 128, 16, {32768}, {1}, std::nullopt, DType::kBF16}, 44);
}

TEST_CASE("decode attention, every ISA: sliding window", "[decode_attention]") {
  for (int64_t window : {1, 5, 32, 700}) {
    Check({8, 2, 64, 16, {100, 33, 7, 2000}, {100, 3, 1, 1}, window, DType::kBF16}, 50 + window);
  }
}

TEST_CASE("decode attention, every ISA: attention sinks (gpt-oss)", "[decode_attention]") {
  Case c{6, 2, 48, 16, {1, 9, 40, 300}, {1, 9, 3, 1}, std::nullopt, DType::kF32};
  c.sinks = true;
  Check(c, 80);  // head_dim 48: 6 AVX2 vectors, 3 AVX-512 ones
  c.head_dim = 64;
  c.dtype = DType::kBF16;
  c.window = 8;  // a sliding layer of gpt-oss
  Check(c, 81);
  Check({64, 8, 64, 16, {4097, 130}, {1, 2}, std::nullopt, DType::kBF16, 0, true}, 82);  // merged
  Check({16, 1, 64, 16, {300}, {2}, std::nullopt, DType::kF16, 0, true}, 83);  // group 16 > 8
}

TEST_CASE("decode attention, every ISA: prefill chunks beside decode tokens",
          "[decode_attention]") {
  // 0: a whole prompt of 37; 1: a chunk of 20 after 50 cached; 2, 3: decode at 129 and 1000.
  Check({32, 8, 128, 16, {37, 70, 130, 1001}, {37, 20, 1, 1}, std::nullopt, DType::kBF16}, 60);
  Check({16, 4, 64, 32, {5, 600}, {5, 1}, std::nullopt, DType::kF32}, 61);
  // SmolLM2-135M's shape (9 heads over 3 KV heads, head_dim 64): a 43-token prompt, then decode.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Check({9, 3, 64, 16, {43, 44}, {43, 1}, std::nullopt, dtype}, 62);
  }
}

TEST_CASE("decode attention, every ISA: other shapes (group > 8, odd head dims, block sizes)",
          "[decode_attention]") {
  Check({16, 1, 64, 16, {300, 1}, {2, 1}, std::nullopt, DType::kBF16}, 70);  // group 16
  Check({6, 2, 64, 16, {77}, {3}, std::nullopt, DType::kF16}, 71);           // group 3
  Check({4, 2, 80, 16, {50}, {1}, std::nullopt, DType::kF32}, 72);           // AVX-512 falls back
  Check({4, 1, 36, 16, {50}, {1}, std::nullopt, DType::kF32}, 73);           // all fall back
  Check({8, 2, 128, 1, {40}, {2}, std::nullopt, DType::kBF16}, 74);
  Check({8, 2, 64, 128, {300}, {1}, std::nullopt, DType::kBF16}, 75);
  Check({8, 2, 64, 7, {60}, {1}, std::nullopt, DType::kF16}, 76);
}

// MLA's latent cache (KvCacheConfig::value_dim): one KV head whose value is the key row's first
// value_dim values, attended by every query head (absorbed queries). DeepSeek-V2-Lite's shape
// (16 heads, row 576 = kv_lora_rank 512 + RoPE 64), V3's 128 heads, and the tiny fixtures' odd
// ones (row 88 = 80 + 8: the AVX-512 kernel falls back to the portable one; row 52: all do).
TEST_CASE("decode attention, every ISA: MLA latent cache (value = prefix of the key row)",
          "[decode_attention][mla]") {
  Check({16, 1, 576, 16, {1, 17, 600, 1100}, {1, 1, 3, 1}, std::nullopt, DType::kBF16, 512}, 80);
  Check({16, 1, 576, 16, {4097}, {1}, std::nullopt, DType::kF32, 512}, 81);
  Check({128, 1, 576, 16, {70, 513}, {1, 1}, std::nullopt, DType::kBF16, 512}, 82);
  Check({6, 1, 88, 16, {90, 33}, {4, 1}, std::nullopt, DType::kF16, 80}, 83);
  Check({5, 1, 64, 16, {200}, {2}, std::nullopt, DType::kF32, 48}, 84);
  Check({5, 1, 52, 8, {40}, {1}, std::nullopt, DType::kBF16, 40}, 85);
  // The AMX path's other cases: key tiles that are not 16 rows of one block (block sizes 8 and 7,
  // a window that starts mid-block) are staged; 32 heads are two calls over the same keys; a
  // prefill chunk's rows beside decode rows.
  Check({16, 1, 576, 8, {300, 9}, {2, 1}, std::nullopt, DType::kBF16, 512}, 86);
  Check({32, 1, 576, 32, {1000, 45}, {1, 5}, 300, DType::kBF16, 512}, 87);
  Check({16, 1, 128, 7, {77}, {1}, std::nullopt, DType::kBF16, 64}, 88);
  // Scores growing along the keys (up to ~7x): the max in use moves at later steps and O's rows
  // are rescaled, within a chunk and across the chunks' merge.
  Check({16, 1, 576, 16, {1100, 300, 40}, {1, 2, 1}, std::nullopt, DType::kBF16, 512, false, 6.0f},
        89);
  Check({8, 2, 64, 16, {700}, {2}, std::nullopt, DType::kBF16, 0, false, 8.0f}, 92);
}

// Batch invariance: each sequence's rows come out bit for bit the same whether it is attended alone
// or beside 11 others, and with one thread or all. (Splitting long rows into chunks only when there
// were few work units made a lone sequence's softmax sum in another order than a batched one's.)
TEST_CASE("decode attention, every ISA: a row's bits do not depend on the batch or threads",
          "[decode_attention]") {
  const Case tc{8,
                2,
                64,
                16,
                {1500, 600, 40, 513, 2000, 1, 700, 33, 1100, 90, 512, 1025},
                {1, 1, 40, 1, 3, 1, 1, 1, 1, 1, 1, 2},
                std::nullopt,
                DType::kBF16};
  CheckBatchInvariance(tc, 90);
}

// The same for MLA's latent cache (AMX tiles where the CPU has them): 16 query heads over one
// 576-value row of which the value is the first 512.
TEST_CASE("decode attention, every ISA: an MLA row's bits do not depend on the batch or threads",
          "[decode_attention][mla]") {
  CheckBatchInvariance(
      {16, 1, 576, 16, {1100, 40, 513, 1, 700}, {1, 3, 1, 1, 2}, std::nullopt, DType::kBF16, 512},
      91);
}

// The kernels' multi-head work items (decode_attention_internal.h): attending KV heads [h, h + n)
// in one call (the AVX-512 kernel takes them heads inner, tile by tile) gives every head's
// accumulators, max and sum bit for bit as n one-head calls do, on a chunk that starts mid-block.
TEST_CASE("decode attention kernels: a multi-head call equals one-head calls bit for bit",
          "[decode_attention]") {
  namespace dai = decode_attention_internal;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const Case tc{32, 8, 128, 16, {700}, {1}, std::nullopt, dtype};
    const Fixture f = Build(tc, 95);
    const int group = 4;
    const int64_t d = tc.head_dim, q_heads = tc.heads;
    std::vector<float> qs(f.q.begin(), f.q.begin() + q_heads * d);
    for (float& x : qs) x *= f.scale;
    for (CpuIsa isa : SupportedCpuIsas()) {
      if (isa == CpuIsa::kPortable) continue;
      const dai::AttendGroupFn kernel =
          isa == CpuIsa::kAvx512 ? dai::AttendGroupAvx512 : dai::AttendGroupAvx2;
      for (auto [first, last] : {std::pair<int64_t, int64_t>{0, 699}, {21, 530}, {640, 645}}) {
        std::vector<float> acc(q_heads * d, std::nanf("")), m(q_heads, std::nanf("")),
            l(q_heads, std::nanf(""));
        kernel(f.view, f.tables[0].data(), 0, 8, first, last, qs.data(), group, acc.data(),
               m.data(), l.data());
        std::vector<float> acc1(acc.size(), std::nanf("")), m1(m.size(), std::nanf("")),
            l1(l.size(), std::nanf(""));
        for (int h = 0; h < 8; ++h) {
          kernel(f.view, f.tables[0].data(), h, 1, first, last, qs.data() + h * group * d, group,
                 acc1.data() + h * group * d, m1.data() + h * group, l1.data() + h * group);
        }
        INFO("isa " << CpuIsaName(isa) << ", dtype " << DTypeName(dtype) << ", keys " << first
                    << ".." << last);
        for (float x : acc) REQUIRE(std::isfinite(x));
        CHECK(std::memcmp(acc.data(), acc1.data(), acc.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(m.data(), m1.data(), m.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(l.data(), l1.data(), l.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("decode attention: ISA selection and MOEBATCH_CPU_ISA clamping", "[decode_attention]") {
  const std::vector<CpuIsa> supported = SupportedCpuIsas();
  REQUIRE(supported.front() == CpuIsa::kPortable);
  const CpuIsa selected = SelectedCpuIsa();
  REQUIRE(std::find(supported.begin(), supported.end(), selected) != supported.end());
  REQUIRE(std::string(CpuIsaName(CpuIsa::kAvx512)) == "avx512");

  const std::vector<CpuIsa> all{CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512};
  const std::vector<CpuIsa> avx2{CpuIsa::kPortable, CpuIsa::kAvx2};
  const std::vector<CpuIsa> none{CpuIsa::kPortable};
  std::string warning;
  CHECK(ResolveCpuIsa(nullptr, all, &warning) == CpuIsa::kAvx512);
  CHECK(warning.empty());
  CHECK(ResolveCpuIsa("", avx2, &warning) == CpuIsa::kAvx2);
  CHECK(warning.empty());
  CHECK(ResolveCpuIsa("portable", all, &warning) == CpuIsa::kPortable);
  CHECK(warning.empty());
  CHECK(ResolveCpuIsa("avx2", all, &warning) == CpuIsa::kAvx2);
  CHECK(warning.empty());
  CHECK(ResolveCpuIsa("avx512", avx2, &warning) == CpuIsa::kAvx2);
  CHECK(!warning.empty());
  CHECK(ResolveCpuIsa("avx512", none, &warning) == CpuIsa::kPortable);
  CHECK(!warning.empty());
  CHECK(ResolveCpuIsa("sse9", avx2, &warning) == CpuIsa::kAvx2);
  CHECK(!warning.empty());
}
