// The cpu ops of task B (MoE-Lens §6.4) and the rest: router top-k, expert permutation, row gather,
// SiLU-mul, combine, greedy argmax, residual add and dtype conversions. Semantics:
// cpu_attention/ops/ops.h (and cuda/kernels.h, whose kernels they are the oracle of). Checked by
// tests/cpu_attention/test_ops.cc.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu_attention/ops/ops.h"
#include "cpu_attention/ops/ops_common.h"

namespace moebatch::cpu_ops {

// --- Router top-k --------------------------------------------------------------------------------

absl::Status RouterTopK(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                        int32_t* ids, float* weights, bool renormalize) {
  constexpr const char* kFn = "RouterTopK";
  if (tokens < 0 || experts < 1 || experts > kMaxInt32 || top_k < 1 || top_k > experts) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " experts=", experts, " top_k=", top_k,
                   " (1 <= top_k <= experts)");
  }
  if (tokens == 0) return absl::OkStatus();
  if (logits == nullptr || ids == nullptr || weights == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  std::vector<int64_t> order(experts);
  std::vector<float> probs(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logit = logits + t * experts;
    const float max_logit = *std::max_element(logit, logit + experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < experts; ++e) sum += probs[e] = std::exp(logit[e] - max_logit);
    for (int64_t e = 0; e < experts; ++e) probs[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int64_t a, int64_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    float top_sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) top_sum += probs[order[j]];
    for (int64_t j = 0; j < top_k; ++j) {
      ids[t * top_k + j] = static_cast<int32_t>(order[j]);
      weights[t * top_k + j] = renormalize ? probs[order[j]] / top_sum : probs[order[j]];
    }
  }
  return absl::OkStatus();
}

absl::Status NormalizeTopKWeights(float* weights, int64_t tokens, int64_t top_k, float p) {
  constexpr const char* kFn = "NormalizeTopKWeights";
  if (tokens < 0 || top_k < 1) return Invalid(kFn, "bad sizes tokens=", tokens, " top_k=", top_k);
  if (!(p > 0.0f) || !std::isfinite(p)) return Invalid(kFn, "bad p ", p);
  if (tokens == 0) return absl::OkStatus();
  if (weights == nullptr) return Invalid(kFn, "null pointer");
  for (int64_t t = 0; t < tokens; ++t) {
    float* w = weights + t * top_k;
    float s = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) s += p == 2.0f ? w[j] * w[j] : std::pow(std::fabs(w[j]), p);
    const float norm = p == 2.0f ? std::sqrt(s) : std::pow(s, 1.0f / p);
    for (int64_t j = 0; j < top_k; ++j) w[j] /= norm;
  }
  return absl::OkStatus();
}

// --- Expert permutation --------------------------------------------------------------------------

absl::Status BuildExpertPermutation(const int32_t* ids, int64_t tokens, int64_t top_k,
                                    int64_t experts, int32_t* expert_offsets, int32_t* sorted_token,
                                    int32_t* slot_of) {
  constexpr const char* kFn = "BuildExpertPermutation";
  if (tokens < 0 || top_k < 1 || top_k > kMaxInt32 || experts < 1 || experts > kMaxInt32 ||
      tokens > kMaxInt32 / top_k) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " top_k=", top_k, " experts=", experts,
                   " (experts >= 1, tokens * top_k < 2^31)");
  }
  if (expert_offsets == nullptr) return Invalid(kFn, "null pointer");
  if (tokens > 0 && (ids == nullptr || sorted_token == nullptr || slot_of == nullptr)) {
    return Invalid(kFn, "null pointer");
  }
  const int64_t pairs = tokens * top_k;
  std::fill(expert_offsets, expert_offsets + experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = ids[p];
    if (e >= 0 && e < experts) ++expert_offsets[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) expert_offsets[e + 1] += expert_offsets[e];
  std::vector<int32_t> cursor(expert_offsets, expert_offsets + experts);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= experts) {
      slot_of[p] = -1;
      continue;
    }
    const int32_t slot = cursor[e]++;
    sorted_token[slot] = static_cast<int32_t>(p / top_k);
    slot_of[p] = slot;
  }
  return absl::OkStatus();
}

// --- Row gather ----------------------------------------------------------------------------------

