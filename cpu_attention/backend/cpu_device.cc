#include "cpu_attention/backend/cpu_device.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cpu_attention/gemm/invariant_linear.h"
#include "cpu_attention/gemm/quant_linear.h"
#include "cpu_attention/ops/deepseek_ops.h"
#include "cpu_attention/ops/ops.h"
#include "engine/model/ggml_quants.h"

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

bool DefaultQ8_0F32Activations() { return !QuantLinearUsesVnni(SelectedCpuIsa()); }

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
  device->mxfp4_f32_activations_ = options.mxfp4_f32_activations;
  device->q8_0_f32_activations_ = options.q8_0_f32_activations;
  auto f32 = [](const TensorInfo* t) { return t != nullptr ? ToF32(*t) : std::vector<float>(); };
  for (const LayerWeights& layer : weights.layers) {
    SmallTensors s;
    s.input_norm = f32(layer.input_layernorm);
    s.post_norm = f32(layer.post_attention_layernorm);
    s.q_bias = f32(layer.q_bias);
    s.k_bias = f32(layer.k_bias);
    s.v_bias = f32(layer.v_bias);
    s.o_bias = f32(layer.o_bias);
    s.q_norm = f32(layer.q_norm);
    s.k_norm = f32(layer.k_norm);
    s.sinks = f32(layer.sinks);
    s.router_bias = f32(layer.router_linear_bias);
    if (layer.experts_gate_up_bias != nullptr) {
      // gate_up_proj_bias [experts, 2 inter]: gate = [..., ::2], up = [..., 1::2]
      // (GptOssExperts.forward), split into two [experts, inter] halves.
      const std::vector<float> gate_up = ToF32(*layer.experts_gate_up_bias);
      const size_t half = gate_up.size() / 2;
      s.expert_gate_bias.resize(half);
      s.expert_up_bias.resize(half);
      for (size_t i = 0; i < half; ++i) {
        s.expert_gate_bias[i] = gate_up[2 * i];
        s.expert_up_bias[i] = gate_up[2 * i + 1];
      }
      s.expert_down_bias = f32(layer.experts_down_bias);
    }
    device->small_.push_back(std::move(s));
  }
  device->final_norm_ = ToF32(*weights.norm);
  for (const LayerWeights& layer : weights.layers) {  // DeepSeek-V3's router bias
    device->router_bias_.push_back(f32(layer.router_bias));
  }
  if (config.mla) {
    if (absl::Status st = device->PrepareMla(); !st.ok()) return st;
  }
  // The rotary embedding's inv_freq (f32, as transformers computes it) for the config's scaling.
  device->rope_ = ComputeRope(config);
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
  if (w.quant == GgmlType::kMXFP4 && config_.mxfp4_experts && mxfp4_f32_activations_) {
    // A Hugging Face MXFP4 checkpoint (gpt-oss): its weights widened exactly, f32 activations,
    // as transformers computes over the dequantized experts.
    return InvariantLinearMxfp4(x, rows, w.shape[1], w.data, w.shape[0], y);
  }
  if (w.quant == GgmlType::kQ8_0 && q8_0_f32_activations_) {
    return InvariantLinearQ8_0(x, rows, w.shape[1], w.data, w.shape[0], y);
  }
  if (w.quant) return QuantLinear(x, rows, w.shape[1], w.data, *w.quant, w.shape[0], y);
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
  if (table.quant) {  // a GGUF or int8 table: each row decoded (ggml's get_rows)
    const int64_t row_bytes = GgmlRowBytes(GgmlTypeInfoOf(*table.quant), hidden);
    for (int64_t t = 0; t < tokens; ++t) {
      if (auto st = DequantizeRow(*table.quant, table.data + token_ids[t] * row_bytes, hidden,
                                  mb.h.data() + t * hidden);
          !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  return cpu_ops::EmbeddingGather(table.data, *table.dtype, config_.vocab_size, hidden, token_ids,
                                  tokens, mb.h.data());
}

absl::Status CpuDevice::TaskA(int micro_batch, int64_t layer, float* q, float* k, float* v,
                              float* /*attn: no prefill segments here (AttendsPrefill false)*/) {
  auto got = Get(micro_batch, layer);
  if (!got.ok()) return got.status();
  MicroBatch& mb = **got;
  if (config_.mla) return TaskAMla(mb, layer, q, k, v);
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  const int64_t tokens = mb.tokens;
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;

  const float eps = static_cast<float>(c.rms_norm_eps);

  const SmallTensors& small = small_[layer];
  x_.resize(static_cast<size_t>(tokens * hidden));
  if (auto st = Norm(mb.h.data(), small.input_norm, tokens, x_.data()); !st.ok()) return st;
  if (auto st = Linear(x_.data(), tokens, *lw.q_proj, q); !st.ok()) return st;
  if (auto st = Linear(x_.data(), tokens, *lw.k_proj, k); !st.ok()) return st;
  if (auto st = Linear(x_.data(), tokens, *lw.v_proj, v); !st.ok()) return st;
  if (!small.q_bias.empty()) {  // nn.Linear(bias=True) on q, k, v
    for (auto [x, bias, n] :
         {std::tuple{q, &small.q_bias, c.q_size()}, std::tuple{k, &small.k_bias, c.kv_size()},
          std::tuple{v, &small.v_bias, c.kv_size()}}) {
      if (auto st = cpu_ops::AddBias(x, tokens, n, bias->data()); !st.ok()) return st;
    }
  }
  if (c.qk_norm == QkNorm::kPerHead) {  // Qwen3: RMSNorm over each head's head_dim values
    if (auto st = cpu_ops::RmsNorm(q, small.q_norm.data(), DType::kF32, tokens * heads, d, eps, q,
                                   DType::kF32);
        !st.ok()) {
      return st;
    }
    if (auto st = cpu_ops::RmsNorm(k, small.k_norm.data(), DType::kF32, tokens * kv_heads, d, eps,
                                   k, DType::kF32);
        !st.ok()) {
      return st;
    }
  } else if (c.qk_norm == QkNorm::kPerProjection) {  // OLMoE: over the whole projection
    if (auto st = cpu_ops::RmsNorm(q, small.q_norm.data(), DType::kF32, tokens, c.q_size(), eps, q,
                                   DType::kF32);
        !st.ok()) {
      return st;
    }
    if (auto st = cpu_ops::RmsNorm(k, small.k_norm.data(), DType::kF32, tokens, c.kv_size(), eps, k,
                                   DType::kF32);
        !st.ok()) {
      return st;
    }
  }
  if (c.clip_qkv) {  // OLMoE: q, k (normed) and v clamped, as OlmoeAttention
    const float limit = static_cast<float>(*c.clip_qkv);
    for (auto [x, n] :
         {std::pair{q, c.q_size()}, std::pair{k, c.kv_size()}, std::pair{v, c.kv_size()}}) {
      if (auto st = cpu_ops::ClampAbs(x, tokens * n, limit); !st.ok()) return st;
    }
  }
  // RoPE on q and k at each token's position.
  if (auto st = cpu_ops::ApplyRope(q, tokens, heads, d, mb.positions.data(), rope_.inv_freq.data(),
                                   rope_.attention_scaling);
      !st.ok()) {
    return st;
  }
  return cpu_ops::ApplyRope(k, tokens, kv_heads, d, mb.positions.data(), rope_.inv_freq.data(),
                            rope_.attention_scaling);
}

absl::Status CpuDevice::TaskB(int micro_batch, int64_t layer, const float* attn,
                              ForwardStats* stats) {
  auto got = Get(micro_batch, layer);
  if (!got.ok()) return got.status();
  MicroBatch& mb = **got;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[layer];
  const int64_t tokens = mb.tokens;
  const int64_t hidden = c.hidden_size;
  const SmallTensors& small = small_[layer];
  // A dense layer: its FFN is the one "expert", chosen by every token with weight 1.
  const bool moe = lw.router != nullptr;
  const int64_t num_experts = moe ? c.num_local_experts : 1;
  const int64_t top_k = moe ? c.num_experts_per_tok : 1;

  proj_.resize(static_cast<size_t>(tokens * hidden));
  const float* o_in = attn;
  if (c.mla) {  // the absorbed attention's W_UV before o_proj
    mla_v_.resize(static_cast<size_t>(tokens * c.num_attention_heads * c.mla->v_head_dim));
    if (auto st = MlaValueUp(layer, tokens, attn, mla_v_.data()); !st.ok()) return st;
    o_in = mla_v_.data();
  }
  if (auto st = Linear(o_in, tokens, *lw.o_proj, proj_.data()); !st.ok()) return st;
  if (!small.o_bias.empty()) {
    if (auto st = cpu_ops::AddBias(proj_.data(), tokens, hidden, small.o_bias.data()); !st.ok()) {
      return st;
    }
  }
  if (auto st = cpu_ops::AddResidual(mb.h.data(), proj_.data(), tokens * hidden); !st.ok()) {
    return st;
  }

  x_.resize(static_cast<size_t>(tokens * hidden));
  if (auto st = Norm(mb.h.data(), small.post_norm, tokens, x_.data()); !st.ok()) return st;

  // Router: softmax over experts in fp32, top-k (ties to the lower expert id), renormalise; then
  // the (token, choice) pairs sorted by expert, each expert's tokens in increasing order.
  const int64_t pairs = tokens * top_k;
  expert_ids_.resize(static_cast<size_t>(pairs));
  expert_weights_.resize(static_cast<size_t>(pairs));
  expert_offsets_.resize(static_cast<size_t>(num_experts + 1));
  sorted_token_.resize(static_cast<size_t>(pairs));
  slot_of_.resize(static_cast<size_t>(pairs));
  if (moe) {
    if (auto st = Linear(x_, tokens, *lw.router, &router_); !st.ok()) return st;
    if (!small.router_bias.empty()) {  // GptOssTopKRouter: F.linear with bias
      if (auto st = cpu_ops::AddBias(router_.data(), tokens, num_experts, small.router_bias.data());
          !st.ok()) {
        return st;
      }
    }
    // DBRX's p-norm (p != 1) divides the top-k weights after the selection.
    const bool p_norm = c.norm_topk_prob && c.topk_norm_p != 1.0;
    if (c.topk_method != TopkMethod::kSoftmax) {  // DeepSeek's routers
      if (auto st =
              cpu_ops::RouterDeepseek(router_.data(), router_bias_[layer].data(), tokens,
                                      num_experts, top_k, c.topk_method, c.n_group, c.topk_group,
                                      c.norm_topk_prob, static_cast<float>(c.routed_scaling_factor),
                                      expert_ids_.data(), expert_weights_.data());
          !st.ok()) {
        return st;
      }
    } else if (auto st = cpu_ops::RouterTopK(router_.data(), tokens, num_experts, top_k,
                                             expert_ids_.data(), expert_weights_.data(),
                                             c.norm_topk_prob && !p_norm);
               !st.ok()) {
      return st;
    }
    if (p_norm) {
      if (auto st = cpu_ops::NormalizeTopKWeights(expert_weights_.data(), tokens, top_k,
                                                  static_cast<float>(c.topk_norm_p));
          !st.ok()) {
        return st;
      }
    }
  } else {
    std::fill(expert_ids_.begin(), expert_ids_.end(), 0);
    std::fill(expert_weights_.begin(), expert_weights_.end(), 1.0f);
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
    if (auto st = Ffn(lw.experts[e], n, expert_out_.data() + begin * hidden,
                      small.expert_down_bias.empty() ? nullptr : &small, e);
        !st.ok()) {
      return st;
    }
  }
  // The shared expert over every token: Qwen2-MoE's scaled by sigmoid(x · shared_expert_gate),
  // DeepSeek's as it is.
  const float* shared = nullptr;
  if (moe && lw.shared_expert.w1 != nullptr) {
    expert_in_.assign(x_.begin(), x_.begin() + tokens * hidden);
    shared_out_.resize(static_cast<size_t>(tokens * hidden));
    if (auto st = Ffn(lw.shared_expert, tokens, shared_out_.data()); !st.ok()) return st;
    shared = shared_out_.data();
  }
  if (shared != nullptr && lw.shared_expert_gate != nullptr) {
    if (auto st = Linear(x_, tokens, *lw.shared_expert_gate, &shared_gate_); !st.ok()) return st;
    if (auto st = cpu_ops::ScaleBySigmoid(shared_out_.data(), tokens, hidden, shared_gate_.data());
        !st.ok()) {
      return st;
    }
  }
  // The sparse MoE block's index_add_ of the weighted expert outputs, experts in id order per
  // token (plus the shared expert's), and the residual add.
  return cpu_ops::CombineExperts(expert_out_.data(), slot_of_.data(), expert_ids_.data(),
                                 expert_weights_.data(), tokens, top_k, hidden, mb.h.data(),
                                 shared);
}

absl::Status CpuDevice::Ffn(const ExpertWeights& ew, int64_t n, float* out,
                            const SmallTensors* bias, int64_t e) {
  const int64_t width = ew.w1->shape[0], hidden = config_.hidden_size;
  if (auto st = Linear(expert_in_, n, *ew.w1, &gate_); !st.ok()) return st;
  if (auto st = Linear(expert_in_, n, *ew.w3, &up_); !st.ok()) return st;
  if (bias != nullptr) {  // GptOssExperts: gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e]
    if (auto st =
            cpu_ops::AddBias(gate_.data(), n, width, bias->expert_gate_bias.data() + e * width);
        !st.ok()) {
      return st;
    }
    if (auto st = cpu_ops::AddBias(up_.data(), n, width, bias->expert_up_bias.data() + e * width);
        !st.ok()) {
      return st;
    }
  }
  if (config_.swiglu_limit) {  // gpt-oss's clamped SwiGLU, in place into gate_
    if (auto st = cpu_ops::ClampedSwiglu(gate_.data(), up_.data(), n, width,
                                         static_cast<float>(*config_.swiglu_limit), gate_.data());
        !st.ok()) {
      return st;
    }
  } else if (auto st = cpu_ops::SiluMul(gate_.data(), up_.data(), DType::kF32, n, width,
                                        gate_.data(), DType::kF32);
             !st.ok()) {  // silu(w1 x) * (w3 x), in place into gate_
    return st;
  }
  if (auto st = Linear(gate_.data(), n, *ew.w2, out); !st.ok()) return st;
  if (bias == nullptr) return absl::OkStatus();
  return cpu_ops::AddBias(out, n, hidden, bias->expert_down_bias.data() + e * hidden);
}

absl::Status CpuDevice::Norm(const float* in, const std::vector<float>& weight, int64_t rows,
                             float* out) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (config_.norm == NormType::kLayerNorm) {
    return cpu_ops::LayerNorm(in, weight.data(), DType::kF32, rows, config_.hidden_size, eps, out,
                              DType::kF32);
  }
  return cpu_ops::RmsNorm(in, weight.data(), DType::kF32, rows, config_.hidden_size, eps, out,
                          DType::kF32);
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
    if (auto st = Norm(mb.h.data() + rows[i] * hidden, final_norm_, 1, x_.data() + i * hidden);
        !st.ok()) {
      return st;
    }
  }
  return Linear(x_.data(), n, *weights_.lm_head, logits);
}

}  // namespace moebatch
