// The KV append path (cpu_attention/attention/kv_append.h), every ISA level this CPU has: the bytes it
// stores must equal PagedKvCache::Write's (the scalar ConvertFromF32 path) for random rows and for
// the values where rounding is delicate (ties, the f16 overflow edge, subnormals, infinities),
// and no byte outside the named slots may change.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "cpu_attention/attention/decode_attention.h"
#include "cpu_attention/attention/kv_append.h"
#include "engine/kv/kv_cache.h"

using namespace moebatch;

namespace {

KvLayerView ViewOf(PagedKvCache& cache, int64_t layer) {
  const KvCacheConfig& c = cache.config();
  return KvLayerView{cache.LayerBase(layer),
                     c.dtype,
                     c.num_kv_heads,
                     c.head_dim,
                     c.block_size,
                     cache.block_stride_bytes(),
                     cache.value_offset_bytes()};
}

// Values whose conversion is easy to get wrong, cycled through the rows.
std::vector<float> SpecialValues() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          1e6f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(),
                          1e-40f,
                          5.96e-8f,
                          2.98e-8f,
                          6.1e-5f,
                          3.0e-5f};
  // bf16 ties: exactly halfway between two bf16 values, with even and odd lower neighbours.
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x7f7fffffu}) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    v.push_back(f);
  }
  // f16 ties: 1 + 2^-11 (halfway, even below) and 1 + 3 * 2^-11 (halfway, odd below).
  v.push_back(1.0f + std::ldexp(1.0f, -11));
  v.push_back(1.0f + 3.0f * std::ldexp(1.0f, -11));
  return v;
}

}  // namespace

TEST_CASE("KV append, every ISA: same bytes as PagedKvCache::Write, other slots untouched",
          "[kv_append]") {
  const std::vector<float> specials = SpecialValues();
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t head_dim : {64, 128, 72, 20}) {
      for (CpuIsa isa : SupportedCpuIsas()) {
        CAPTURE(DTypeName(dtype), head_dim, CpuIsaName(isa));
        KvCacheConfig config{2, 3, head_dim, 16, 9, dtype};
        auto expected_or = PagedKvCache::Create(config);
        auto actual_or = PagedKvCache::Create(config);
        REQUIRE(expected_or.ok());
        REQUIRE(actual_or.ok());
        PagedKvCache& expected = **expected_or;
        PagedKvCache& actual = **actual_or;
        // Poison both caches identically so untouched bytes can be told from written ones.
        const size_t layer_bytes = config.num_blocks * expected.block_stride_bytes();
        for (int64_t layer = 0; layer < 2; ++layer) {
          std::memset(expected.LayerBase(layer), 0xa5, layer_bytes);
          std::memset(actual.LayerBase(layer), 0xa5, layer_bytes);
        }
        // Two sequences with scattered blocks; 37 rows: a prefill chunk crossing blocks and
        // decode tokens.
        const std::vector<int32_t> table_a = {7, 2, 5};
        const std::vector<int32_t> table_b = {0, 8};
        std::vector<KvAppendRow> rows;
        for (int64_t p = 3; p < 35; ++p) rows.push_back({table_a.data(), p});
        for (int64_t p : {0, 15, 16, 17, 31}) rows.push_back({table_b.data(), p});
        const int64_t n = static_cast<int64_t>(rows.size());
        const int64_t row_floats = config.num_kv_heads * head_dim;
        std::vector<float> k(n * row_floats), v(n * row_floats);
        std::mt19937 rng(static_cast<uint32_t>(head_dim * 31 + static_cast<int>(dtype)));
        std::normal_distribution<float> normal(0.0f, 3.0f);
        for (size_t i = 0; i < k.size(); ++i) {
          k[i] = i % 3 == 0 ? specials[(i / 3) % specials.size()] : normal(rng);
          v[i] = i % 5 == 0 ? -specials[(i / 5) % specials.size()] : normal(rng);
        }
        const int64_t layer = 1;
        for (int64_t i = 0; i < n; ++i) {
          const std::vector<int32_t>& table =
              rows[i].block_table == table_a.data() ? table_a : table_b;
          expected.Write(layer, table, rows[i].position, k.data() + i * row_floats,
                         v.data() + i * row_floats);
        }
        AppendKv(isa, ViewOf(actual, layer), rows.data(), n, k.data(), v.data());
        for (int64_t l = 0; l < 2; ++l) {
          CAPTURE(l);
          REQUIRE(std::memcmp(expected.LayerBase(l), actual.LayerBase(l), layer_bytes) == 0);
        }
      }
    }
  }
}

TEST_CASE("KV append, every ISA: NaN stays NaN", "[kv_append]") {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (CpuIsa isa : SupportedCpuIsas()) {
      CAPTURE(DTypeName(dtype), CpuIsaName(isa));
      KvCacheConfig config{1, 1, 32, 16, 1, dtype};
      auto cache_or = PagedKvCache::Create(config);
      REQUIRE(cache_or.ok());
      PagedKvCache& cache = **cache_or;
      std::vector<float> k(32, std::numeric_limits<float>::quiet_NaN());
      std::vector<float> v(32, -std::numeric_limits<float>::quiet_NaN());
      const std::vector<int32_t> table = {0};
      const KvAppendRow row{table.data(), 5};
      AppendKv(isa, ViewOf(cache, 0), &row, 1, k.data(), v.data());
      std::vector<float> back(32);
      ConvertToF32(dtype, cache.KeyBlock(0, 0) + 5 * 32 * 2, back.data(), 32);
      for (float x : back) REQUIRE(std::isnan(x));
      ConvertToF32(dtype, cache.KeyBlock(0, 0) + cache.value_offset_bytes() + 5 * 32 * 2,
                   back.data(), 32);
      for (float x : back) REQUIRE(std::isnan(x));
    }
  }
}
