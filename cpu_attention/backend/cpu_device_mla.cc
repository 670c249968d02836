// CpuDevice's multi-head latent attention (ModelConfig::mla: DeepSeek-V2 / V3), in the absorbed
// form of cpu_attention/ops/deepseek_ops.h: task A writes each head's absorbed query and the
// token's latent row for the CPU's MQA attention over the latent cache; task B multiplies each
// head's attention output (kv_lora_rank values) by W_UV before o_proj (cpu_device.cc).
//
// Math (transformers DeepseekV2Attention / DeepseekV3Attention.forward), per token:
//   q = q_proj(x)  or  q_b_proj(q_a_layernorm(q_a_proj(x)))         [heads, qk_nope + qk_rope]
//   [c_kv | k_pe] = kv_a_proj_with_mqa(x);  c_kv = kv_a_layernorm(c_kv)
//   q_pe, k_pe rotated (MlaRope); q_absorbed[h] = [W_UK[h]ᵀ q_nope[h] | q_pe[h]]
// The two low-rank norms are DeepseekV2RMSNorm(n) with its default eps 1e-6, not rms_norm_eps.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cpu_attention/backend/cpu_device.h"
#include "cpu_attention/ops/deepseek_ops.h"
#include "cpu_attention/ops/ops.h"

namespace moebatch {
namespace {

constexpr float kLowRankNormEps = 1e-6f;  // q_a_layernorm, kv_a_layernorm

}  // namespace

absl::Status CpuDevice::PrepareMla() {
  const MlaConfig& m = *config_.mla;
  const int64_t heads = config_.num_attention_heads;
  const int64_t nope = m.qk_nope_head_dim, lora = m.kv_lora_rank;
  for (const LayerWeights& lw : weights_.layers) {
    const TensorInfo& kv_b = *lw.kv_b_proj;
    if (kv_b.quant || !kv_b.dtype) {
      return absl::UnimplementedError(
          absl::StrCat(kv_b.name,
                       ": MLA's kv_b_proj must be f32, f16 or bf16 (a quantized one is not "
                       "computed: its W_UK is transposed for the absorbed query)"));
    }
    MlaLayer layer;
    if (lw.q_a_layernorm != nullptr) {
      layer.q_a_norm.resize(static_cast<size_t>(lw.q_a_layernorm->numel()));
      ConvertToF32(*lw.q_a_layernorm->dtype, lw.q_a_layernorm->data, layer.q_a_norm.data(),
                   layer.q_a_norm.size());
    }
    layer.kv_a_norm.resize(static_cast<size_t>(lw.kv_a_layernorm->numel()));
    ConvertToF32(*lw.kv_a_layernorm->dtype, lw.kv_a_layernorm->data, layer.kv_a_norm.data(),
                 layer.kv_a_norm.size());
    // kv_b_proj [heads * (nope + v), lora]: head h's W_UK is rows [h (nope + v), + nope).
    const size_t elem = DTypeSize(*kv_b.dtype);
    layer.w_uk_t.resize(static_cast<size_t>(heads * lora * nope) * elem);
    for (int64_t h = 0; h < heads; ++h) {
      const std::byte* w_uk =
          kv_b.data + static_cast<size_t>(h * (nope + m.v_head_dim) * lora) * elem;
      std::byte* dst = layer.w_uk_t.data() + static_cast<size_t>(h * lora * nope) * elem;
      for (int64_t n = 0; n < nope; ++n) {
        for (int64_t c = 0; c < lora; ++c) {
          std::memcpy(dst + static_cast<size_t>(c * nope + n) * elem,
                      w_uk + static_cast<size_t>(n * lora + c) * elem, elem);
        }
      }
    }
    mla_.push_back(std::move(layer));
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::TaskAMla(MicroBatch& mb, int64_t layer, float* q, float* k, float* v) {
  const ModelConfig& c = config_;
  const MlaConfig& m = *c.mla;
  const LayerWeights& lw = weights_.layers[layer];
  const MlaLayer& ml = mla_[layer];
  const int64_t tokens = mb.tokens, hidden = c.hidden_size, heads = c.num_attention_heads;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, lora = m.kv_lora_rank;
  const int64_t qk = m.qk_head_dim(), latent = m.latent_dim();
  if (tokens == 0) return absl::OkStatus();

  x_.resize(static_cast<size_t>(tokens * hidden));
  if (auto st =
          cpu_ops::RmsNorm(mb.h.data(), small_[layer].input_norm.data(), DType::kF32, tokens,
                           hidden, static_cast<float>(c.rms_norm_eps), x_.data(), DType::kF32);
      !st.ok()) {
    return st;
  }
  // q [tokens, heads, qk_nope + qk_rope].
  if (m.q_lora_rank == 0) {
    if (auto st = Linear(x_, tokens, *lw.q_proj, &mla_q_); !st.ok()) return st;
  } else {
    if (auto st = Linear(x_, tokens, *lw.q_a_proj, &mla_a_); !st.ok()) return st;
    if (auto st = cpu_ops::RmsNorm(mla_a_.data(), ml.q_a_norm.data(), DType::kF32, tokens,
                                   m.q_lora_rank, kLowRankNormEps, mla_a_.data(), DType::kF32);
        !st.ok()) {
      return st;
    }
    if (auto st = Linear(mla_a_, tokens, *lw.q_b_proj, &mla_q_); !st.ok()) return st;
  }
  // The latent row [c_kv | k_pe] straight into k: kv_a_proj_with_mqa, c_kv normed, k_pe rotated.
  if (auto st = Linear(x_.data(), tokens, *lw.kv_a_proj, k); !st.ok()) return st;
  for (int64_t t = 0; t < tokens; ++t) {
    if (auto st = cpu_ops::RmsNorm(k + t * latent, ml.kv_a_norm.data(), DType::kF32, 1, lora,
                                   kLowRankNormEps, k + t * latent, DType::kF32);
        !st.ok()) {
      return st;
    }
  }
  if (auto st = cpu_ops::MlaRope(k + lora, tokens, 1, latent, rope, mb.positions.data(),
                                 rope_.inv_freq.data(), rope_.attention_scaling, m.rope_interleave);
      !st.ok()) {
    return st;
  }
  // q_pe into the tail of each head's absorbed query, rotated there.
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = mla_q_.data() + (t * heads + h) * qk + nope;
      std::copy(src, src + rope, q + (t * heads + h) * latent + lora);
    }
  }
  if (auto st = cpu_ops::MlaRope(q + lora, tokens, heads, latent, rope, mb.positions.data(),
                                 rope_.inv_freq.data(), rope_.attention_scaling, m.rope_interleave);
      !st.ok()) {
    return st;
  }
  // The absorbed q_nope: per head, [tokens, nope] x W_UK[h] -> [tokens, kv_lora_rank].
  const DType w_dtype = *lw.kv_b_proj->dtype;
  const size_t elem = DTypeSize(w_dtype);
  mla_b_.resize(static_cast<size_t>(tokens * nope));
  mla_a_.resize(static_cast<size_t>(std::max(tokens * lora, tokens * m.q_lora_rank)));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t) {
      const float* src = mla_q_.data() + (t * heads + h) * qk;
      std::copy(src, src + nope, mla_b_.data() + t * nope);
    }
    const std::byte* w = ml.w_uk_t.data() + static_cast<size_t>(h * lora * nope) * elem;
    if (auto st = matmul_->Linear(mla_b_.data(), tokens, nope, w, w_dtype, lora, mla_a_.data());
        !st.ok()) {
      return st;
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy(mla_a_.data() + t * lora, mla_a_.data() + (t + 1) * lora,
                q + (t * heads + h) * latent);
    }
  }
  // The value is the latent row's first kv_lora_rank values: a cache with value_dim (MLA's,
  // KvCacheConfigFor) does not read v; one without stores the row again as V.
  std::copy(k, k + tokens * latent, v);
  return absl::OkStatus();
}

