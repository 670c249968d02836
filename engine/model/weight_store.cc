#include "engine/model/weight_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/family.h"
#include "engine/model/ggml_quants.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

class Pageable final : public HostAllocator {
 public:
  absl::StatusOr<std::byte*> Allocate(size_t bytes) override {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map ", bytes, " bytes of host memory for weights"));
    }
    return static_cast<std::byte*>(p);
  }
  void Free(std::byte* data, size_t bytes) override { ::munmap(data, bytes); }
  const char* name() const override { return "pageable"; }
};

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

std::string GiB(int64_t bytes) {
  if (bytes < (int64_t{1} << 30)) return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
  return absl::StrFormat("%.2f GiB", bytes / double(1 << 30));
}

// The tensors of the globals region (index 0) and of each layer region, in layout order, with the
// ModelWeights fields they fill (weights->layers is sized here): the family's
// (engine/model/family.h).
using PlannedTensor = TensorSpec;
std::vector<std::vector<PlannedTensor>> PlanLayout(const ModelConfig& c, int64_t num_layers,
                                                   ModelWeights* w) {
  return ModelTensors(c, num_layers, w);
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// dst[0, n) (dst_type) = src[0, n) (src_type), through f32 when the types differ (exact widening,
// round-to-nearest-even narrowing: engine/model/dtype.h). Parallel over chunks.
void CopyConverted(const std::byte* src, DType src_type, std::byte* dst, DType dst_type,
                   int64_t n) {
  if (src_type == dst_type) {
    const size_t bytes = static_cast<size_t>(n) * DTypeSize(src_type);
    constexpr size_t kChunk = size_t{1} << 22;
#pragma omp parallel for schedule(static) if (bytes > kChunk)
    for (size_t off = 0; off < bytes; off += kChunk) {
      std::memcpy(dst + off, src + off, std::min(kChunk, bytes - off));
    }
    return;
  }
  constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel if (n > kChunk)
  {
    std::vector<float> buf(kChunk);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      ConvertToF32(src_type, src + i * DTypeSize(src_type), buf.data(), m);
      ConvertFromF32(dst_type, buf.data(), dst + i * DTypeSize(dst_type), m);
    }
  }
}

