#include "cpu_attention/backend/cpu_device.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moebatch {
namespace {

std::vector<float> ToF32(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  ConvertToF32(*t.dtype, t.data, out.data(), out.size());
  return out;
}

// MixtralRMSNorm: x * rsqrt(mean(x^2) + eps) * weight, rows of width n, in fp32.
void RmsNorm(const float* in, const float* weight, int64_t rows, int64_t n, double eps,
             float* out) {
#pragma omp parallel for schedule(static) if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * n;
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + static_cast<float>(eps));
    float* y = out + r * n;
    for (int64_t i = 0; i < n; ++i) y[i] = weight[i] * (x[i] * inv);
  }
}

// apply_rotary_pos_emb with rotate_half: for i < d/2, with c = cos(p * inv_freq[i]), s = sin(..):
//   y[i] = x[i] c - x[i + d/2] s,   y[i + d/2] = x[i + d/2] c + x[i] s.
void ApplyRope(float* x, int64_t heads, int64_t d, const float* cos_row, const float* sin_row) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos_row[i] - b * sin_row[i];
      v[i + half] = b * cos_row[i] + a * sin_row[i];
    }
  }
}

}  // namespace

CpuDevice::CpuDevice(const ModelConfig& config, const ModelWeights& weights,
                     std::unique_ptr<Matmul> matmul)
    : config_(config), weights_(weights), matmul_(std::move(matmul)) {}
CpuDevice::~CpuDevice() = default;

absl::StatusOr<std::unique_ptr<CpuDevice>> CpuDevice::Create(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const CpuDeviceOptions& options) {
  if (static_cast<int64_t>(weights.layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights hold ", weights.layers.size(), " layers, config has ", config.num_hidden_layers));
  }
  auto matmul = Matmul::Create(options.compute_dtype, options.widened_weight_budget_bytes,
                               options.batch_invariant);
  if (!matmul.ok()) return matmul.status();
  std::unique_ptr<CpuDevice> device(new CpuDevice(config, weights, *std::move(matmul)));
  for (const LayerWeights& layer : weights.layers) {
    device->input_norm_.push_back(ToF32(*layer.input_layernorm));
    device->post_norm_.push_back(ToF32(*layer.post_attention_layernorm));
  }
  device->final_norm_ = ToF32(*weights.norm);
  // MixtralRotaryEmbedding (default rope type): inv_freq = 1 / theta^(2i/d), computed in fp32.
  const int64_t d = config.head_dim;
  device->inv_freq_.resize(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
    device->inv_freq_[i] = 1.0f / std::pow(static_cast<float>(config.rope_theta), exponent);
  }
  return device;
}

absl::StatusOr<CpuDevice::MicroBatch*> CpuDevice::Get(int micro_batch, int64_t layer) {
  if (micro_batch < 0 || micro_batch >= kMaxMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch ", micro_batch, " outside [0, ", kMaxMicroBatches, ")"));
  }
  if (layer < 0 || layer >= config_.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " outside [0, ", config_.num_hidden_layers, ")"));
  }
  return &micro_batches_[micro_batch];
}

absl::Status CpuDevice::Linear(const float* x, int64_t rows, const TensorInfo& w, float* y) {
  return matmul_->Linear(x, rows, w.shape[1], w.data, *w.dtype, w.shape[0], y);
}

absl::Status CpuDevice::Linear(const std::vector<float>& x, int64_t rows, const TensorInfo& w,
                               std::vector<float>* y) {
  const int64_t n = w.shape[0];
  if (y->size() < static_cast<size_t>(rows * n)) y->resize(static_cast<size_t>(rows * n));
  return Linear(x.data(), rows, w, y->data());
}

