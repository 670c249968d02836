// The cpu ops of task A (MoE-Lens §6.4) and the embedding: embedding gather, RMSNorm, RoPE, prefill
// attention. Semantics: cpu_attention/ops/ops.h (and cuda/kernels.h, whose kernels they are the
// oracle of). Checked by tests/cpu_attention/test_ops.cc.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_attention/attention/paged_attention.h"
#include "cpu_attention/ops/ops.h"
#include "cpu_attention/ops/ops_common.h"

namespace moebatch::cpu_ops {

// --- Embedding -----------------------------------------------------------------------------------

absl::Status EmbeddingGather(const void* table, DType table_dtype, int64_t vocab, int64_t hidden,
                             const int32_t* token_ids, int64_t tokens, float* h) {
  constexpr const char* kFn = "EmbeddingGather";
  if (auto st = CheckDType(kFn, "table_dtype", table_dtype); !st.ok()) return st;
  if (vocab < 1 || hidden < 1 || tokens < 0) {
    return Invalid(kFn, "bad sizes vocab=", vocab, " hidden=", hidden, " tokens=", tokens);
  }
  if (tokens == 0) return absl::OkStatus();
  if (table == nullptr || token_ids == nullptr || h == nullptr) return Invalid(kFn, "null pointer");
  const auto* rows = static_cast<const unsigned char*>(table);
  const size_t row_bytes = static_cast<size_t>(hidden) * DTypeSize(table_dtype);
#pragma omp parallel for schedule(static) if (tokens > 16)
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t id = token_ids[t];
    float* dst = h + t * hidden;
    if (id < 0 || id >= vocab) {
      std::fill(dst, dst + hidden, 0.0f);
    } else {
      ::moebatch::ConvertToF32(table_dtype, rows + id * row_bytes, dst,
                               static_cast<size_t>(hidden));
    }
  }
  return absl::OkStatus();
}

// --- RMSNorm and LayerNorm (no bias) -------------------------------------------------------------

namespace {

// RMSNorm, or with kCentered LayerNorm without bias. out may alias in (O = F32): a row's sums are
// taken before any of its outputs is written, and y[i] reads x[i] only.
template <typename W, typename O, bool kCentered>
void NormRows(const float* in, const typename W::Storage* weight, int64_t rows, int64_t n,
              float eps, typename O::Storage* out) {
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * n;
    float mean = 0.0f;
    if constexpr (kCentered) {
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) sum += x[i];
      mean = sum / static_cast<float>(n);
    }
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (kCentered) {
        sum_sq += (x[i] - mean) * (x[i] - mean);
      } else {
        sum_sq += x[i] * x[i];
      }
    }
    const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
    typename O::Storage* y = out + r * n;
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (kCentered) {
        y[i] = O::Store(W::Load(weight[i]) * ((x[i] - mean) * inv));
      } else {
        y[i] = O::Store(W::Load(weight[i]) * (x[i] * inv));
      }
    }
  }
}

template <bool kCentered>
absl::Status Norm(const char* kFn, const float* in, const void* weight, DType weight_dtype,
                  int64_t rows, int64_t n, float eps, void* out, DType out_dtype) {
  if (auto st = CheckDType(kFn, "weight_dtype", weight_dtype); !st.ok()) return st;
  if (auto st = CheckDType(kFn, "out_dtype", out_dtype); !st.ok()) return st;
  if (rows < 0 || n < 1) return Invalid(kFn, "bad sizes rows=", rows, " n=", n);
  if (!(eps >= 0.0f) || !std::isfinite(eps)) return Invalid(kFn, "bad eps ", eps);
  if (rows == 0) return absl::OkStatus();
  if (in == nullptr || weight == nullptr || out == nullptr) return Invalid(kFn, "null pointer");
  if (out_dtype != DType::kF32 && out == static_cast<const void*>(in)) {
    return Invalid(kFn, "in-place only with out_dtype f32");
  }
  Dispatch(weight_dtype, [&](auto w) {
    using W = decltype(w);
    Dispatch(out_dtype, [&](auto o) {
      using O = decltype(o);
      NormRows<W, O, kCentered>(in, static_cast<const typename W::Storage*>(weight), rows, n, eps,
                                static_cast<typename O::Storage*>(out));
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status RmsNorm(const float* in, const void* weight, DType weight_dtype, int64_t rows,
                     int64_t n, float eps, void* out, DType out_dtype) {
  return Norm<false>("RmsNorm", in, weight, weight_dtype, rows, n, eps, out, out_dtype);
}

absl::Status LayerNorm(const float* in, const void* weight, DType weight_dtype, int64_t rows,
                       int64_t n, float eps, void* out, DType out_dtype) {
  return Norm<true>("LayerNorm", in, weight, weight_dtype, rows, n, eps, out, out_dtype);
}

// --- RoPE ----------------------------------------------------------------------------------------

absl::Status ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t d, const int64_t* positions,
                       const float* inv_freq, float attention_scaling) {
  constexpr const char* kFn = "ApplyRope";
  if (tokens < 0 || heads < 1 || d < 2 || d % 2 != 0) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " heads=", heads, " d=", d,
                   " (d even, d >= 2)");
  }
  if (tokens == 0) return absl::OkStatus();
  if (x == nullptr || positions == nullptr || inv_freq == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  const int64_t half = d / 2;
#pragma omp parallel
  {
    std::vector<float> cos_row(half), sin_row(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float freq = pos * inv_freq[i];
        cos_row[i] = std::cos(freq) * attention_scaling;
        sin_row[i] = std::sin(freq) * attention_scaling;
      }
      float* row = x + t * heads * d;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = row + h * d;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cos_row[i] - b * sin_row[i];
          v[i + half] = b * cos_row[i] + a * sin_row[i];
        }
      }
    }
  }
  return absl::OkStatus();
}

