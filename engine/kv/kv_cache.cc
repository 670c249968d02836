#include "engine/kv/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/model_config.h"

namespace moebatch {

void PagedKvCache::Unmapper::operator()(std::byte* p) const { ::munmap(p, bytes); }

PagedKvCache::PagedKvCache(const KvCacheConfig& config) : config_(config) {}

absl::StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const KvCacheConfig& config) {
  if (config.num_layers <= 0 || config.num_kv_heads <= 0 || config.head_dim <= 0 ||
      config.block_size <= 0 || config.num_blocks <= 0 || config.value_dim < 0 ||
      config.value_dim > config.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: every size must be positive (layers ", config.num_layers, ", kv heads ",
        config.num_kv_heads, ", head_dim ", config.head_dim, ", block_size ", config.block_size,
        ", blocks ", config.num_blocks, ", value_dim ", config.value_dim, " <= head_dim)"));
  }
  if (!config.window_layers.empty() &&
      (static_cast<int64_t>(config.window_layers.size()) != config.num_layers ||
       config.window <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: window_layers must list the ", config.num_layers, " layers (has ",
        config.window_layers.size(), ") with a positive window (", config.window, ")"));
  }
  std::unique_ptr<PagedKvCache> cache(new PagedKvCache(config));
  const size_t elem = DTypeSize(config.dtype);
  cache->head_stride_ = config.block_size * config.head_dim * elem;
  const size_t key_bytes = config.num_kv_heads * cache->head_stride_;
  cache->value_offset_ = config.value_dim > 0 ? 0 : key_bytes;
  cache->block_stride_ = config.value_dim > 0 ? key_bytes : 2 * key_bytes;
  cache->layer_stride_ = cache->block_stride_ * config.num_blocks;
  cache->bytes_ = cache->layer_stride_ * config.num_layer_slots();
  // Each group's i-th layer in slot i.
  cache->layer_slot_.resize(config.num_layers);
  int64_t next[2] = {0, 0};
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    cache->layer_slot_[layer] = next[static_cast<int>(config.group(layer))]++;
  }
  void* p =
      ::mmap(nullptr, cache->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: cannot allocate ", cache->bytes_,
                                                     " bytes (", config.num_blocks, " blocks of ",
                                                     config.bytes_per_block(), " bytes)"));
  }
  // Transparent huge pages (THP mode "madvise", Debian's default, gives them only to regions that
  // ask): decode attention walks each sequence's blocks scattered over the cache, and with 4 KiB
  // pages every K or V run of a block is a TLB miss, a two-level page walk under a hypervisor.
  // docs/performance.md: decode attention read 0.5-9% faster in 7 of 8 paired runs. Advisory only;
  // without THP support the call fails or does nothing and the cache works as before.
  (void)::madvise(p, cache->bytes_, MADV_HUGEPAGE);
  cache->data_ =
      std::unique_ptr<std::byte, Unmapper>(static_cast<std::byte*>(p), Unmapper{cache->bytes_});
  return cache;
}

KvCacheConfig KvCacheConfigFor(const ModelConfig& config, int64_t num_layers, int64_t block_size,
                               int64_t num_blocks, DType dtype) {
  KvCacheConfig kv{num_layers, config.num_key_value_heads, config.head_dim, block_size, num_blocks,
                   dtype};
  if (config.mla) kv.value_dim = config.attention_value_dim();  // MLA: latent rows, stored once
  return kv;
}

int64_t KvCacheConfig::num_window_layers() const {
  return std::count(window_layers.begin(), window_layers.end(), true);
}

int64_t KvCacheConfig::group_window(KvGroup g) const {
  if (window_layers.empty()) return 0;
  // The main group attends the window only when every layer does.
  return g == KvGroup::kWindow || num_window_layers() == num_layers ? window : 0;
}

int64_t KvCacheConfig::num_layer_slots() const {
  if (num_groups() == 1) return num_layers;
  return std::max(num_window_layers(), num_layers - num_window_layers());
}

void SetWindowLayers(const ModelConfig& config, int64_t num_layers, KvCacheConfig* kv) {
  kv->window_layers.assign(num_layers, false);
  kv->window = 0;
  bool any = false;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    if (std::optional<int64_t> w = config.LayerSlidingWindow(layer); w && *w > 0) {
      kv->window_layers[layer] = true;
      kv->window = *w;  // one sliding_window per model
      any = true;
    }
  }
  if (!any) kv->window_layers.clear();
}

std::byte* PagedKvCache::KeyBlock(int64_t layer, int32_t block) const {
  return LayerBase(layer) + static_cast<size_t>(block) * block_stride_;
}

void PagedKvCache::Write(int64_t layer, const std::vector<int32_t>& block_table, int64_t position,
                         const float* k, const float* v) {
  const int64_t bs = config_.block_size;
  assert(position / bs < static_cast<int64_t>(block_table.size()));
  std::byte* key_block = KeyBlock(layer, block_table[position / bs]);
  const size_t elem = DTypeSize(config_.dtype);
  const size_t slot_offset = static_cast<size_t>(position % bs) * config_.head_dim * elem;
  for (int64_t h = 0; h < config_.num_kv_heads; ++h) {
    std::byte* kdst = key_block + h * head_stride_ + slot_offset;
    ConvertFromF32(config_.dtype, k + h * config_.head_dim, kdst, config_.head_dim);
    if (config_.value_dim > 0) continue;  // the value is part of the key row
    ConvertFromF32(config_.dtype, v + h * config_.head_dim, kdst + value_offset_, config_.head_dim);
  }
}

void PagedKvCache::CopyBlock(int32_t src, int32_t dst) {
  assert(src >= 0 && src < config_.num_blocks && dst >= 0 && dst < config_.num_blocks);
  for (int64_t slot = 0; slot < config_.num_layer_slots(); ++slot) {
    std::byte* base = data_.get() + slot * layer_stride_;
    std::memcpy(base + static_cast<size_t>(dst) * block_stride_,
                base + static_cast<size_t>(src) * block_stride_, block_stride_);
  }
}

}  // namespace moebatch