absl::Status GatherRows(const void* src, DType dtype, int64_t src_rows, int64_t n,
                        const int32_t* row_index, int64_t rows, void* dst) {
  constexpr const char* kFn = "GatherRows";
  if (auto st = CheckDType(kFn, "dtype", dtype); !st.ok()) return st;
  if (src_rows < 0 || n < 1 || rows < 0) {
    return Invalid(kFn, "bad sizes src_rows=", src_rows, " n=", n, " rows=", rows);
  }
  if (rows == 0) return absl::OkStatus();
  if (src == nullptr || row_index == nullptr || dst == nullptr) return Invalid(kFn, "null pointer");
  const size_t row_bytes = static_cast<size_t>(n) * DTypeSize(dtype);
  const auto* from = static_cast<const unsigned char*>(src);
  auto* to = static_cast<unsigned char*>(dst);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t s = row_index[r];
    if (s < 0 || s >= src_rows) {
      std::memset(to + r * row_bytes, 0, row_bytes);
    } else {
      std::memcpy(to + r * row_bytes, from + s * row_bytes, row_bytes);
    }
  }
  return absl::OkStatus();
}

// --- SiLU-mul ------------------------------------------------------------------------------------

namespace {

// out may alias gate or up (O = I): element i is read before it is written.
template <typename I, typename O>
void SiluMulElements(const typename I::Storage* gate, const typename I::Storage* up, int64_t n,
                     typename O::Storage* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = I::Load(gate[i]);
    out[i] = O::Store(g / (1.0f + std::exp(-g)) * I::Load(up[i]));  // silu(w1 x) * (w3 x)
  }
}

}  // namespace

absl::Status SiluMul(const void* gate, const void* up, DType in_dtype, int64_t rows, int64_t inter,
                     void* out, DType out_dtype) {
  constexpr const char* kFn = "SiluMul";
  if (auto st = CheckDType(kFn, "in_dtype", in_dtype); !st.ok()) return st;
  if (auto st = CheckDType(kFn, "out_dtype", out_dtype); !st.ok()) return st;
  if (rows < 0 || inter < 1 || rows > std::numeric_limits<int64_t>::max() / inter) {
    return Invalid(kFn, "bad sizes rows=", rows, " inter=", inter);
  }
  if (rows == 0) return absl::OkStatus();
  if (gate == nullptr || up == nullptr || out == nullptr) return Invalid(kFn, "null pointer");
  if (out_dtype != in_dtype && (out == gate || out == up)) {
    return Invalid(kFn, "in-place only with out_dtype == in_dtype");
  }
  Dispatch(in_dtype, [&](auto i) {
    using I = decltype(i);
    Dispatch(out_dtype, [&](auto o) {
      using O = decltype(o);
      SiluMulElements<I, O>(static_cast<const typename I::Storage*>(gate),
                            static_cast<const typename I::Storage*>(up), rows * inter,
                            static_cast<typename O::Storage*>(out));
    });
  });
  return absl::OkStatus();
}

absl::Status ClampedSwiglu(const float* gate, const float* up, int64_t rows, int64_t inter,
                           float limit, float* out) {
  constexpr const char* kFn = "ClampedSwiglu";
  if (rows < 0 || inter < 1 || rows > std::numeric_limits<int64_t>::max() / inter) {
    return Invalid(kFn, "bad sizes rows=", rows, " inter=", inter);
  }
  if (!(limit > 0.0f) || !std::isfinite(limit)) return Invalid(kFn, "bad limit ", limit);
  if (rows == 0) return absl::OkStatus();
  if (gate == nullptr || up == nullptr || out == nullptr) return Invalid(kFn, "null pointer");
  constexpr float kAlpha = 1.702f;  // GptOssExperts.alpha
  const int64_t n = rows * inter;
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);  // gate.clamp(min=None, max=limit)
    const float u = std::min(std::max(up[i], -limit), limit);
    const float glu = g * (1.0f / (1.0f + std::exp(-(g * kAlpha))));
    out[i] = (u + 1.0f) * glu;
  }
  return absl::OkStatus();
}

// --- Combine -------------------------------------------------------------------------------------

absl::Status CombineExperts(const float* expert_out, const int32_t* slot_of, const int32_t* ids,
                            const float* weights, int64_t tokens, int64_t top_k, int64_t hidden,
                            float* h, const float* shared) {
  constexpr const char* kFn = "CombineExperts";
  if (tokens < 0 || top_k < 1 || top_k > kMaxInt32 || hidden < 1 || tokens > kMaxInt32 / top_k) {
    return Invalid(kFn, "bad sizes tokens=", tokens, " top_k=", top_k, " hidden=", hidden,
                   " (top_k >= 1, tokens * top_k < 2^31)");
  }
  if (tokens == 0) return absl::OkStatus();
  if (expert_out == nullptr || slot_of == nullptr || ids == nullptr || weights == nullptr ||
      h == nullptr) {
    return Invalid(kFn, "null pointer");
  }
  const int64_t num_slots = tokens * top_k;
  std::vector<int64_t> choice(top_k);
  std::vector<float> moe(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* slot = slot_of + t * top_k;
    const int32_t* id = ids + t * top_k;
    const float* weight = weights + t * top_k;
    // The token's valid choices in increasing expert id order (stable: equal ids keep their order).
    int64_t m = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      if (slot[j] >= 0 && slot[j] < num_slots) choice[m++] = j;
    }
    std::stable_sort(choice.begin(), choice.begin() + m,
                     [&](int64_t a, int64_t b) { return id[a] < id[b]; });
    std::fill(moe.begin(), moe.end(), 0.0f);
    for (int64_t c = 0; c < m; ++c) {
      const float* src = expert_out + slot[choice[c]] * hidden;
      const float w = weight[choice[c]];
      for (int64_t i = 0; i < hidden; ++i) moe[i] += src[i] * w;
    }
    if (shared != nullptr) {
      const float* add = shared + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) moe[i] += add[i];
    }
    float* dst = h + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) dst[i] += moe[i];
  }
  return absl::OkStatus();
}

