// Checkpoint: config.json + the tensor store, with every tensor MixtralForCausalLM expects checked
// for presence, shape and dtype (names as transformers 4.x modeling_mixtral.py and the hub's
// per-expert w1/w2/w3 layout).
#include "engine/model/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/family.h"
#include "engine/model/gguf_config.h"
#include "engine/model/gguf_tensors.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_check.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Looks up the tensors the model needs and checks each one's shape and dtype.
class TensorChecker {
 public:
  TensorChecker(const std::string& dir, const TensorStore& store, DType dtype)
      : dir_(dir), store_(store), dtype_(dtype) {}

  // Sets `*out` to tensor `name`, which must have `shape` and the config's dtype (or, with
  // `raw_dtype`, that safetensors dtype: "U8" for MXFP4 blocks and scales).
  absl::Status Get(const std::string& name, std::vector<int64_t> shape, const TensorInfo** out,
                   const char* raw_dtype = nullptr) {
    const TensorInfo* info = store_.Find(name);
    if (info == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("tensor \"", name, "\" is missing from the checkpoint in ", dir_));
    }
    if (info->shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(info->file, ": tensor \"", name, "\": wrong shape: expected ",
                       ShapeString(shape), ", found ", ShapeString(info->shape)));
    }
    if (raw_dtype != nullptr && info->dtype_name != raw_dtype) {
      return absl::InvalidArgumentError(absl::StrCat(info->file, ": tensor \"", name,
                                                     "\": wrong dtype: expected ", raw_dtype,
                                                     ", found ", info->dtype_name));
    }
    if (raw_dtype == nullptr && info->dtype != dtype_) {
      return absl::InvalidArgumentError(absl::StrCat(
          info->file, ": tensor \"", name, "\": wrong dtype: expected ",
          std::string(DTypeName(dtype_)), " (config torch_dtype), found ", info->dtype_name));
    }
    used_.insert(name);
    *out = info;
    return absl::OkStatus();
  }

  // Logs (debug) the tensors no Get asked for, e.g. rotary inv_freq buffers of old checkpoints.
  void LogUnused() const {
    for (const auto& [name, info] : store_.tensors()) {
      if (used_.count(name) == 0) {
        spdlog::debug("{}: ignoring unexpected tensor {}", info->file, name);
      }
    }
  }

 private:
  const std::string& dir_;
  const TensorStore& store_;
  const DType dtype_;
  std::set<std::string> used_;
};

// out [rows, cols] row r = column (start + step * r) of src [cols, src_cols], elements of type T,
// in tiles, parallel: a transpose (start 0, step 1: DBRX's w2), or the rows of an expert slice
// stored as x @ W (gpt-oss) transposed into [out, in], gate and up de-interleaved (step 2).
template <typename T>
void TransposeColumns(const std::byte* src, int64_t src_cols, int64_t start, int64_t step,
                      int64_t rows, int64_t cols, std::byte* dst) {
  const T* in = reinterpret_cast<const T*>(src);
  T* out = reinterpret_cast<T*>(dst);
  constexpr int64_t kTile = 64;
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols > (1 << 20))
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) {
        const T* row = in + c * src_cols + start;
        for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r) out[r * cols + c] = row[r * step];
      }
    }
  }
}

// The part of a fused checkpoint tensor that `t` names (TensorSpec::source), into *parts: a view
// of its rows, or for a transposed part a copy into *copies.
absl::Status GetPart(const TensorSpec& t, TensorChecker& check, std::deque<TensorInfo>* parts,
                     std::vector<std::unique_ptr<std::byte[]>>* copies) {
  const TensorInfo* fused = nullptr;
  if (absl::Status s = check.Get(t.source, t.source_shape, &fused); !s.ok()) return s;
  const int64_t rows = t.transposed ? t.shape[1] : t.shape[0];
  const int64_t cols = t.transposed ? t.shape[0] : (t.shape.size() > 1 ? t.shape[1] : 1);
  if (t.source_shape.size() != 2 || t.source_shape[1] != cols || t.source_row < 0 ||
      t.source_row + rows > t.source_shape[0]) {
    return absl::InternalError(absl::StrCat("tensor \"", t.name, "\": rows [", t.source_row, ", ",
                                            t.source_row + rows, ") of \"", t.source, "\" ",
                                            ShapeString(t.source_shape), " do not fit"));
  }
  const size_t elem = DTypeSize(*fused->dtype);
  TensorInfo& part = parts->emplace_back(*fused);
  part.name = t.name;
  part.shape = t.shape;
  part.nbytes = static_cast<size_t>(rows * cols) * elem;
  part.data = fused->data + static_cast<size_t>(t.source_row * cols) * elem;
  if (t.transposed) {
    auto copy = std::make_unique<std::byte[]>(part.nbytes);
    if (elem == 2) {
      TransposeColumns<uint16_t>(part.data, cols, 0, 1, cols, rows, copy.get());
    } else {
      TransposeColumns<uint32_t>(part.data, cols, 0, 1, cols, rows, copy.get());
    }
    DropMappedPages(part.data, part.nbytes);  // the copy is the tensor from now on
    part.data = copy.get();
    copies->push_back(std::move(copy));
  }
  *t.target = &part;
  return absl::OkStatus();
}

