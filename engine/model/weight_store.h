// The weight manager (MoE-Lens §6.5): the model's weights in host memory, one contiguous region
// per decoder layer, ready to be streamed to the GPU layer by layer by the data mover.
//
// Region layout of layer i (each tensor starts at a multiple of `alignment` bytes):
//   input_layernorm, q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, router (the
//   layer-wise weights), then expert 0..E-1: w1, w3, w2 (w1 and w3 of an expert are adjacent and,
//   their size being a multiple of the alignment for every real model, form one [2 * ffn, hidden]
//   matrix a backend may use as a single gate-up GEMM).
// A separate region holds embed_tokens, the final norm and lm_head (when not tied). An offset
// table per region names every tensor (offset, bytes, dtype, shape). `weights()` gives the same
// tensors as TensorInfo views, so the cpu backend runs from a WeightStore exactly as from a
// Checkpoint.
//
// Sources: a Checkpoint (its tensors copied, optionally converted to another dtype: bf16 -> f16
// for GPUs without bf16, the T4; or quantized at load, see WeightQuantization; a GGUF checkpoint's
// quantized tensors are copied as they are) or synthetic weights for benchmarks (a real model's
// config with deterministic pseudo-random values, optionally fewer layers, so no 94 GB download is
// needed). Before allocating, the total is checked against a host memory budget.
//
// Memory comes from a HostAllocator: pageable anonymous memory here, page-locked (pinned) memory
// from the cuda backend (cudaHostAlloc), which the GPU copies from at full PCIe speed.
//
// Threading: Load/Synthetic parallelise the copy with OpenMP; afterwards the store is read-only and
// may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "engine/model/host_memory.h"
#include "engine/model/model_config.h"

namespace moebatch {

struct WeightTensor {
  std::string name;  // the checkpoint's name, e.g. "model.layers.3.self_attn.q_proj.weight"
  DType dtype = DType::kBF16;     // the float type (when quant is not set)
  std::optional<GgmlType> quant;  // ggml blocks (engine/model/ggml_quants.h) instead
  std::vector<int64_t> shape;
  size_t offset = 0;  // bytes from the region start
  size_t nbytes = 0;
};

struct WeightRegion {
  std::byte* data = nullptr;
  size_t bytes = 0;                   // offset table extent (the allocation may be larger)
  std::vector<WeightTensor> tensors;  // in layout order
};

// Weights quantized at load (--weight_dtype int8|int4, --weight_group_size): round to nearest,
// group-wise, into ggml's blocks of 32 so the quantized kernels (cpu_attention/gemm/
// quant_linear.h) and the GGUF path share one format:
//   int8  Q8_0 blocks: q = round(x / d), d = max|x| / 127 over the group (symmetric);
//   int4  Q4_1 blocks: q = round((x - m) / d), m = min x, d = (max x - m) / 15 over the group.
// A group of `group_size` elements (a multiple of 32; the last group of a row may be shorter)
// shares d (and m): each of its blocks repeats them. group_size 32 is exactly ggml's
// quantize_row_q8_0_ref / quantize_row_q4_1_ref. The matrices of attention, the dense FFNs and
// the experts take `type`; embed_tokens and lm_head take int8 (Q8_0, group 32) whatever `type`
// (as llama.cpp keeps its output matrix at higher precision); norms, biases, routers and the
// shared-expert gate keep the store's float dtype.
struct WeightQuantization {
  GgmlType type = GgmlType::kQ8_0;  // kQ8_0 (int8) or kQ4_1 (int4)
  int64_t group_size = 32;          // elements per scale, a positive multiple of 32
};
// "int8" / "int4" for the quantization's type.
const char* WeightQuantizationName(const WeightQuantization& q);

struct WeightStoreOptions {
  // Store the weights in this dtype (bf16/f16/f32); nullopt keeps the checkpoint's (synthetic:
  // config torch_dtype). Norm weights are converted too.
  std::optional<DType> dtype;
  // Quantize the weight matrices at load (see WeightQuantization). Not for a GGUF checkpoint,
  // whose tensors keep their own types.
  std::optional<WeightQuantization> quantize;
  // The weights must fit in this many bytes of host memory together with `reserved_bytes`
  // (the KV cache and whatever else the caller will allocate). 0: AvailableHostMemoryBytes().
  int64_t host_budget_bytes = 0;
  int64_t reserved_bytes = 0;
  size_t alignment = 256;              // bytes; a power of two <= 4096
  HostAllocator* allocator = nullptr;  // null: PageableHostAllocator()
  // Called after each region is filled: (regions done, regions total, bytes done, bytes total).
  // Null: progress is logged (spdlog info) every ~10%.
  std::function<void(int64_t, int64_t, int64_t, int64_t)> progress;
};

class WeightStore {
 public:
  // Copies every tensor of `checkpoint` into per-layer regions. ResourceExhausted (naming the
  // bytes needed and the budget) before any allocation when the budget is too small;
  // InvalidArgument for an alignment that is not a power of two <= 4096 or an unsupported dtype.
  static absl::StatusOr<std::unique_ptr<WeightStore>> Load(const Checkpoint& checkpoint,
                                                           const WeightStoreOptions& options);

