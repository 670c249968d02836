#include "engine/model/weight_check.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/dtype.h"
#include "engine/model/ggml_quants.h"

namespace moebatch {
namespace {

// Index of the first non-finite element of data[0, n) in `dtype`, or -1.
int64_t FirstNonFinite(const std::byte* data, DType dtype, int64_t n) {
  // Chunks converted to f32 (exact for bf16/f16: their infinities and NaNs stay so).
  constexpr int64_t kChunk = 4096;
  float buffer[kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t count = std::min(kChunk, n - start);
    ConvertToF32(dtype, data + start * DTypeSize(dtype), buffer, static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(buffer[i])) return start + i;
    }
  }
  return -1;
}

// A quantized tensor (TensorInfo::quant): the index of the first non-finite element among its
// first `n` elements (whole rows decoded), with its value in *value; -1 when none.
int64_t FirstNonFiniteQuantized(const TensorInfo& t, int64_t n, float* value) {
  const GgmlTypeTraits type = GgmlTypeInfoOf(*t.quant);
  const int64_t cols = t.shape.back();
  const int64_t row_bytes = GgmlRowBytes(type, cols);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r * cols < n; ++r) {
    if (!DequantizeRow(*t.quant, t.data + r * row_bytes, cols, row.data()).ok()) {
      *value = std::numeric_limits<float>::quiet_NaN();
      return r * cols;
    }
    for (int64_t i = 0; i < cols; ++i) {
      if (!std::isfinite(row[i])) {
        *value = row[i];
        return r * cols + i;
      }
    }
  }
  return -1;
}

absl::Status NonFinite(const TensorInfo& t, int64_t index, float value) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", t.name, " (", t.file, "): element ", index, " is ",
                   std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf"),
                   "; the checkpoint holds non-finite weights (a damaged or mis-converted file)"));
}

absl::Status NonFinite(const TensorInfo& t, int64_t index) {
  float value = 0;
  ConvertToF32(*t.dtype, t.data + index * DTypeSize(*t.dtype), &value, 1);
  return NonFinite(t, index, value);
}

}  // namespace

absl::Status CheckTensorFinite(const TensorInfo& t, int64_t max_elements) {
  const int64_t n = max_elements > 0 ? std::min(max_elements, t.numel()) : t.numel();
  if (t.quant.has_value() && !t.shape.empty()) {
    float value = 0;
    const int64_t bad = FirstNonFiniteQuantized(t, n, &value);
    return bad < 0 ? absl::OkStatus() : NonFinite(t, bad, value);
  }
  if (!t.dtype.has_value()) return absl::OkStatus();
  const int64_t bad = FirstNonFinite(t.data, *t.dtype, n);
  return bad < 0 ? absl::OkStatus() : NonFinite(t, bad);
}

absl::Status CheckSmallTensorsFinite(const ModelWeights& w) {
  std::vector<const TensorInfo*> whole = {w.norm};
  for (const LayerWeights& layer : w.layers) {
    whole.push_back(layer.input_layernorm);
    whole.push_back(layer.post_attention_layernorm);
    whole.push_back(layer.router);
    whole.push_back(layer.router_bias);     // DeepSeek-V3 (null otherwise)
    whole.push_back(layer.q_a_layernorm);   // MLA (null otherwise)
    whole.push_back(layer.kv_a_layernorm);  // MLA (null otherwise)
  }
  for (const TensorInfo* t : whole) {
    if (t == nullptr) continue;
    if (absl::Status st = CheckTensorFinite(*t); !st.ok()) return st;
  }
  for (const TensorInfo* t : {w.embed_tokens, w.lm_head}) {
    if (t == nullptr || t->shape.size() != 2) continue;
    if (absl::Status st = CheckTensorFinite(*t, kSampleRows * t->shape[1]); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status CheckAllTensorsFinite(const ModelWeights& w) {
  std::vector<const TensorInfo*> all = {w.embed_tokens, w.norm, w.lm_head};
  for (const LayerWeights& layer : w.layers) {
    for (const TensorInfo* t : {layer.input_layernorm, layer.q_proj, layer.k_proj, layer.v_proj,
                                layer.o_proj, layer.post_attention_layernorm, layer.router}) {
      all.push_back(t);
    }
    for (const TensorInfo* t : {layer.q_a_proj, layer.q_b_proj, layer.kv_a_proj, layer.kv_b_proj,
                                layer.q_a_layernorm, layer.kv_a_layernorm, layer.router_bias}) {
      all.push_back(t);  // MLA's and DeepSeek-V3's router bias (null otherwise)
    }
    for (const ExpertWeights& e : layer.experts) {
      all.push_back(e.w1);
      all.push_back(e.w2);
      all.push_back(e.w3);
    }
  }
  // Every tensor in slices of 1 Mi elements over the threads; the first bad one in tensor order is
  // reported (the smallest (tensor, element) found).
  struct Slice {
    size_t tensor;
    int64_t start, count;
  };
  std::vector<Slice> slices;
  constexpr int64_t kSlice = int64_t{1} << 20;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == nullptr || !all[i]->dtype.has_value()) continue;
    for (int64_t s = 0; s < all[i]->numel(); s += kSlice) {
      slices.push_back({i, s, std::min(kSlice, all[i]->numel() - s)});
    }
  }
  std::atomic<int64_t> first_bad_slice{std::numeric_limits<int64_t>::max()};
  std::vector<int64_t> bad_index(slices.size(), -1);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < static_cast<int64_t>(slices.size()); ++k) {
    if (k > first_bad_slice.load(std::memory_order_relaxed)) continue;
    const Slice& s = slices[k];
    const TensorInfo& t = *all[s.tensor];
    const int64_t bad = FirstNonFinite(t.data + s.start * DTypeSize(*t.dtype), *t.dtype, s.count);
    if (bad >= 0) {
      bad_index[k] = s.start + bad;
      int64_t seen = first_bad_slice.load();
      while (k < seen && !first_bad_slice.compare_exchange_weak(seen, k)) {
      }
    }
  }
  const int64_t k = first_bad_slice.load();
  if (k != std::numeric_limits<int64_t>::max())
    return NonFinite(*all[slices[k].tensor], bad_index[k]);
  // Quantized tensors (a GGUF checkpoint's): decoded row by row, one tensor per thread.
  std::vector<const TensorInfo*> quantized;
  for (const TensorInfo* t : all) {
    if (t != nullptr && t->quant.has_value()) quantized.push_back(t);
  }
  std::vector<absl::Status> status(quantized.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < static_cast<int64_t>(quantized.size()); ++i) {
    status[i] = CheckTensorFinite(*quantized[i]);
  }
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace moebatch