// One expert's slice of a tensor holding every expert (TensorSpec::source_expert: gpt-oss's
// experts.gate_up_proj / down_proj), copied into *copies as [rows, in]: transposed from the
// file's float [in, out], or repacked from MXFP4 blocks and scales (transformers'
// integrations/mxfp4.py convert_moe_packed_tensors: element 2i of a 32-block is the low nibble of
// byte i, 2i + 1 the high one, value FP4_VALUES[nibble] * 2^(scale - 127)) into ggml's block_mxfp4
// {e; qs[16]} (element j < 16 the low nibble of qs[j], j + 16 its high nibble, value
// kvalues_mxfp4[nibble] * 2^(e - 128) with the E2M1 values doubled: the same value, the same e).
absl::Status GetExpertSlice(const TensorSpec& t, TensorChecker& check,
                            std::deque<TensorInfo>* parts,
                            std::vector<std::unique_ptr<std::byte[]>>* copies) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t experts = t.source_shape.size() == 3 ? t.source_shape[0] : 0;
  const int64_t out_total = t.mxfp4 ? t.source_shape[1] : t.source_shape[2];
  const int64_t in = t.mxfp4 ? t.source_shape[2] : t.source_shape[1];
  if (experts < 1 || t.source_expert >= experts || in != cols || t.row_step < 1 ||
      t.row_start + t.row_step * (rows - 1) >= out_total) {
    return absl::InternalError(absl::StrCat("tensor \"", t.name, "\": expert ", t.source_expert,
                                            " rows of \"", t.source, "\" ",
                                            ShapeString(t.source_shape), " do not fit"));
  }
  const int64_t e = t.source_expert;
  if (!t.mxfp4) {
    const TensorInfo* fused = nullptr;
    if (absl::Status s = check.Get(t.source, t.source_shape, &fused); !s.ok()) return s;
    const size_t elem = DTypeSize(*fused->dtype);
    TensorInfo& part = parts->emplace_back(*fused);
    part.name = t.name;
    part.shape = t.shape;
    part.nbytes = static_cast<size_t>(rows * cols) * elem;
    auto copy = std::make_unique<std::byte[]>(part.nbytes);
    const std::byte* slice = fused->data + static_cast<size_t>(e * in * out_total) * elem;
    if (elem == 2) {
      TransposeColumns<uint16_t>(slice, out_total, t.row_start, t.row_step, rows, cols, copy.get());
    } else {
      TransposeColumns<uint32_t>(slice, out_total, t.row_start, t.row_step, rows, cols, copy.get());
    }
    part.data = copy.get();
    copies->push_back(std::move(copy));
    // The expert's rows of the file are not read again (its other slice, gate or up, faults
    // them back in from the page cache): the copy is what stays resident.
    DropMappedPages(slice, static_cast<size_t>(in * out_total) * elem);
    *t.target = &part;
    return absl::OkStatus();
  }
  if (cols % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.source, "_blocks\": ", cols,
                                                   " inputs are not whole MXFP4 blocks of 32"));
  }
  const int64_t nb = cols / 32;
  const TensorInfo *blocks = nullptr, *scales = nullptr;
  if (absl::Status s = check.Get(t.source + "_blocks", {experts, out_total, nb, 16}, &blocks, "U8");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check.Get(t.source + "_scales", {experts, out_total, nb}, &scales, "U8");
      !s.ok()) {
    return s;
  }
  TensorInfo& part = parts->emplace_back(*blocks);
  part.name = t.name;
  part.shape = t.shape;
  part.dtype.reset();
  part.quant = GgmlType::kMXFP4;
  part.dtype_name = "MXFP4";
  part.nbytes = static_cast<size_t>(rows * nb * 17);
  auto copy = std::make_unique<std::byte[]>(part.nbytes);
  const auto* bsrc = reinterpret_cast<const uint8_t*>(blocks->data);
  const auto* ssrc = reinterpret_cast<const uint8_t*>(scales->data);
  auto* dst = reinterpret_cast<uint8_t*>(copy.get());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src_row = e * out_total + t.row_start + t.row_step * r;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* q = bsrc + (src_row * nb + b) * 16;
      uint8_t* o = dst + (r * nb + b) * 17;
      o[0] = ssrc[src_row * nb + b];
      auto nibble = [q](int i) { return (i & 1) ? q[i >> 1] >> 4 : q[i >> 1] & 0x0F; };
      for (int j = 0; j < 16; ++j) {
        o[1 + j] = static_cast<uint8_t>(nibble(j) | (nibble(j + 16) << 4));
      }
    }
  }
  part.data = copy.get();
  copies->push_back(std::move(copy));
  // As for float experts: the repacked copy is what stays resident, not the file's blocks.
  DropMappedPages(blocks->data + static_cast<size_t>(e * out_total * nb * 16),
                  static_cast<size_t>(out_total * nb * 16));
  DropMappedPages(scales->data + static_cast<size_t>(e * out_total * nb),
                  static_cast<size_t>(out_total * nb));
  *t.target = &part;
  return absl::OkStatus();
}