// --- Argmax --------------------------------------------------------------------------------------

absl::Status ArgmaxRows(const float* x, int64_t rows, int64_t n, int32_t* ids) {
  constexpr const char* kFn = "ArgmaxRows";
  if (rows < 0 || n < 1 || n > kMaxInt32) return Invalid(kFn, "bad sizes rows=", rows, " n=", n);
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || ids == nullptr) return Invalid(kFn, "null pointer");
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    const bool finite = std::all_of(row, row + n, [](float v) { return std::isfinite(v); });
    ids[r] = finite ? static_cast<int32_t>(std::max_element(row, row + n) - row) : -1;
  }
  return absl::OkStatus();
}

// --- Elementwise ---------------------------------------------------------------------------------

absl::Status AddBias(float* x, int64_t rows, int64_t n, const float* bias) {
  constexpr const char* kFn = "AddBias";
  if (rows < 0 || n < 1) return Invalid(kFn, "bad sizes rows=", rows, " n=", n);
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || bias == nullptr) return Invalid(kFn, "null pointer");
#pragma omp parallel for schedule(static) if (rows * n > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    for (int64_t i = 0; i < n; ++i) row[i] += bias[i];
  }
  return absl::OkStatus();
}

absl::Status ClampAbs(float* x, int64_t n, float limit) {
  constexpr const char* kFn = "ClampAbs";
  if (n < 0 || !(limit > 0)) return Invalid(kFn, "bad arguments n=", n, " limit=", limit);
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) return Invalid(kFn, "null pointer");
  for (int64_t i = 0; i < n; ++i) x[i] = std::min(std::max(x[i], -limit), limit);
  return absl::OkStatus();
}

absl::Status ScaleBySigmoid(float* x, int64_t tokens, int64_t n, const float* gate_logit) {
  constexpr const char* kFn = "ScaleBySigmoid";
  if (tokens < 0 || n < 1) return Invalid(kFn, "bad sizes tokens=", tokens, " n=", n);
  if (tokens == 0) return absl::OkStatus();
  if (x == nullptr || gate_logit == nullptr) return Invalid(kFn, "null pointer");
  for (int64_t t = 0; t < tokens; ++t) {
    const float g = 1.0f / (1.0f + std::exp(-gate_logit[t]));
    float* row = x + t * n;
    for (int64_t i = 0; i < n; ++i) row[i] = g * row[i];
  }
  return absl::OkStatus();
}

absl::Status AddResidual(float* h, const float* x, int64_t n) {
  constexpr const char* kFn = "AddResidual";
  if (n < 0) return Invalid(kFn, "bad size n=", n);
  if (n == 0) return absl::OkStatus();
  if (h == nullptr || x == nullptr) return Invalid(kFn, "null pointer");
  for (int64_t i = 0; i < n; ++i) h[i] += x[i];
  return absl::OkStatus();
}

absl::Status ConvertF32To(const float* src, int64_t n, void* dst, DType dst_dtype) {
  constexpr const char* kFn = "ConvertF32To";
  if (auto st = CheckDType(kFn, "dst_dtype", dst_dtype); !st.ok()) return st;
  if (n < 0) return Invalid(kFn, "bad size n=", n);
  if (n == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) return Invalid(kFn, "null pointer");
  ::moebatch::ConvertFromF32(dst_dtype, src, dst, static_cast<size_t>(n));
  return absl::OkStatus();
}

absl::Status ConvertToF32(const void* src, DType src_dtype, int64_t n, float* dst) {
  constexpr const char* kFn = "ConvertToF32";
  if (auto st = CheckDType(kFn, "src_dtype", src_dtype); !st.ok()) return st;
  if (n < 0) return Invalid(kFn, "bad size n=", n);
  if (n == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) return Invalid(kFn, "null pointer");
  ::moebatch::ConvertToF32(src_dtype, src, dst, static_cast<size_t>(n));
  return absl::OkStatus();
}

}  // namespace moebatch::cpu_ops