absl::Status CpuDevice::Embed(int micro_batch, const int32_t* token_ids, const int64_t* positions,
                              int64_t tokens) {
  auto got = Get(micro_batch, 0);
  if (!got.ok()) return got.status();
  MicroBatch& mb = **got;
  const int64_t hidden = config_.hidden_size;
  const TensorInfo& table = *weights_.embed_tokens;
  for (int64_t t = 0; t < tokens; ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", token_ids[t], " outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  mb.tokens = tokens;
  mb.positions.assign(positions, positions + tokens);
  mb.h.resize(static_cast<size_t>(tokens * hidden));
  const size_t row_bytes = hidden * DTypeSize(*table.dtype);
#pragma omp parallel for schedule(static) if (tokens > 16)
  for (int64_t t = 0; t < tokens; ++t) {
    ConvertToF32(*table.dtype, table.data + token_ids[t] * row_bytes, mb.h.data() + t * hidden,
                 hidden);
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::TaskA(int micro_batch, int64_t layer, float* q, float* k, float* v,
                              float* /*attn: no prefill segments here (AttendsPrefill false)*/) {
  auto got = Get(micro_batch, layer);
  if (!got.ok()) return got.status();
  MicroBatch& mb = **got;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  const int64_t tokens = mb.tokens;
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;

  x_.resize(static_cast<size_t>(tokens * hidden));
  RmsNorm(mb.h.data(), input_norm_[layer].data(), tokens, hidden, c.rms_norm_eps, x_.data());
  if (auto st = Linear(x_.data(), tokens, *lw.q_proj, q); !st.ok()) return st;
  if (auto st = Linear(x_.data(), tokens, *lw.k_proj, k); !st.ok()) return st;
  if (auto st = Linear(x_.data(), tokens, *lw.v_proj, v); !st.ok()) return st;

  // RoPE on q and k at each token's position.
  const int64_t half = d / 2;
#pragma omp parallel
  {
    std::vector<float> cos_row(half), sin_row(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const float pos = static_cast<float>(mb.positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float freq = pos * inv_freq_[i];
        cos_row[i] = std::cos(freq);
        sin_row[i] = std::sin(freq);
      }
      ApplyRope(q + t * heads * d, heads, d, cos_row.data(), sin_row.data());
      ApplyRope(k + t * kv_heads * d, kv_heads, d, cos_row.data(), sin_row.data());
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::TaskB(int micro_batch, int64_t layer, const float* attn,
                              ForwardStats* stats) {
  auto got = Get(micro_batch, layer);
  if (!got.ok()) return got.status();
  MicroBatch& mb = **got;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  const int64_t tokens = mb.tokens;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t num_experts = c.num_local_experts, top_k = c.num_experts_per_tok;

  proj_.resize(static_cast<size_t>(tokens * hidden));
  if (auto st = Linear(attn, tokens, *lw.o_proj, proj_.data()); !st.ok()) return st;
  for (int64_t i = 0; i < tokens * hidden; ++i) mb.h[i] += proj_[i];

  x_.resize(static_cast<size_t>(tokens * hidden));
  RmsNorm(mb.h.data(), post_norm_[layer].data(), tokens, hidden, c.rms_norm_eps, x_.data());
  if (auto st = Linear(x_, tokens, *lw.router, &router_); !st.ok()) return st;

  // Router: softmax over experts in fp32, top-k (ties to the lower expert id), renormalise.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(num_experts);  // (token, weight)
  std::vector<int64_t> order(num_experts);
  std::vector<float> probs(num_experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logit = router_.data() + t * num_experts;
    const float max_logit = *std::max_element(logit, logit + num_experts);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) sum += probs[e] = std::exp(logit[e] - max_logit);
    for (int64_t e = 0; e < num_experts; ++e) probs[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int64_t a, int64_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    float top_sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) top_sum += probs[order[j]];
    for (int64_t j = 0; j < top_k; ++j) {
      routed[order[j]].emplace_back(t, probs[order[j]] / top_sum);
    }
  }

  // Experts in id order, each over the tokens routed to it (MixtralSparseMoeBlock's index_add_).
  moe_out_.assign(static_cast<size_t>(tokens * hidden), 0.0f);
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto& list = routed[e];
    const int64_t n = static_cast<int64_t>(list.size());
    if (n == 0) continue;
    if (stats != nullptr) {
      stats->expert_token_pairs += n;
      stats->experts_touched += 1;
    }
    expert_in_.resize(static_cast<size_t>(n * hidden));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(x_.data() + list[i].first * hidden, hidden, expert_in_.data() + i * hidden);
    }
    const ExpertWeights& ew = lw.experts[e];
    if (auto st = Linear(expert_in_, n, *ew.w1, &gate_); !st.ok()) return st;
    if (auto st = Linear(expert_in_, n, *ew.w3, &up_); !st.ok()) return st;
    for (int64_t i = 0; i < n * inter; ++i) {
      const float g = gate_[i];
      gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];  // silu(w1 x) * (w3 x)
    }
    if (auto st = Linear(gate_, n, *ew.w2, &expert_out_); !st.ok()) return st;
    for (int64_t i = 0; i < n; ++i) {
      float* dst = moe_out_.data() + list[i].first * hidden;
      const float* src = expert_out_.data() + i * hidden;
      const float weight = list[i].second;
      for (int64_t j = 0; j < hidden; ++j) dst[j] += src[j] * weight;
    }
  }
  for (int64_t i = 0; i < tokens * hidden; ++i) mb.h[i] += moe_out_[i];
  return absl::OkStatus();
}

absl::Status CpuDevice::Logits(int micro_batch, const int64_t* rows, int64_t n, float* logits) {
  auto got = Get(micro_batch, 0);
  if (!got.ok()) return got.status();
  MicroBatch& mb = **got;
  const int64_t hidden = config_.hidden_size;
  x_.resize(static_cast<size_t>(std::max<int64_t>(n, 1) * hidden));
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= mb.tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logits row ", rows[i], " outside the micro-batch's ", mb.tokens, " tokens"));
    }
    RmsNorm(mb.h.data() + rows[i] * hidden, final_norm_.data(), 1, hidden, config_.rms_norm_eps,
            x_.data() + i * hidden);
  }
  return matmul_->Linear(x_.data(), n, hidden, weights_.lm_head->data, *weights_.lm_head->dtype,
                         config_.vocab_size, logits);
}

}  // namespace moebatch