absl::Status LoadWeights(const ModelConfig& c, TensorChecker& check, ModelWeights* w,
                         std::map<std::string, const TensorInfo*>* by_name,
                         std::deque<TensorInfo>* parts,
                         std::vector<std::unique_ptr<std::byte[]>>* copies) {
  for (const std::vector<TensorSpec>& region : ModelTensors(c, c.num_hidden_layers, w)) {
    for (const TensorSpec& t : region) {
      if (t.source_expert >= 0) {
        if (absl::Status s = GetExpertSlice(t, check, parts, copies); !s.ok()) return s;
      } else if (!t.source_shape.empty()) {
        if (absl::Status s = GetPart(t, check, parts, copies); !s.ok()) return s;
      } else if (absl::Status s =
                     check.Get(t.source.empty() ? t.name : t.source, t.shape, t.target);
                 !s.ok()) {
        return s;
      }
      (*by_name)[t.name] = *t.target;
    }
  }
  if (c.tie_word_embeddings) w->lm_head = w->embed_tokens;
  return absl::OkStatus();
}

std::optional<DType> FloatDType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return DType::kF32;
    case GgmlType::kF16:
      return DType::kF16;
    case GgmlType::kBF16:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

}  // namespace

const TensorInfo* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

int64_t Checkpoint::tensor_bytes() const {
  int64_t total = 0;
  for (const auto& [name, t] : tensors_) {
    if (name != "lm_head.weight" || !config_.tie_word_embeddings) total += t->nbytes;
  }
  return total;
}

bool Checkpoint::OwnsData(const TensorInfo& t) const {
  for (const auto& copy : reordered_) {
    if (t.data == copy.get()) return true;
  }
  return false;
}

