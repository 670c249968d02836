#include "engine/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cpu_attention/decode_attention.h"
#include "cpu_attention/kv_append.h"

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

CpuModel::CpuModel(const Checkpoint& checkpoint, std::unique_ptr<Matmul> matmul)
    : checkpoint_(checkpoint), matmul_(std::move(matmul)) {}
CpuModel::~CpuModel() = default;

absl::StatusOr<std::unique_ptr<CpuModel>> CpuModel::Create(const Checkpoint& checkpoint,
                                                           const CpuModelOptions& options) {
  auto matmul = Matmul::Create(options.compute_dtype, options.widened_weight_budget_bytes);
  if (!matmul.ok()) return matmul.status();
  std::unique_ptr<CpuModel> model(new CpuModel(checkpoint, *std::move(matmul)));
  const ModelConfig& c = checkpoint.config();
  const ModelWeights& w = checkpoint.weights();
  for (const LayerWeights& layer : w.layers) {
    model->input_norm_.push_back(ToF32(*layer.input_layernorm));
    model->post_norm_.push_back(ToF32(*layer.post_attention_layernorm));
  }
  model->final_norm_ = ToF32(*w.norm);
  // MixtralRotaryEmbedding (default rope type): inv_freq = 1 / theta^(2i/d), computed in fp32.
  const int64_t d = c.head_dim;
  model->inv_freq_.resize(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
    model->inv_freq_[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), exponent);
  }
  return model;
}

absl::Status CpuModel::Linear(const std::vector<float>& x, int64_t rows, const TensorInfo& w,
                              std::vector<float>* y) {
  const int64_t n = w.shape[0], k = w.shape[1];
  if (y->size() < static_cast<size_t>(rows * n)) y->resize(static_cast<size_t>(rows * n));
  return matmul_->Linear(x.data(), rows, k, w.data, *w.dtype, n, y->data());
}