absl::Status CpuDevice::MlaValueUp(int64_t layer, int64_t tokens, const float* attn, float* out) {
  const ModelConfig& c = config_;
  const MlaConfig& m = *c.mla;
  const TensorInfo& kv_b = *weights_.layers[layer].kv_b_proj;
  const int64_t heads = c.num_attention_heads, lora = m.kv_lora_rank, vd = m.v_head_dim;
  const int64_t nope = m.qk_nope_head_dim, latent = m.latent_dim();
  const DType w_dtype = *kv_b.dtype;
  const size_t elem = DTypeSize(w_dtype);
  mla_b_.resize(static_cast<size_t>(tokens * lora));
  mla_kv_.resize(static_cast<size_t>(tokens * vd));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t) {
      const float* src = attn + (t * heads + h) * latent;
      std::copy(src, src + lora, mla_b_.data() + t * lora);
    }
    // W_UV[h]: kv_b_proj rows [h (nope + v) + nope, + v), [v, kv_lora_rank].
    const std::byte* w = kv_b.data + static_cast<size_t>((h * (nope + vd) + nope) * lora) * elem;
    if (auto st = matmul_->Linear(mla_b_.data(), tokens, lora, w, w_dtype, vd, mla_kv_.data());
        !st.ok()) {
      return st;
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy(mla_kv_.data() + t * vd, mla_kv_.data() + (t + 1) * vd, out + (t * heads + h) * vd);
    }
  }
  return absl::OkStatus();
}

}  // namespace moebatch
