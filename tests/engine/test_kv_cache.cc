// The block allocator and the paged KV cache layout.
#include <catch2/catch.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include "engine/kv/kv_cache.h"
#include "engine/model/model_config.h"

using namespace moebatch;

TEST_CASE("BlockAllocator hands out every block once and takes them back") {
  BlockAllocator alloc(5);
  std::set<int32_t> got;
  for (int i = 0; i < 5; ++i) {
    auto b = alloc.Allocate();
    REQUIRE(b.has_value());
    REQUIRE(got.insert(*b).second);
    REQUIRE(*b >= 0);
    REQUIRE(*b < 5);
  }
  REQUIRE(alloc.num_free() == 0);
  REQUIRE_FALSE(alloc.Allocate().has_value());
  std::vector<int32_t> table(got.begin(), got.end());
  alloc.FreeAll(&table);
  REQUIRE(table.empty());
  REQUIRE(alloc.num_free() == 5);
}

TEST_CASE("BlockAllocator: a shared block returns to the free list with its last holder") {
  BlockAllocator alloc(3);
  const int32_t b = *alloc.Allocate();
  CHECK(alloc.holders(b) == 1);
  alloc.Share(b);
  alloc.Share(b);
  CHECK(alloc.holders(b) == 3);
  CHECK(alloc.num_free() == 2);
  alloc.Free(b);
  alloc.Free(b);
  CHECK(alloc.num_free() == 2);  // one holder left
  CHECK(alloc.holders(b) == 1);
  alloc.Free(b);
  CHECK(alloc.num_free() == 3);
  CHECK(alloc.holders(b) == 0);
}

TEST_CASE("PagedKvCache::CopyBlock copies K and V of every layer, nothing else") {
  KvCacheConfig c{2, 2, 4, 4, 4, DType::kF32};
  auto cache_or = PagedKvCache::Create(c);
  REQUIRE(cache_or.ok());
  PagedKvCache& cache = **cache_or;
  const std::vector<int32_t> src = {0, 1}, other = {3};
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t pos = 0; pos < 6; ++pos) {
      std::vector<float> k(8, static_cast<float>(layer * 100 + pos)), v(8, -1.0f - pos);
      cache.Write(layer, src, pos, k.data(), v.data());
    }
    std::vector<float> k(8, 7.0f), v(8, 7.0f);
    cache.Write(layer, other, 0, k.data(), v.data());
  }
  cache.CopyBlock(1, 2);
  const size_t block_bytes = cache.block_stride_bytes();
  for (int64_t layer = 0; layer < 2; ++layer) {
    CHECK(std::memcmp(cache.KeyBlock(layer, 2), cache.KeyBlock(layer, 1), block_bytes) == 0);
    float f = 0;
    std::memcpy(&f, cache.KeyBlock(layer, 3), sizeof f);
    CHECK(f == 7.0f);  // the neighbour is untouched
  }
}

TEST_CASE("BlocksForTokens rounds up") {
  REQUIRE(BlocksForTokens(0, 16) == 0);
  REQUIRE(BlocksForTokens(1, 16) == 1);
  REQUIRE(BlocksForTokens(16, 16) == 1);
  REQUIRE(BlocksForTokens(17, 16) == 2);
}

TEST_CASE("PagedKvCache rejects bad sizes") {
  KvCacheConfig c{2, 2, 8, 4, 0, DType::kF32};
  auto cache = PagedKvCache::Create(c);
  REQUIRE_FALSE(cache.ok());
  REQUIRE(cache.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("PagedKvCache writes each token to [layer][block][K|V][head][slot][dim]") {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    KvCacheConfig c{3, 2, 8, 4, 6, dtype};
    auto cache_or = PagedKvCache::Create(c);
    REQUIRE(cache_or.ok());
    PagedKvCache& cache = **cache_or;
    REQUIRE(cache.total_bytes() == static_cast<size_t>(c.bytes_per_block() * c.num_blocks));
    const std::vector<int32_t> table = {4, 1, 3};  // scattered blocks
    for (int64_t layer = 0; layer < 3; ++layer) {
      for (int64_t pos = 0; pos < 10; ++pos) {
        std::vector<float> k(16), v(16);
        for (int i = 0; i < 16; ++i) {
          k[i] = static_cast<float>(layer * 1000 + pos * 16 + i);
          v[i] = -k[i] / 8.0f;
        }
        cache.Write(layer, table, pos, k.data(), v.data());
      }
    }
    const size_t elem = DTypeSize(dtype);
    auto read = [&](const std::byte* p) {
      float f;
      ConvertToF32(dtype, p, &f, 1);
      return f;
    };
    for (int64_t layer = 0; layer < 3; ++layer) {
      for (int64_t pos = 0; pos < 10; ++pos) {
        const std::byte* kb = cache.KeyBlock(layer, table[pos / 4]);
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t i = 0; i < 8; ++i) {
            const std::byte* kp = kb + ((h * 4 + pos % 4) * 8 + i) * elem;
            const float want_k = static_cast<float>(layer * 1000 + pos * 16 + h * 8 + i);
            float want_v = -want_k / 8.0f;
            float rounded_k = want_k;
            // Expected values go through the same rounding as the cache.
            std::vector<std::byte> tmp(4);
            ConvertFromF32(dtype, &want_k, tmp.data(), 1);
            ConvertToF32(dtype, tmp.data(), &rounded_k, 1);
            ConvertFromF32(dtype, &want_v, tmp.data(), 1);
            ConvertToF32(dtype, tmp.data(), &want_v, 1);
            REQUIRE(read(kp) == rounded_k);
            REQUIRE(read(kp + cache.value_offset_bytes()) == want_v);
          }
        }
      }
    }
  }
}