uint64_t HashName(const std::string& s) {  // FNV-1a, 64 bit
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool IsNormName(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

// Whether WeightQuantization applies to tensor `name` of `shape` (the weight matrices of
// attention, dense FFNs and experts, embed_tokens and lm_head; not routers or the shared-expert
// gate, whose few values decide routing, nor MLA's kv_b_proj, whose per-head W_UK and W_UV
// slices both backends multiply in floats: CpuDevice::PrepareMla, the cuda backend's strided
// GEMMs).
bool Quantizable(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || shape[1] % 32 != 0) return false;
  const auto ends_with = [&](const char* suffix) {
    const std::string s = suffix;
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return !ends_with(".gate.weight") && !ends_with("shared_expert_gate.weight") &&
         !ends_with(".kv_b_proj.weight");
}

bool IsEmbeddingOrHead(const std::string& name) {
  return name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

// The format WeightQuantization `q` gives a tensor from a float source in store dtype `dtype`.
// With `mxfp4_experts` (gpt-oss's official checkpoints, ModelConfig::mxfp4_experts) a routed
// expert's matrices not otherwise quantized are MXFP4, as the checkpoint stores them.
void QuantizedFormat(const std::optional<WeightQuantization>& q, DType dtype, const TensorSpec& t,
                     WeightTensor* wt, bool mxfp4_experts = false) {
  wt->dtype = dtype;
  wt->quant.reset();
  if (q && Quantizable(t.name, t.shape)) {
    wt->quant = IsEmbeddingOrHead(t.name) ? GgmlType::kQ8_0 : q->type;
  } else if (mxfp4_experts && t.shape.size() == 2 && t.shape[1] % 32 == 0 &&
             t.name.find(".mlp.experts.") != std::string::npos) {
    wt->quant = GgmlType::kMXFP4;
  }
}

int64_t TensorBytes(const WeightTensor& wt) {
  if (wt.quant) return wt.shape[0] * GgmlRowBytes(GgmlTypeInfoOf(*wt.quant), wt.shape.back());
  return Numel(wt.shape) * static_cast<int64_t>(DTypeSize(wt.dtype));
}

// The group size tensor `wt` is quantized with: the option's, but 32 for embed_tokens / lm_head.
int64_t GroupSize(const WeightQuantization& q, const WeightTensor& wt) {
  return IsEmbeddingOrHead(wt.name) ? 32 : q.group_size;
}

// Quantizes n f32 rows of `cols` into dst (rows of wt's blocks), parallel over rows.
void QuantizeRows(const WeightTensor& wt, int64_t group_size,
                  const std::function<void(int64_t, float*)>& row_f32, std::byte* dst) {
  const int64_t rows = wt.shape[0], cols = wt.shape[1];
  const int64_t row_bytes = GgmlRowBytes(GgmlTypeInfoOf(*wt.quant), cols);
#pragma omp parallel if (rows * cols > (1 << 16))
  {
    std::vector<float> buf(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      row_f32(r, buf.data());
      (void)QuantizeRow(*wt.quant, buf.data(), cols, group_size, dst + r * row_bytes);
    }
  }
}

}  // namespace

const char* WeightQuantizationName(const WeightQuantization& q) {
  return q.type == GgmlType::kQ4_1 ? "int4" : "int8";
}

HostAllocator& PageableHostAllocator() {
  static Pageable* allocator = new Pageable();
  return *allocator;
}

int64_t AvailableHostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

int64_t WeightStore::RequiredBytes(const ModelConfig& config, int64_t num_layers, DType dtype,
                                   size_t alignment,
                                   const std::optional<WeightQuantization>& quantize) {
  ModelWeights scratch;
  int64_t total = 0;
  for (const auto& region : PlanLayout(config, num_layers, &scratch)) {
    size_t bytes = 0;
    for (const PlannedTensor& t : region) {
      WeightTensor wt;
      wt.name = t.name;
      wt.shape = t.shape;
      QuantizedFormat(quantize, dtype, t, &wt, config.mxfp4_experts);
      bytes = AlignUp(bytes, alignment) + TensorBytes(wt);
    }
    total += static_cast<int64_t>(bytes);
  }
  return total;
}

int64_t WeightStore::LayerRegionBytes(const ModelConfig& config, DType dtype, size_t alignment,
                                      const std::optional<WeightQuantization>& quantize) {
  ModelWeights scratch;
  const auto regions = PlanLayout(config, 1, &scratch);
  size_t bytes = 0;
  for (const PlannedTensor& t : regions[1]) {
    WeightTensor wt;
    wt.name = t.name;
    wt.shape = t.shape;
    QuantizedFormat(quantize, dtype, t, &wt, config.mxfp4_experts);
    bytes = AlignUp(bytes, alignment) + TensorBytes(wt);
  }
  return static_cast<int64_t>(bytes);
}

WeightStore::~WeightStore() {
  if (!owns_memory_) return;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].data != nullptr) allocator_->Free(layers_[i].data, allocated_[i]);
  }
  if (globals_.data != nullptr) allocator_->Free(globals_.data, allocated_.back());
}

absl::StatusOr<std::unique_ptr<WeightStore>> WeightStore::View(const WeightStore& base,
                                                               int64_t num_layers) {
  if (num_layers < 1 || num_layers > base.num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight store view: ", num_layers, " layers of ", base.num_layers()));
  }
  std::unique_ptr<WeightStore> view(new WeightStore());
  view->config_ = base.config_;
  view->config_.num_hidden_layers = num_layers;
  view->dtype_ = base.dtype_;
  view->allocator_ = base.allocator_;
  view->owns_memory_ = false;
  view->globals_ = base.globals_;
  view->layers_.assign(base.layers_.begin(), base.layers_.begin() + num_layers);
  view->weights_ = base.weights_;  // points at base's TensorInfos
  view->weights_.layers.resize(num_layers);
  return view;
}

