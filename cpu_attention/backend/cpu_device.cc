#include "cpu_attention/backend/cpu_device.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cpu_attention/ops/ops.h"

namespace moebatch {
namespace {

std::vector<float> ToF32(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  ConvertToF32(*t.dtype, t.data, out.data(), out.size());
  return out;
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
  return cpu_ops::EmbeddingGather(table.data, *table.dtype, config_.vocab_size, hidden, token_ids,
                                  tokens, mb.h.data());
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

  const float eps = static_cast<float>(c.rms_norm_eps);

  x_.resize(static_cast<size_t>(tokens * hidden));
  if (auto st = cpu_ops::RmsNorm(mb.h.data(), input_norm_[layer].data(), DType::kF32, tokens,
                                 hidden, eps, x_.data(), DType::kF32);
      !st.ok()) {
    return st;
  }
  if (auto st = Linear(x_.data(), tokens, *lw.q_proj, q); !st.ok()) return st;
  if (auto st = Linear(x_.data(), tokens, *lw.k_proj, k); !st.ok()) return st;
  if (auto st = Linear(x_.data(), tokens, *lw.v_proj, v); !st.ok()) return st;
  // RoPE on q and k at each token's position.
  if (auto st = cpu_ops::ApplyRope(q, tokens, heads, d, mb.positions.data(), inv_freq_.data());
      !st.ok()) {
    return st;
  }
  return cpu_ops::ApplyRope(k, tokens, kv_heads, d, mb.positions.data(), inv_freq_.data());
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

  const float eps = static_cast<float>(c.rms_norm_eps);

  proj_.resize(static_cast<size_t>(tokens * hidden));
  if (auto st = Linear(attn, tokens, *lw.o_proj, proj_.data()); !st.ok()) return st;
  if (auto st = cpu_ops::AddResidual(mb.h.data(), proj_.data(), tokens * hidden); !st.ok()) {
    return st;
  }

  x_.resize(static_cast<size_t>(tokens * hidden));
  if (auto st = cpu_ops::RmsNorm(mb.h.data(), post_norm_[layer].data(), DType::kF32, tokens, hidden,
                                 eps, x_.data(), DType::kF32);
      !st.ok()) {
    return st;
  }
  if (auto st = Linear(x_, tokens, *lw.router, &router_); !st.ok()) return st;

  // Router: softmax over experts in fp32, top-k (ties to the lower expert id), renormalise; then
  // the (token, choice) pairs sorted by expert, each expert's tokens in increasing order.
  const int64_t pairs = tokens * top_k;
  expert_ids_.resize(static_cast<size_t>(pairs));
  expert_weights_.resize(static_cast<size_t>(pairs));
  expert_offsets_.resize(static_cast<size_t>(num_experts + 1));
  sorted_token_.resize(static_cast<size_t>(pairs));
  slot_of_.resize(static_cast<size_t>(pairs));
  if (auto st = cpu_ops::RouterTopK(router_.data(), tokens, num_experts, top_k, expert_ids_.data(),
                                    expert_weights_.data());
      !st.ok()) {
    return st;
  }
  if (auto st = cpu_ops::BuildExpertPermutation(expert_ids_.data(), tokens, top_k, num_experts,
                                                expert_offsets_.data(), sorted_token_.data(),
                                                slot_of_.data());
      !st.ok()) {
    return st;
  }

  // Experts in id order, each over the tokens routed to it, into its rows of expert_out_.
  expert_out_.resize(static_cast<size_t>(pairs * hidden));
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = expert_offsets_[e];
    const int64_t n = expert_offsets_[e + 1] - begin;
    if (n == 0) continue;
    if (stats != nullptr) {
      stats->expert_token_pairs += n;
      stats->experts_touched += 1;
    }
    expert_in_.resize(static_cast<size_t>(n * hidden));
    if (auto st = cpu_ops::GatherRows(x_.data(), DType::kF32, tokens, hidden,
                                      sorted_token_.data() + begin, n, expert_in_.data());
        !st.ok()) {
      return st;
    }
    const ExpertWeights& ew = lw.experts[e];
    if (auto st = Linear(expert_in_, n, *ew.w1, &gate_); !st.ok()) return st;
    if (auto st = Linear(expert_in_, n, *ew.w3, &up_); !st.ok()) return st;
    // silu(w1 x) * (w3 x), in place into gate_.
    if (auto st = cpu_ops::SiluMul(gate_.data(), up_.data(), DType::kF32, n, inter, gate_.data(),
                                   DType::kF32);
        !st.ok()) {
      return st;
    }
    if (auto st = Linear(gate_.data(), n, *ew.w2, expert_out_.data() + begin * hidden); !st.ok()) {
      return st;
    }
  }
  // MixtralSparseMoeBlock's index_add_ of the weighted expert outputs, experts in id order per
  // token, and the residual add.
  return cpu_ops::CombineExperts(expert_out_.data(), slot_of_.data(), expert_ids_.data(),
                                 expert_weights_.data(), tokens, top_k, hidden, mb.h.data());
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
    if (auto st = cpu_ops::RmsNorm(mb.h.data() + rows[i] * hidden, final_norm_.data(), DType::kF32,
                                   1, hidden, static_cast<float>(config_.rms_norm_eps),
                                   x_.data() + i * hidden, DType::kF32);
        !st.ok()) {
      return st;
    }
  }
  return matmul_->Linear(x_.data(), n, hidden, weights_.lm_head->data, *weights_.lm_head->dtype,
                         config_.vocab_size, logits);
}

}  // namespace moebatch
