// The paged KV cache (vLLM's PagedAttention layout; MoE-Lens §5.5 models its block granularity b).
//
// Memory: one host allocation of num_blocks KV blocks. A KV block holds `block_size` token slots
// of K and V for every layer of one layer group (KvGroup); block id `b` names the same slots in
// each of them, so a sequence needs one block table (vector of block ids) per group. Layout:
//   [layer slot][block][K | V][kv_head][slot][head_dim]   element type `dtype` (f32, bf16 or f16)
// so that one KV head's keys for consecutive slots are contiguous (what decode attention reads).
//
// Layer groups. Without sliding-window layers every layer is in the main group and its layer slot
// is its index. When some layers attend only a sliding window (ModelConfig::LayerSlidingWindow:
// gpt-oss's sliding layers) and others the whole context, the window layers form the window group:
// a sequence's window block table holds only the blocks its next queries can still read (the
// scheduler frees the ones behind the window, engine/scheduler.h), and both groups draw block ids
// from the one pool, the i-th layer of either group in layer slot i (vLLM's hybrid KV cache
// manager does the same). So memory moves between full-context and window rows as the sequences
// need: gpt-oss-20b (12 + 12 layers, window 128) keeps 9 + 256 blocks for a sequence of 4,096
// tokens instead of 2 x 256. With unequal groups the smaller one leaves layer slots of its blocks
// unused. When every layer attends the same window (Mistral's sliding_window), there is one group,
// the main one, and its table is the one kept to the window.
//
// Which blocks a sequence holds is kv/block_allocator.h's business (the scheduler's).
//
// Threading: PagedKvCache::Write may run on many threads at once for distinct (layer, position)
// slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/dtype.h"

namespace moebatch {

// The block table a layer's rows are found through.
enum class KvGroup { kMain = 0, kWindow = 1 };

struct KvCacheConfig {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  // token slots per block
  int64_t num_blocks = 0;
  DType dtype = DType::kBF16;
  // 0: K and V rows of head_dim each. > 0: the value is the key row's first value_dim values and
  // nothing is stored for V (MLA's latent cache: ModelConfig::mla, key row [c_kv | k_pe], value
  // c_kv, value_dim = kv_lora_rank); the layout is then [slot][block][kv_head][slot][head_dim].
  int64_t value_dim = 0;
  // [num_layers] true for a layer whose queries attend only the last `window` tokens (their own
  // included). Empty: none does. SetWindowLayers fills both from the model.
  std::vector<bool> window_layers = {};
  int64_t window = 0;

  // Layers that attend the window (true entries of window_layers).
  int64_t num_window_layers() const;
  // Block tables a sequence holds: 2 when some layers, not all, attend the window; else 1.
  int num_groups() const {
    const int64_t windowed = num_window_layers();
    return windowed > 0 && windowed < num_layers ? 2 : 1;
  }
  KvGroup group(int64_t layer) const {
    return num_groups() == 2 && window_layers[layer] ? KvGroup::kWindow : KvGroup::kMain;
  }
  // The window a group's table is kept to (0: the whole context): the window group's, or the main
  // group's when every layer attends the window.
  int64_t group_window(KvGroup g) const;
  // Layer slots a block id stores: num_layers with one group, the larger group's layers with two.
  int64_t num_layer_slots() const;
  // Bytes of one block of one layer (K and V, or K alone when value_dim > 0).
  int64_t layer_block_bytes() const {
    return (value_dim > 0 ? 1 : 2) * num_kv_heads * block_size * head_dim *
           static_cast<int64_t>(DTypeSize(dtype));
  }
  // Bytes one block id costs.
  int64_t bytes_per_block() const { return num_layer_slots() * layer_block_bytes(); }
};

// The window layers of `config` (ModelConfig::LayerSlidingWindow) for a cache of `num_layers`
// layers: kv->window_layers and kv->window set, or both cleared when no layer has a window.
struct ModelConfig;
void SetWindowLayers(const ModelConfig& config, int64_t num_layers, KvCacheConfig* kv);

// The KV cache shape of `config`'s attention (ModelConfig: GQA K and V, or MLA's latent rows), one
// group for every layer (SetWindowLayers adds the window group; the engine's plan does).
KvCacheConfig KvCacheConfigFor(const ModelConfig& config, int64_t num_layers, int64_t block_size,
                               int64_t num_blocks, DType dtype);

class PagedKvCache {
 public:
  // Reserves config.num_blocks * bytes_per_block() bytes of anonymous memory (page-aligned, zero
  // pages mapped lazily: resident memory grows with the blocks actually written, in 2 MiB steps
  // where transparent huge pages back it: the mapping asks for them). ResourceExhausted
  // when the mapping fails; InvalidArgument for non-positive sizes.
  static absl::StatusOr<std::unique_ptr<PagedKvCache>> Create(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  size_t total_bytes() const { return bytes_; }

  // Start of block `block`'s keys for `layer`: [kv_heads, block_size, head_dim]. `block` comes
  // from the table of the layer's group (config().group(layer)).
  std::byte* KeyBlock(int64_t layer, int32_t block) const;
  // Bytes between consecutive block ids within one layer, and from a block's K to its V (0 when
  // the value is part of the key row: value_dim > 0).
  size_t block_stride_bytes() const { return block_stride_; }
  size_t value_offset_bytes() const { return value_offset_; }
  std::byte* LayerBase(int64_t layer) const {
    return data_.get() + layer_slot_[layer] * layer_stride_;
  }

  // Stores the K and V rows of one token at absolute `position` of the sequence whose block table
  // is `block_table` (its table of the layer's group, which must already cover the position). k, v:
  // [kv_heads, head_dim] f32, converted to the cache dtype (round to nearest even). v is not read
  // when value_dim > 0. The scalar one-token path (ConvertFromF32): the engine stores whole passes
  // with cpu_attention/attention/kv_append.h's AppendKv, which the tests check against this.
  void Write(int64_t layer, const std::vector<int32_t>& block_table, int64_t position,
             const float* k, const float* v);

  // Copies block `src`'s K and V (every slot, every layer slot) into block `dst`: the
  // copy-on-write of a block that several sequences share (SchedulerOutput::copies).
  // bytes_per_block() bytes.
  void CopyBlock(int32_t src, int32_t dst);

 private:
  struct Unmapper {
    size_t bytes;
    void operator()(std::byte* p) const;
  };
  explicit PagedKvCache(const KvCacheConfig& config);
  KvCacheConfig config_;
  size_t bytes_ = 0;
  size_t block_stride_ = 0, value_offset_ = 0, layer_stride_ = 0, head_stride_ = 0;
  std::vector<int64_t> layer_slot_;  // [num_layers] the layer slot each layer's rows use
  std::unique_ptr<std::byte, Unmapper> data_;
};

}  // namespace moebatch