size_t WeightStore::max_layer_bytes() const {
  size_t m = 0;
  for (const WeightRegion& r : layers_) m = std::max(m, r.bytes);
  return m;
}

size_t WeightStore::total_bytes() const {
  size_t total = globals_.bytes;
  for (const WeightRegion& r : layers_) total += r.bytes;
  return total;
}

absl::StatusOr<std::unique_ptr<WeightStore>> WeightStore::Build(
    const ModelConfig& config, int64_t num_layers, DType dtype, const WeightStoreOptions& options,
    const FormatFn& format, const std::function<void(const WeightTensor&, std::byte*)>& fill) {
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0 ||
      options.alignment > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight alignment: must be a power of two <= 4096 bytes, got ", options.alignment));
  }
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) {
    return absl::InvalidArgumentError("weight dtype: must be bf16, f16 or f32");
  }
  if (options.quantize &&
      (options.quantize->group_size <= 0 || options.quantize->group_size % 32 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_group_size: must be a positive multiple of 32, got ",
                     options.quantize->group_size));
  }
  // Every tensor's format and bytes, then the total against the budget.
  std::vector<std::vector<WeightTensor>> formats;
  int64_t need = 0;
  {
    ModelWeights scratch;
    for (const auto& region : PlanLayout(config, num_layers, &scratch)) {
      size_t bytes = 0;
      auto& out = formats.emplace_back();
      for (const PlannedTensor& t : region) {
        WeightTensor& wt = out.emplace_back();
        wt.name = t.name;
        wt.shape = t.shape;
        format(t, &wt);
        wt.offset = AlignUp(bytes, options.alignment);
        wt.nbytes = static_cast<size_t>(TensorBytes(wt));
        bytes = wt.offset + wt.nbytes;
      }
      need += static_cast<int64_t>(bytes);
    }
  }
  const int64_t budget =
      options.host_budget_bytes > 0 ? options.host_budget_bytes : AvailableHostMemoryBytes();
  if (budget > 0 && need + options.reserved_bytes > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weights need ", GiB(need), " of host memory (", num_layers, " layers, ",
        options.quantize ? WeightQuantizationName(*options.quantize)
                         : std::string(DTypeName(dtype)),
        ")", options.reserved_bytes > 0 ? " plus " : "",
        options.reserved_bytes > 0 ? GiB(options.reserved_bytes) + " reserved (KV cache)" : "",
        ", but the host memory budget is ", GiB(budget),
        options.host_budget_bytes > 0 ? "" : " (MemAvailable)"));
  }

  std::unique_ptr<WeightStore> store(new WeightStore());
  store->config_ = config;
  store->config_.num_hidden_layers = num_layers;
  store->dtype_ = dtype;
  store->allocator_ = options.allocator != nullptr ? options.allocator : &PageableHostAllocator();
  auto plan = PlanLayout(store->config_, num_layers, &store->weights_);
  store->layers_.resize(num_layers);
  store->allocated_.assign(num_layers + 1, 0);

  const int64_t regions = static_cast<int64_t>(plan.size());
  int64_t done_bytes = 0;
  int last_decile = 0;
  // Globals first in the plan; stored last in allocated_ (layers keep their index).
  for (int64_t r = 0; r < regions; ++r) {
    WeightRegion& region = r == 0 ? store->globals_ : store->layers_[r - 1];
    region.tensors = std::move(formats[r]);
    region.bytes =
        region.tensors.empty() ? 0 : region.tensors.back().offset + region.tensors.back().nbytes;
    const size_t allocation = AlignUp(std::max<size_t>(region.bytes, 1), 4096);
    auto data = store->allocator_->Allocate(allocation);
    if (!data.ok()) return data.status();
    region.data = *data;
    store->allocated_[r == 0 ? num_layers : r - 1] = allocation;
    for (size_t i = 0; i < plan[r].size(); ++i) {
      const WeightTensor& wt = region.tensors[i];
      std::byte* dst = region.data + wt.offset;
      fill(wt, dst);
      TensorInfo& info = store->infos_.emplace_back();
      info.name = wt.name;
      if (wt.quant) {
        info.dtype_name = GgmlTypeInfoOf(*wt.quant).name;
        info.quant = wt.quant;
        store->quantized_ = true;
      } else {
        info.dtype_name = std::string(DTypeName(wt.dtype));
        info.dtype = wt.dtype;
      }
      info.shape = wt.shape;
      info.data = dst;
      info.nbytes = wt.nbytes;
      info.file =
          absl::StrCat("(host weight region ", r == 0 ? "globals" : std::to_string(r - 1), ")");
      *plan[r][i].target = &info;
    }
    done_bytes += static_cast<int64_t>(region.bytes);
    if (options.progress) {
      options.progress(r + 1, regions, done_bytes, need);
    } else if (const int decile = static_cast<int>(10 * done_bytes / std::max<int64_t>(need, 1));
               decile > last_decile || r + 1 == regions) {
      last_decile = decile;
      spdlog::info("weights: {}/{} regions, {} of {} in {} host memory", r + 1, regions,
                   GiB(done_bytes), GiB(need), store->allocator_->name());
    }
  }
  if (config.tie_word_embeddings) store->weights_.lm_head = store->weights_.embed_tokens;
  return store;
}

