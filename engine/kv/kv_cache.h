// The paged KV cache (vLLM's PagedAttention layout; MoE-Lens §5.5 models its block granularity b).
//
// Memory: one host allocation of num_blocks KV blocks for every layer. A KV block holds
// `block_size` token slots of K and V for one layer; block id `b` names the same slots in every
// layer, so a sequence needs one block table (vector of block ids) for the whole model. Layout:
//   [layer][block][K | V][kv_head][slot][head_dim]      element type `dtype` (f32, bf16 or f16)
// so that one KV head's keys for consecutive slots are contiguous (what decode attention reads).
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

struct KvCacheConfig {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  // token slots per block
  int64_t num_blocks = 0;
  DType dtype = DType::kBF16;
  // 0: K and V rows of head_dim each. > 0: the value is the key row's first value_dim values and
  // nothing is stored for V (MLA's latent cache: ModelConfig::mla, key row [c_kv | k_pe], value
  // c_kv, value_dim = kv_lora_rank); the layout is then [layer][block][kv_head][slot][head_dim].
  int64_t value_dim = 0;

  // Bytes one block id costs across all layers (K and V, or K alone when value_dim > 0).
  int64_t bytes_per_block() const {
    return num_layers * (value_dim > 0 ? 1 : 2) * num_kv_heads * block_size * head_dim *
           static_cast<int64_t>(DTypeSize(dtype));
  }
};

// The KV cache shape of `config`'s attention (ModelConfig: GQA K and V, or MLA's latent rows).
struct ModelConfig;
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

  // Start of block `block`'s keys for `layer`: [kv_heads, block_size, head_dim].
  std::byte* KeyBlock(int64_t layer, int32_t block) const;
  // Bytes between consecutive block ids within one layer, and from a block's K to its V (0 when
  // the value is part of the key row: value_dim > 0).
  size_t block_stride_bytes() const { return block_stride_; }
  size_t value_offset_bytes() const { return value_offset_; }
  std::byte* LayerBase(int64_t layer) const { return data_.get() + layer * layer_stride_; }

  // Stores the K and V rows of one token at absolute `position` of the sequence whose block table
  // is `block_table` (which must already cover the position). k, v: [kv_heads, head_dim] f32,
  // converted to the cache dtype (round to nearest even). v is not read when value_dim > 0.
  // The scalar one-token path (ConvertFromF32): the engine stores whole passes with
  // cpu_attention/attention/kv_append.h's AppendKv, which the tests check against this.
  void Write(int64_t layer, const std::vector<int32_t>& block_table, int64_t position,
             const float* k, const float* v);

  // Copies block `src`'s K and V (every slot, every layer) into block `dst`: the copy-on-write of
  // a block that several sequences share (SchedulerOutput::copies). bytes_per_block() bytes.
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
  std::unique_ptr<std::byte, Unmapper> data_;
};

}  // namespace moebatch