absl::Status CpuModel::Forward(const ForwardBatch& batch, PagedKvCache& cache,
                               std::vector<float>* logits, ForwardStats* stats) {
  const ModelConfig& c = config();
  const ModelWeights& w = checkpoint_.weights();
  const int64_t tokens = static_cast<int64_t>(batch.token_ids.size());
  const int64_t hidden = c.hidden_size;

  // Validate the batch and derive every token's position.
  positions_.assign(tokens, -1);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const ForwardSequence& seq = batch.seqs[s];
    if (seq.num_tokens <= 0 || seq.token_start < 0 || seq.token_start + seq.num_tokens > tokens ||
        seq.context_len < seq.num_tokens || seq.block_table == nullptr ||
        BlocksForTokens(seq.context_len, cache.config().block_size) >
            static_cast<int64_t>(seq.block_table->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: sequence ", s, " is malformed"));
    }
    if (seq.context_len > c.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: sequence ", s, " reaches position ", seq.context_len - 1,
                       " beyond max_position_embeddings ", c.max_position_embeddings));
    }
    for (int64_t i = 0; i < seq.num_tokens; ++i) {
      positions_[seq.token_start + i] = seq.context_len - seq.num_tokens + i;
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    if (positions_[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward batch: token ", t, " has no sequence"));
    }
    if (batch.token_ids[t] < 0 || batch.token_ids[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", batch.token_ids[t], " outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }

  // Embedding gather.
  h_.resize(static_cast<size_t>(tokens * hidden));
  const size_t row_bytes = hidden * DTypeSize(*w.embed_tokens->dtype);
#pragma omp parallel for schedule(static) if (tokens > 16)
  for (int64_t t = 0; t < tokens; ++t) {
    ConvertToF32(*w.embed_tokens->dtype, w.embed_tokens->data + batch.token_ids[t] * row_bytes,
                 h_.data() + t * hidden, hidden);
  }

  ForwardStats local_stats;
  local_stats.tokens = tokens;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (auto st = AttentionBlock(layer, batch, cache); !st.ok()) return st;
    if (auto st = MoeBlock(layer, tokens, &local_stats); !st.ok()) return st;
  }

  // Final norm and lm_head on the rows that need logits only.
  std::vector<int64_t> rows;
  for (const ForwardSequence& seq : batch.seqs) {
    if (seq.need_logits) rows.push_back(seq.token_start + seq.num_tokens - 1);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  x_.resize(static_cast<size_t>(std::max<int64_t>(n, 1) * hidden));
  for (int64_t i = 0; i < n; ++i) {
    RmsNorm(h_.data() + rows[i] * hidden, final_norm_.data(), 1, hidden, c.rms_norm_eps,
            x_.data() + i * hidden);
  }
  logits->resize(static_cast<size_t>(n * c.vocab_size));
  if (auto st = matmul_->Linear(x_.data(), n, hidden, w.lm_head->data, *w.lm_head->dtype,
                                c.vocab_size, logits->data());
      !st.ok()) {
    return st;
  }
  if (stats != nullptr) *stats = local_stats;
  return absl::OkStatus();
}

absl::Status CpuModel::AttentionBlock(int64_t layer, const ForwardBatch& batch,
                                      PagedKvCache& cache) {
  const ModelConfig& c = config();
  const LayerWeights& lw = checkpoint_.weights().layers[layer];
  const int64_t tokens = static_cast<int64_t>(batch.token_ids.size());
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;

  x_.resize(static_cast<size_t>(tokens * hidden));
  RmsNorm(h_.data(), input_norm_[layer].data(), tokens, hidden, c.rms_norm_eps, x_.data());
  if (auto st = Linear(x_, tokens, *lw.q_proj, &q_); !st.ok()) return st;
  if (auto st = Linear(x_, tokens, *lw.k_proj, &k_); !st.ok()) return st;
  if (auto st = Linear(x_, tokens, *lw.v_proj, &v_); !st.ok()) return st;

  // RoPE on q and k at each token's position, then K/V into the paged cache.
  const int64_t half = d / 2;
#pragma omp parallel
  {
    std::vector<float> cos_row(half), sin_row(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const float pos = static_cast<float>(positions_[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float freq = pos * inv_freq_[i];
        cos_row[i] = std::cos(freq);
        sin_row[i] = std::sin(freq);
      }
      ApplyRope(q_.data() + t * heads * d, heads, d, cos_row.data(), sin_row.data());
      ApplyRope(k_.data() + t * kv_heads * d, kv_heads, d, cos_row.data(), sin_row.data());
    }
  }
  KvLayerView view;
  view.base = cache.LayerBase(layer);
  view.dtype = cache.config().dtype;
  view.num_kv_heads = kv_heads;
  view.head_dim = d;
  view.block_size = cache.config().block_size;
  view.block_stride_bytes = cache.block_stride_bytes();
  view.value_offset_bytes = cache.value_offset_bytes();
  // New K/V rows into their slots (rows are the batch's tokens, in order), then attention.
  std::vector<AttentionSequence> attn_seqs;
  attn_seqs.reserve(batch.seqs.size());
  append_rows_.resize(static_cast<size_t>(tokens));
  for (const ForwardSequence& seq : batch.seqs) {
    for (int64_t i = 0; i < seq.num_tokens; ++i) {
      const int64_t t = seq.token_start + i;
      append_rows_[t] = KvAppendRow{seq.block_table->data(), positions_[t]};
    }
    attn_seqs.push_back(AttentionSequence{seq.block_table->data(), seq.token_start, seq.num_tokens,
                                          seq.context_len});
  }
  AppendKv(view, append_rows_.data(), tokens, k_.data(), v_.data());
  attn_.resize(static_cast<size_t>(tokens * heads * d));
  PagedAttention(view, attn_seqs.data(), static_cast<int64_t>(attn_seqs.size()), q_.data(), heads,
                 1.0f / std::sqrt(static_cast<float>(d)), c.sliding_window, attn_.data());

  if (auto st = Linear(attn_, tokens, *lw.o_proj, &proj_); !st.ok()) return st;
  for (int64_t i = 0; i < tokens * hidden; ++i) h_[i] += proj_[i];
  return absl::OkStatus();
}

absl::Status CpuModel::MoeBlock(int64_t layer, int64_t tokens, ForwardStats* stats) {
  const ModelConfig& c = config();
  const LayerWeights& lw = checkpoint_.weights().layers[layer];
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t num_experts = c.num_local_experts, top_k = c.num_experts_per_tok;

  RmsNorm(h_.data(), post_norm_[layer].data(), tokens, hidden, c.rms_norm_eps, x_.data());
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
  for (int64_t i = 0; i < tokens * hidden; ++i) h_[i] += moe_out_[i];
  return absl::OkStatus();
}

}  // namespace moebatch