absl::StatusOr<std::unique_ptr<WeightStore>> WeightStore::Load(const Checkpoint& checkpoint,
                                                               const WeightStoreOptions& options) {
  const ModelConfig& c = checkpoint.config();
  const DType dtype = options.dtype.value_or(c.torch_dtype);
  if (options.quantize && checkpoint.gguf() != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_dtype ", WeightQuantizationName(*options.quantize), ": ",
                     checkpoint.dir(), " is a GGUF file, whose tensors keep their own types"));
  }
  // Every tensor was checked by Checkpoint::Load; look each up by name.
  ModelWeights scratch;
  for (const auto& region : PlanLayout(c, c.num_hidden_layers, &scratch)) {
    for (const PlannedTensor& t : region) {
      const TensorInfo* info = checkpoint.Find(t.name);
      if (info == nullptr || (!info->dtype && !info->quant) || info->shape != t.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint tensor \"", t.name, "\" is missing or malformed"));
      }
    }
  }
  // GGUF tensors in blocks stay so (bytes copied); float ones take the store dtype, or the
  // quantization asked for.
  const FormatFn format = [&](const TensorSpec& t, WeightTensor* wt) {
    const TensorInfo* src = checkpoint.Find(t.name);
    if (src->quant) {
      wt->quant = src->quant;
      wt->dtype = dtype;
    } else {
      QuantizedFormat(options.quantize, dtype, t, wt);
    }
  };
  auto store = Build(
      c, c.num_hidden_layers, dtype, options, format, [&](const WeightTensor& wt, std::byte* dst) {
        const TensorInfo* src = checkpoint.Find(wt.name);
        if (src->quant) {
          std::memcpy(dst, src->data, wt.nbytes);
        } else if (wt.quant) {
          const int64_t cols = wt.shape[1];
          QuantizeRows(
              wt, GroupSize(*options.quantize, wt),
              [&](int64_t r, float* row) {
                ConvertToF32(*src->dtype, src->data + r * cols * DTypeSize(*src->dtype), row, cols);
              },
              dst);
        } else {
          CopyConverted(src->data, *src->dtype, dst, wt.dtype, Numel(wt.shape));
        }
        if (!checkpoint.OwnsData(*src)) DropMappedPages(src->data, src->nbytes);
      });
  if (store.ok()) {
    spdlog::info("weights: {} copied into {} {} regions ({}{}, max layer {})", checkpoint.dir(),
                 (*store)->num_layers() + 1, (*store)->allocator_name(),
                 GiB(static_cast<int64_t>((*store)->total_bytes())),
                 options.quantize
                     ? absl::StrCat(", quantized to ", WeightQuantizationName(*options.quantize),
                                    " in groups of ", options.quantize->group_size)
                     : std::string(),
                 GiB(static_cast<int64_t>((*store)->max_layer_bytes())));
  }
  return store;
}