  // Synthetic weights for `config`: num_layers of them (0: config.num_hidden_layers; at most
  // that). Linear weights and embeddings uniform with standard deviation 0.02 (transformers'
  // initializer_range), norm weights 1; a function of (seed, tensor name, index) only, so the same
  // on every run and thread count. config() reports num_layers layers.
  static absl::StatusOr<std::unique_ptr<WeightStore>> Synthetic(const ModelConfig& config,
                                                                int64_t num_layers, uint64_t seed,
                                                                const WeightStoreOptions& options);

  // A store of the first num_layers layers of `base` (and its globals), sharing base's memory: no
  // copy; `base` must outlive it. For the pipeline profiler's one-layer device.
  // InvalidArgument for num_layers outside [1, base.num_layers()].
  static absl::StatusOr<std::unique_ptr<WeightStore>> View(const WeightStore& base,
                                                           int64_t num_layers);

  // Bytes the regions of `config` (num_layers layers) take in `dtype` (with `quantize`) with
  // `alignment`.
  static int64_t RequiredBytes(const ModelConfig& config, int64_t num_layers, DType dtype,
                               size_t alignment = 256,
                               const std::optional<WeightQuantization>& quantize = std::nullopt);
  // Bytes of one decoder layer's region in `dtype` (with `quantize`) with `alignment`:
  // max_layer_bytes() of a store of `config` (every layer has the same shape).
  static int64_t LayerRegionBytes(const ModelConfig& config, DType dtype, size_t alignment = 256,
                                  const std::optional<WeightQuantization>& quantize = std::nullopt);

  ~WeightStore();
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }         // the float tensors' type
  bool quantized() const { return quantized_; }  // whether any tensor is in ggml blocks
  const ModelWeights& weights() const { return weights_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  const WeightRegion& layer(int64_t i) const { return layers_[i]; }
  const WeightRegion& globals() const { return globals_; }
  size_t max_layer_bytes() const;  // the size of one slot of the GPU's two-slot weight buffer
  size_t total_bytes() const;      // all regions
  const char* allocator_name() const { return allocator_->name(); }

 private:
  WeightStore() = default;
  // The format of each tensor: `format` fills a WeightTensor's dtype / quant from its spec.
  using FormatFn = std::function<void(const TensorSpec&, WeightTensor*)>;
  static absl::StatusOr<std::unique_ptr<WeightStore>> Build(
      const ModelConfig& config, int64_t num_layers, DType dtype, const WeightStoreOptions& options,
      const FormatFn& format, const std::function<void(const WeightTensor&, std::byte*)>& fill);

  ModelConfig config_;
  DType dtype_ = DType::kBF16;
  bool quantized_ = false;
  HostAllocator* allocator_ = nullptr;
  bool owns_memory_ = true;        // false for a View
  std::vector<size_t> allocated_;  // per region (globals last)
  WeightRegion globals_;
  std::vector<WeightRegion> layers_;
  std::deque<TensorInfo> infos_;  // the views weights_ points into (deque: stable addresses)
  ModelWeights weights_;
};

}  // namespace moebatch