// --- Prefill attention ---------------------------------------------------------------------------

namespace {

// One query row and head over the keys [first, last] (rows of k/v, `stride` floats apart):
// PagedAttentionReference's AttendOne on contiguous f32 rows.
void AttendOne(const float* q, const float* k, const float* v, int64_t stride, int64_t first,
               int64_t last, int64_t d, float scale, const float* sink, float* out, float* acc) {
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  std::fill(acc, acc + d, 0.0f);
  for (int64_t j = first; j <= last; ++j) {
    const float* key = k + j * stride;
    const float* value = v + j * stride;
    float s = 0.0f;
    for (int64_t i = 0; i < d; ++i) s += q[i] * key[i];
    s *= scale;
    if (s > running_max) {
      const float correction = std::exp(running_max - s);  // 0 on the first key
      running_sum *= correction;
      for (int64_t i = 0; i < d; ++i) acc[i] *= correction;
      running_max = s;
    }
    const float p = std::exp(s - running_max);
    running_sum += p;
    for (int64_t i = 0; i < d; ++i) acc[i] += p * value[i];
  }
  const float inv = SoftmaxNormalizer(running_max, running_sum, sink);
  for (int64_t i = 0; i < d; ++i) out[i] = acc[i] * inv;
}

}  // namespace

absl::Status PrefillAttention(const float* q, const float* k, const float* v,
                              const int32_t* cu_seqlens, int64_t num_seqs, int64_t tokens,
                              int64_t heads, int64_t kv_heads, int64_t d, float scale,
                              int64_t sliding_window, float* out, const float* sinks) {
  constexpr const char* kFn = "PrefillAttention";
  if (tokens < 0 || num_seqs < 0 || num_seqs >= kMaxInt32 || heads < 1 || kv_heads < 1 ||
      heads % kv_heads != 0 || d < 1 || sliding_window < 0) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " num_seqs=", num_seqs, " heads=", heads,
                   " kv_heads=", kv_heads, " d=", d, " sliding_window=", sliding_window,
                   " (heads a multiple of kv_heads, d >= 1)");
  }
  if (!std::isfinite(scale)) return Invalid(kFn, "bad scale ", scale);
  if (tokens == 0 || num_seqs == 0) return absl::OkStatus();
  if (q == nullptr || k == nullptr || v == nullptr || cu_seqlens == nullptr || out == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  if (cu_seqlens[0] < 0 || cu_seqlens[num_seqs] > tokens) {
    return Invalid(kFn, "cu_seqlens spans [", cu_seqlens[0], ", ", cu_seqlens[num_seqs],
                   "), outside the ", tokens, " tokens");
  }
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (cu_seqlens[s + 1] < cu_seqlens[s]) {
      return Invalid(kFn, "cu_seqlens decreases at sequence ", s);
    }
  }
  // Work items: (row, head) over the rows inside a sequence, in row order.
  const int64_t first_row = cu_seqlens[0], rows = cu_seqlens[num_seqs] - first_row;
  const int64_t group = heads / kv_heads;
  const int64_t stride = kv_heads * d;
  const int64_t work = rows * heads;
#pragma omp parallel
  {
    std::vector<float> acc(d);
    int64_t seq = 0;  // the sequence of this thread's last row (rows come in increasing order)
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t row = first_row + w / heads, head = w % heads;
      if (row < cu_seqlens[seq]) seq = 0;
      while (cu_seqlens[seq + 1] <= row) ++seq;
      const int64_t start = cu_seqlens[seq];
      const int64_t pos = row - start;
      const int64_t first =
          start + (sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0);
      const int64_t kv_head = head / group;
      AttendOne(q + (row * heads + head) * d, k + kv_head * d, v + kv_head * d, stride, first, row,
                d, scale, sinks != nullptr ? sinks + head : nullptr, out + (row * heads + head) * d,
                acc.data());
    }
  }
  return absl::OkStatus();
}

}  // namespace moebatch::cpu_ops