// MLA's latent cache (value_dim > 0): one row per token, layer and KV head, no V region: half the
// bytes per block, V at offset 0 (the key row itself), Write ignores v, CopyBlock copies the rows;
// value_dim beyond head_dim is refused. KvCacheConfigFor picks it for an MLA model.
TEST_CASE("PagedKvCache with value_dim stores the key row only (MLA latent cache)") {
  KvCacheConfig c{2, 1, 12, 4, 5, DType::kBF16};
  const int64_t both = c.bytes_per_block();
  c.value_dim = 8;
  REQUIRE(c.bytes_per_block() * 2 == both);
  auto cache_or = PagedKvCache::Create(c);
  REQUIRE(cache_or.ok());
  PagedKvCache& cache = **cache_or;
  REQUIRE(cache.total_bytes() == static_cast<size_t>(c.bytes_per_block() * c.num_blocks));
  REQUIRE(cache.value_offset_bytes() == 0);
  REQUIRE(cache.block_stride_bytes() == static_cast<size_t>(4 * 12 * 2));
  const std::vector<int32_t> table = {3, 0};
  std::vector<float> k(12), poison(12, 7.0f);
  for (int64_t pos = 0; pos < 6; ++pos) {
    for (int i = 0; i < 12; ++i) k[i] = static_cast<float>(pos * 12 + i);
    cache.Write(1, table, pos, k.data(), poison.data());
  }
  cache.CopyBlock(3, 4);
  for (int64_t pos = 0; pos < 6; ++pos) {
    for (int32_t block : {table[pos / 4], pos < 4 ? 4 : table[1]}) {
      const std::byte* row = cache.KeyBlock(1, block) + (pos % 4) * 12 * 2;
      for (int i = 0; i < 12; ++i) {
        float got;
        ConvertToF32(DType::kBF16, row + i * 2, &got, 1);
        REQUIRE(got == static_cast<float>(pos * 12 + i));  // exact in bf16 (< 256)
      }
    }
  }
  c.value_dim = 13;
  REQUIRE(PagedKvCache::Create(c).status().code() == absl::StatusCode::kInvalidArgument);

  ModelConfig mla;
  mla.num_key_value_heads = 1;
  mla.head_dim = 576;
  mla.mla = MlaConfig{0, 512, 128, 64, 128};
  const KvCacheConfig kv = KvCacheConfigFor(mla, 27, 16, 10, DType::kBF16);
  CHECK(kv.value_dim == 512);
  CHECK(kv.bytes_per_block() == 27 * 16 * 576 * 2);
  ModelConfig gqa;
  gqa.num_key_value_heads = 8;
  gqa.head_dim = 128;
  CHECK(KvCacheConfigFor(gqa, 32, 16, 10, DType::kBF16).value_dim == 0);
}

// The cache's mapping asks for transparent huge pages (MADV_HUGEPAGE): /proc/self/smaps marks it
// THP-eligible wherever the kernel's THP mode is not "never".
TEST_CASE("PagedKvCache asks for transparent huge pages") {
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    WARN("transparent huge pages are off on this host (" << mode << "): nothing to check");
    return;
  }
  // 8 blocks of 2 KV heads x 16 slots x 128 dims x 2 (K, V) x 4 bytes = 256 KiB per layer; 32
  // layers: 8 MiB, several 2 MiB pages.
  auto cache = PagedKvCache::Create({32, 2, 128, 16, 8, DType::kF32});
  REQUIRE(cache.ok());
  const auto at = reinterpret_cast<uintptr_t>((*cache)->LayerBase(0));
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_mapping = false, found = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) == 2) {  // a mapping's header
      in_mapping = lo <= at && at < hi;
      continue;
    }
    if (in_mapping && line.rfind("THPeligible:", 0) == 0) {
      found = true;
      INFO(line << " (THP mode: " << mode << ")");
      CHECK(line.find('1') != std::string::npos);
    }
  }
  CHECK(found);
}