absl::Status Checkpoint::LoadGguf(Checkpoint* ckpt) {
  auto file = GgufFile::Open(ckpt->dir_);
  if (!file.ok()) return file.status();
  ckpt->gguf_ = *std::move(file);
  const GgufFile& f = *ckpt->gguf_;
  auto config = GgufModelConfig(f);
  if (!config.ok()) return config.status();
  ckpt->config_ = *std::move(config);
  const ModelConfig& c = ckpt->config_;
  std::string supported;
  for (uint32_t i = 0; i < 64; ++i) {
    const auto t = GgmlTypeInfo(i);
    if (t && (FloatDType(t->type) || IsComputedBlockType(t->type))) {
      absl::StrAppend(&supported, supported.empty() ? "" : ", ", t->name);
    }
  }
  for (const std::vector<TensorSpec>& region :
       ModelTensors(c, c.num_hidden_layers, &ckpt->weights_)) {
    for (const TensorSpec& spec : region) {
      auto src = FindGgufSource(f, c, spec);
      if (!src.ok()) return src.status();
      const GgufTensor& t = *src->tensor;
      const std::string what =
          absl::StrCat(f.path(), ": tensor \"", t.name, "\" (for \"", spec.name, "\")");
      const std::optional<DType> dtype = FloatDType(t.type.type);
      if (!dtype && !IsComputedBlockType(t.type.type)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": type ", t.type.name, "; moebatch computes with ", supported));
      }
      if (spec.shape.size() != 2 && !dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": a vector of type ", t.type.name,
                         "; norms and biases must be F32, F16 or BF16"));
      }
      const int64_t row_bytes = GgmlRowBytes(t.type, src->cols);
      TensorInfo& info = ckpt->gguf_infos_.emplace_back();
      info.name = spec.name;
      info.dtype_name = t.type.name;
      info.dtype = dtype;
      if (!dtype) info.quant = t.type.type;
      info.shape = spec.shape;
      info.file = f.path();
      info.nbytes = static_cast<size_t>(src->rows * row_bytes);
      info.data = t.data + (src->expert >= 0 ? src->expert * src->rows * row_bytes : 0);
      if (src->rope_heads > 0) {
        // Rows (or, for a bias, elements) back into the Hugging Face order.
        const int64_t units = spec.shape.size() == 2 ? src->rows : src->cols;
        const int64_t unit_bytes = spec.shape.size() == 2 ? row_bytes : row_bytes / src->cols;
        if (units % (2 * src->rope_heads) != 0) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": ", units,
                                                         " rows do not split into ",
                                                         src->rope_heads, " heads of even size"));
        }
        auto copy = std::make_unique<std::byte[]>(info.nbytes);
        for (int64_t r = 0; r < units; ++r) {
          std::memcpy(copy.get() + r * unit_bytes,
                      info.data + GgufRowOf(r, units, src->rope_heads) * unit_bytes,
                      static_cast<size_t>(unit_bytes));
        }
        info.data = copy.get();
        ckpt->reordered_.push_back(std::move(copy));
      }
      *spec.target = &info;
      ckpt->tensors_[spec.name] = &info;
    }
  }
  if (c.tie_word_embeddings) ckpt->weights_.lm_head = ckpt->weights_.embed_tokens;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Load(const std::string& model_dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = model_dir;
  if (IsGgufFile(model_dir)) {
    if (absl::Status s = LoadGguf(ckpt.get()); !s.ok()) return s;
    if (absl::Status s = CheckSmallTensorsFinite(ckpt->weights_); !s.ok()) return s;
    const ModelConfig& c = ckpt->config_;
    std::map<std::string, int64_t> types;  // tensors per type
    for (const auto& [name, t] : ckpt->tensors_) ++types[t->dtype_name];
    std::string mix;
    for (const auto& [type, n] : types)
      absl::StrAppend(&mix, mix.empty() ? "" : ", ", n, " ", type);
    spdlog::info(
        "loaded {} from {}: {} layers x {} experts (top-{}), hidden {}, {} tensors ({}), {:.1f} "
        "MiB",
        c.architecture, model_dir, c.num_hidden_layers, c.num_local_experts, c.num_experts_per_tok,
        c.hidden_size, ckpt->tensors_.size(), mix, ckpt->tensor_bytes() / double(1 << 20));
    return ckpt;
  }

  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  if (!config.ok()) return config.status();
  ckpt->config_ = *std::move(config);

  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(model_dir);
  if (!store.ok()) return store.status();
  ckpt->store_ = *std::move(store);

  TensorChecker check(model_dir, *ckpt->store_, ckpt->config_.torch_dtype);
  if (absl::Status s = LoadWeights(ckpt->config_, check, &ckpt->weights_, &ckpt->tensors_,
                                   &ckpt->parts_, &ckpt->reordered_);
      !s.ok())
    return s;
  // What is cheap to read whole (norms, routers, the first rows of the embedding and lm_head) must
  // be finite: a NaN there makes every answer garbage (engine/model/weight_check.h).
  if (absl::Status s = CheckSmallTensorsFinite(ckpt->weights_); !s.ok()) return s;
  check.LogUnused();

  const ModelConfig& c = ckpt->config_;
  spdlog::info(
      "loaded {} from {}: {} layers x {} experts (top-{}), hidden {}, {} tensors, {:.1f} MiB {} in "
      "{} file(s)",
      c.architecture, model_dir, c.num_hidden_layers, c.num_local_experts, c.num_experts_per_tok,
      c.hidden_size, ckpt->store_->tensors().size(), ckpt->store_->total_bytes() / double(1 << 20),
      DTypeName(c.torch_dtype), ckpt->store_->num_files());
  return ckpt;
}

}  // namespace moebatch