absl::StatusOr<std::unique_ptr<WeightStore>> WeightStore::Synthetic(
    const ModelConfig& config, int64_t num_layers, uint64_t seed,
    const WeightStoreOptions& options) {
  if (num_layers < 0 || num_layers > config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic layers: must be in [0, ", config.num_hidden_layers, "], got ", num_layers));
  }
  if (num_layers == 0) num_layers = config.num_hidden_layers;
  const DType dtype = options.dtype.value_or(config.torch_dtype);
  // Uniform on [-a, a) with a = 0.02 * sqrt(3): standard deviation 0.02.
  const float a = 0.02f * std::sqrt(3.0f);
  const FormatFn format = [&](const TensorSpec& t, WeightTensor* wt) {
    QuantizedFormat(options.quantize, dtype, t, wt, config.mxfp4_experts);
  };
  auto store = Build(
      config, num_layers, dtype, options, format, [&](const WeightTensor& wt, std::byte* dst) {
        const int64_t n = Numel(wt.shape);
        const bool norm = IsNormName(wt.name);
        const uint64_t key = SplitMix64(seed ^ HashName(wt.name));
        if (wt.quant == GgmlType::kMXFP4 && !options.quantize) {
          // gpt-oss's MXFP4 experts: random nibbles under scale 2^(120 - 128) (|w| <= 0.047,
          // standard deviation ~0.02, as the float weights), written as blocks directly.
          const int64_t blocks = wt.shape[0] * wt.shape[1] / 32;
          auto* b = reinterpret_cast<uint8_t*>(dst);
#pragma omp parallel for schedule(static) if (blocks > (1 << 14))
          for (int64_t i = 0; i < blocks; ++i) {
            b[i * 17] = 120;
            for (int j = 0; j < 16; j += 8) {
              const uint64_t x = SplitMix64(key + static_cast<uint64_t>(i * 2 + j / 8));
              std::memcpy(b + i * 17 + 1 + j, &x, 8);
            }
          }
          return;
        }
        if (wt.quant) {  // the same values, quantized
          const int64_t cols = wt.shape[1];
          QuantizeRows(
              wt, GroupSize(*options.quantize, wt),
              [&](int64_t r, float* row) {
                for (int64_t j = 0; j < cols; ++j) {
                  const uint64_t x = SplitMix64(key + static_cast<uint64_t>(r * cols + j));
                  row[j] = (static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f) * a;
                }
              },
              dst);
          return;
        }
        constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel if (n > kChunk)
        {
          std::vector<float> buf(kChunk);
#pragma omp for schedule(static)
          for (int64_t i = 0; i < n; i += kChunk) {
            const int64_t m = std::min(kChunk, n - i);
            for (int64_t j = 0; j < m; ++j) {
              if (norm) {
                buf[j] = 1.0f;
              } else {
                const uint64_t x = SplitMix64(key + static_cast<uint64_t>(i + j));
                buf[j] = (static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f) * a;
              }
            }
            ConvertFromF32(wt.dtype, buf.data(), dst + i * DTypeSize(wt.dtype), m);
          }
        }
      });
  if (store.ok()) {
    spdlog::info("weights: synthetic {} ({} of {} layers, seed {}): {} in {} memory",
                 config.architecture, num_layers, config.num_hidden_layers, seed,
                 GiB(static_cast<int64_t>((*store)->total_bytes())), (*store)->allocator_name());
  }
  return store;
}

}  // namespace moebatch