// Layer groups (kv_cache.h): window layers beside full-context ones share block ids, the i-th
// layer of either group in layer slot i; every layer in one window is one group kept to it.
TEST_CASE("KvCacheConfig: window layers form a second group sharing the block ids") {
  KvCacheConfig c{5, 2, 4, 4, 6, DType::kF32};
  c.window_layers = {true, false, true, false, true};  // gpt-oss's alternation, odd count
  c.window = 8;
  CHECK(c.num_groups() == 2);
  CHECK(c.group(0) == KvGroup::kWindow);
  CHECK(c.group(1) == KvGroup::kMain);
  CHECK(c.group_window(KvGroup::kMain) == 0);
  CHECK(c.group_window(KvGroup::kWindow) == 8);
  CHECK(c.num_layer_slots() == 3);  // the larger group: 3 window layers
  CHECK(c.bytes_per_block() == 3 * 2 * 2 * 4 * 4 * 4);
  auto cache_or = PagedKvCache::Create(c);
  REQUIRE(cache_or.ok());
  PagedKvCache& cache = **cache_or;
  REQUIRE(cache.total_bytes() == static_cast<size_t>(c.bytes_per_block() * c.num_blocks));
  // Layer slots: window layers 0, 2, 4 in slots 0, 1, 2; main layers 1, 3 in slots 0, 1.
  CHECK(cache.LayerBase(0) == cache.LayerBase(1));
  CHECK(cache.LayerBase(2) == cache.LayerBase(3));
  CHECK(cache.LayerBase(4) == cache.LayerBase(0) + 2 * cache.block_stride_bytes() * 6);
  // A block in a window table and another in a main table never overlap; CopyBlock copies every
  // slot of the block.
  const std::vector<int32_t> main_table = {1}, window_table = {2};
  for (int64_t layer = 0; layer < 5; ++layer) {
    std::vector<float> k(8, static_cast<float>(10 * layer + 1)), v(8, static_cast<float>(-layer));
    cache.Write(layer, c.group(layer) == KvGroup::kMain ? main_table : window_table, 3, k.data(),
                v.data());
  }
  cache.CopyBlock(2, 5);
  for (int64_t layer = 0; layer < 5; ++layer) {
    const bool window = c.group(layer) == KvGroup::kWindow;
    const float* key =
        reinterpret_cast<const float*>(cache.KeyBlock(layer, window ? 2 : 1)) + 3 * 4;
    CHECK(key[0] == static_cast<float>(10 * layer + 1));
    if (window) {
      CHECK(std::memcmp(cache.KeyBlock(layer, 5), cache.KeyBlock(layer, 2),
                        cache.block_stride_bytes()) == 0);
    }
  }
}

TEST_CASE("KvCacheConfig: every layer in the window is one group, kept to the window") {
  KvCacheConfig c{3, 1, 4, 4, 2, DType::kBF16};
  c.window_layers = {true, true, true};
  c.window = 32;
  CHECK(c.num_groups() == 1);
  CHECK(c.group(2) == KvGroup::kMain);
  CHECK(c.group_window(KvGroup::kMain) == 32);
  CHECK(c.num_layer_slots() == 3);
  KvCacheConfig none{3, 1, 4, 4, 2, DType::kBF16};
  CHECK(none.num_groups() == 1);
  CHECK(none.group_window(KvGroup::kMain) == 0);
  // Malformed: a list not of num_layers entries, or no window.
  c.window_layers = {true, false};
  CHECK(PagedKvCache::Create(c).status().code() == absl::StatusCode::kInvalidArgument);
  c.window_layers = {true, false, true};
  c.window = 0;
  CHECK(PagedKvCache::Create(c).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("SetWindowLayers takes the model's sliding layers") {
  ModelConfig m;
  m.num_hidden_layers = 4;
  KvCacheConfig kv{4, 1, 4, 4, 2, DType::kBF16};
  SetWindowLayers(m, 4, &kv);  // no sliding_window
  CHECK(kv.window_layers.empty());
  CHECK(kv.window == 0);
  m.sliding_window = 128;
  m.sliding_layers = {true, false, true, false};  // gpt-oss's layer_types
  SetWindowLayers(m, 4, &kv);
  CHECK(kv.window_layers == std::vector<bool>{true, false, true, false});
  CHECK(kv.window == 128);
  CHECK(kv.num_groups() == 2);
  m.sliding_layers.clear();  // Mistral: every layer
  SetWindowLayers(m, 4, &kv);
  CHECK(kv.num_groups() == 1);
  CHECK(kv.group_window(KvGroup::kMain) == 128);
}

TEST_CASE("BlockAllocator::FreeAll skips the kNoBlock entries behind a window") {
  BlockAllocator alloc(4);
  std::vector<int32_t> table = {kNoBlock, kNoBlock, *alloc.Allocate(), *alloc.Allocate()};
  CHECK(alloc.num_free() == 2);
  alloc.FreeAll(&table);
  CHECK(table.empty());
  CHECK(alloc.num_free() == 4);
}
