// The cuda backend's passes (cuda/cuda_device_internal.h): the embedding, task A (norm, q/k/v,
// RoPE, prefill attention over the segments), task B (O projection, norm, router, experts, shared
// expert, residual), lm_head, logits and greedy tokens, on the compute stream with cuda/kernels.h
// and cuBLAS, each layer's weights awaited from their resident region or weight slot.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/cuda_device_internal.h"
#include "engine/model/ggml_type.h"

namespace moebatch {
namespace cuda_device_internal {
namespace {

// out [rows, hidden] (dtype) = the config's norm of the hidden states in [rows, hidden] f32 with
// weight [hidden] (dtype): RMSNorm, or DBRX's LayerNorm without bias.
absl::Status HiddenNorm(const ModelConfig& c, const float* in, const void* weight, GpuDType dtype,
                        int64_t rows, void* out, cudaStream_t stream) {
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (c.norm == NormType::kLayerNorm) {
    return gpu::LayerNorm(in, weight, dtype, rows, c.hidden_size, eps, out, dtype, stream);
  }
  return gpu::RmsNorm(in, weight, dtype, rows, c.hidden_size, eps, out, dtype, stream);
}

}  // namespace

absl::Status CudaDevice::Gemm(const void* x, const void* w, int64_t m, int64_t n, int64_t k,
                              float* y) {
  return GemmStrided(x, k, w, k, /*w_rows_out=*/true, m, n, k, y, n);
}

absl::Status CudaDevice::GemmStrided(const void* x, int64_t ldx, const void* w, int64_t ldw,
                                     bool w_rows_out, int64_t m, int64_t n, int64_t k, float* y,
                                     int64_t ldy) {
  if (m == 0) return absl::OkStatus();
  // Column-major yᵀ [n, m] (ldc ldy) = op(w) [n, k] xᵀ [k, m] (ldb ldx): w [n, k] row-major is
  // column-major k x n (op T), w [k, n] is column-major n x k (op N), both with lda ldw.
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = CudaType(dtype_);
  return CublasError(
      blas_->gemm_ex(cublas_, w_rows_out ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                     static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, w, t,
                     static_cast<int>(ldw), x, t, static_cast<int>(ldx), &beta, y, CUDA_R_32F,
                     static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

absl::Status CudaDevice::Gemm(const void* x, const std::byte* slot, int64_t layer,
                              const TensorInfo* t, int64_t m, int64_t n, int64_t k, float* y) {
  if (m == 0) return absl::OkStatus();
  const void* w = Tensor(slot, layer, t);
  if (t->quant) {
    MB_RETURN_IF_ERROR(gpu::DequantizeRows(w, *t->quant, n, k, dequant_, dtype_, compute_));
    w = dequant_;
  }
  return Gemm(x, w, m, n, k, y);
}

absl::Status CudaDevice::OutputProjection(int micro_batch, const std::byte* slot, int64_t layer,
                                          int64_t from, int64_t to) {
  if (to <= from) return absl::OkStatus();
  const ModelConfig& c = config();
  const int64_t q_row = c.q_size(), hidden = c.hidden_size, rows = to - from;
  std::byte* attn_c = static_cast<std::byte*>(attn_c_) + from * q_row * elem_;
  MB_RETURN_IF_ERROR(
      gpu::ConvertF32To(attn_f_ + from * q_row, rows * q_row, attn_c, dtype_, compute_));
  const LayerWeights& lw = store_.weights().layers[layer];
  if (c.mla) {  // the absorbed attention's W_UV before o_proj
    MB_RETURN_IF_ERROR(MlaValueUp(slot, layer, from, to));
    const int64_t v_row = c.num_attention_heads * c.mla->v_head_dim;
    MB_RETURN_IF_ERROR(Gemm(static_cast<std::byte*>(mla_v_c_) + from * v_row * elem_, slot, layer,
                            lw.o_proj, rows, hidden, v_row, proj_ + from * hidden));
  } else {
    MB_RETURN_IF_ERROR(
        Gemm(attn_c, slot, layer, lw.o_proj, rows, hidden, q_row, proj_ + from * hidden));
  }
  if (lw.o_bias != nullptr) {
    MB_RETURN_IF_ERROR(gpu::AddBias(proj_ + from * hidden, rows, hidden,
                                    Tensor(slot, layer, lw.o_bias), dtype_, compute_));
  }
  return gpu::AddResidual(h_[micro_batch] + from * hidden, proj_ + from * hidden, rows * hidden,
                          compute_);
}

absl::Status CudaDevice::RunEmbed(int micro_batch, const int32_t* token_ids,
                                  const int64_t* positions, int64_t tokens) {
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, 0, tokens));
  prefill_segments_[micro_batch] = 0;
  const ModelConfig& c = config();
  const TensorInfo& table = *store_.weights().embed_tokens;
  // A quantized table's rows are gathered in their blocks and decoded on the device.
  const size_t row_bytes =
      table.quant ? static_cast<size_t>(GgmlRowBytes(GgmlTypeInfoOf(*table.quant), c.hidden_size))
                  : static_cast<size_t>(c.hidden_size) * DTypeSize(*table.dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", token_ids[t], " outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  // The embedding table stays in host memory: gather the rows here, widen on the GPU.
  embed_rows_.resize(static_cast<size_t>(tokens) * row_bytes);
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(embed_rows_.data() + t * row_bytes, table.data + token_ids[t] * row_bytes,
                row_bytes);
  }
  tokens_[micro_batch] = tokens;
  if (tokens == 0) return absl::OkStatus();
  // Stage the rows in the (not yet used) expert-input buffer, which is large enough:
  // [T k, hidden] >= [T, hidden] in the compute dtype (2 or 4 bytes an element; ggml blocks take
  // at most 34 bytes per 32).
  MB_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(expert_in_, embed_rows_.data(), embed_rows_.size(),
                                               cudaMemcpyHostToDevice, compute_),
                               "embedding rows H2D"));
  MB_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(positions_[micro_batch], positions,
                                               static_cast<size_t>(tokens) * sizeof(int64_t),
                                               cudaMemcpyHostToDevice, compute_),
                               "positions H2D"));
  if (table.quant) {
    MB_RETURN_IF_ERROR(gpu::DequantizeRows(expert_in_, *table.quant, tokens, c.hidden_size,
                                           h_[micro_batch], GpuDType::kF32, compute_));
  } else {
    MB_RETURN_IF_ERROR(gpu::ConvertToF32(expert_in_, ToGpu(*table.dtype), tokens * c.hidden_size,
                                         h_[micro_batch], compute_));
  }
  MB_RETURN_IF_ERROR(weight_slots_->StartPass());
  return CudaError(cudaStreamSynchronize(compute_), "embedding");
}

absl::Status CudaDevice::RunSetPrefillSegments(int micro_batch, const int32_t* cu_rows,
                                               int64_t num_segments) {
  const int64_t tokens = TokensOf(micro_batch);
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, 0, tokens));
  if (num_segments < 0 || num_segments > tokens || (num_segments > 0 && cu_rows == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill segments: ", num_segments, " segments in a micro-batch of ", tokens, " tokens"));
  }
  for (int64_t s = 0; s < num_segments + (num_segments > 0 ? 1 : 0); ++s) {
    if (cu_rows[s] < 0 || cu_rows[s] > tokens || (s > 0 && cu_rows[s] < cu_rows[s - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefill segments: cu_rows[", s, "] = ", cu_rows[s],
                       " is out of order or outside [0, ", tokens, "]"));
    }
  }
  prefill_segments_[micro_batch] = num_segments;
  if (num_segments == 0) return absl::OkStatus();
  prefill_first_[micro_batch] = cu_rows[0];
  prefill_last_[micro_batch] = cu_rows[num_segments];
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(prefill_cu_[micro_batch], cu_rows,
                                static_cast<size_t>(num_segments + 1) * sizeof(int32_t),
                                cudaMemcpyHostToDevice, compute_),
                "prefill segments H2D"));
  return CudaError(cudaStreamSynchronize(compute_), "prefill segments");
}

absl::Status CudaDevice::RunTaskA(int micro_batch, int64_t layer, float* q, float* k, float* v,
                                  float* attn) {
  const int64_t tokens = TokensOf(micro_batch);
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, layer, tokens));
  const ModelConfig& c = config();
  auto slot = AwaitLayer(layer);
  if (!slot.ok()) return slot.status();
  if (tokens == 0) return absl::OkStatus();
  const std::byte* s = *slot;
  const LayerWeights& lw = store_.weights().layers[layer];
  MB_RETURN_IF_ERROR(HiddenNorm(c, h_[micro_batch], Tensor(s, layer, lw.input_layernorm), dtype_,
                                tokens, x_, compute_));
  if (c.mla) {
    MB_RETURN_IF_ERROR(MlaQueryAndLatent(micro_batch, s, layer, tokens));
  } else {
    MB_RETURN_IF_ERROR(StandardQkv(micro_batch, s, layer, tokens));
  }
  // Prefill attention of the segments, and what task B would do with it: the O projection and
  // the residual, with this layer's weights (device.h: a device that attends prefill may apply it
  // itself). The segments' attention never leaves the GPU, and task B moves only the rows the CPU
  // attended: per prefill token and layer, q_size f32 less each way over PCIe (16 KiB for
  // Mixtral), the H2D half of which would compete with the weight stream.
  const int64_t segments = prefill_segments_[micro_batch];
  const int64_t first = segments > 0 ? prefill_first_[micro_batch] : tokens;
  const int64_t last = segments > 0 ? prefill_last_[micro_batch] : tokens;
  if (segments > 0 && c.mla) {
    MB_RETURN_IF_ERROR(gpu::PrefillAttentionLatent(
        q_, k_, prefill_cu_[micro_batch], segments, tokens, c.num_attention_heads, c.head_dim,
        c.attention_value_dim(), c.attention_scale(), attn_f_, compute_));
    MB_RETURN_IF_ERROR(OutputProjection(micro_batch, s, layer, first, last));
  } else if (segments > 0) {
    // The layer's own window (gpt-oss alternates sliding and full layers) and sinks.
    const float* sinks = lw.sinks != nullptr ? sinks_ + layer * c.num_attention_heads : nullptr;
    MB_RETURN_IF_ERROR(gpu::PrefillAttention(
        q_, k_, v_, prefill_cu_[micro_batch], segments, tokens, c.num_attention_heads,
        c.num_key_value_heads, c.head_dim, c.attention_scale(),
        c.LayerSlidingWindow(layer).value_or(0), sinks, attn_f_, compute_));
    MB_RETURN_IF_ERROR(OutputProjection(micro_batch, s, layer, first, last));
  }
  // q (rows outside the segments: the CPU attends them), k and v to the host on the transfer
  // stream, after the compute stream's work. Under MLA the latent rows are k and, again, v (the
  // CpuDevice's layout; a cache with value_dim does not read v).
  MB_RETURN_IF_ERROR(CudaError(cudaEventRecord(computed_, compute_), "event"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamWaitEvent(transfer_, computed_, 0), "event wait"));
  const int64_t q_row = c.q_size();
  const size_t kvb = static_cast<size_t>(tokens * c.kv_size()) * sizeof(float);
  auto rows_d2h = [&](float* host, const float* device, int64_t from, int64_t to,
                      const char* what) {
    if (to <= from) return absl::OkStatus();
    return CudaError(cudaMemcpyAsync(host + from * q_row, device + from * q_row,
                                     static_cast<size_t>((to - from) * q_row) * sizeof(float),
                                     cudaMemcpyDeviceToHost, transfer_),
                     what);
  };
  MB_RETURN_IF_ERROR(rows_d2h(q, q_, 0, first, "q D2H"));
  MB_RETURN_IF_ERROR(rows_d2h(q, q_, last, tokens, "q D2H"));
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(k, k_, kvb, cudaMemcpyDeviceToHost, transfer_), "k D2H"));
  MB_RETURN_IF_ERROR(CudaError(
      cudaMemcpyAsync(v, c.mla ? k_ : v_, kvb, cudaMemcpyDeviceToHost, transfer_), "v D2H"));
  return CudaError(cudaStreamSynchronize(transfer_), "task A");
}

absl::Status CudaDevice::StandardQkv(int micro_batch, const std::byte* s, int64_t layer,
                                     int64_t tokens) {
  const ModelConfig& c = config();
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const LayerWeights& lw = store_.weights().layers[layer];
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.q_proj, tokens, c.q_size(), hidden, q_));
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.k_proj, tokens, c.kv_size(), hidden, k_));
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.v_proj, tokens, c.kv_size(), hidden, v_));
  // The families' attention inputs, in CpuDevice::TaskA's order: q/k/v biases, the q/k norms
  // (per head: Qwen3; over the projection: OLMoE), clip_qkv (OLMoE), then RoPE.
  if (lw.q_bias != nullptr) {
    for (auto [x, bias, n] :
         {std::tuple{q_, lw.q_bias, c.q_size()}, std::tuple{k_, lw.k_bias, c.kv_size()},
          std::tuple{v_, lw.v_bias, c.kv_size()}}) {
      MB_RETURN_IF_ERROR(gpu::AddBias(x, tokens, n, Tensor(s, layer, bias), dtype_, compute_));
    }
  }
  if (c.qk_norm != QkNorm::kNone) {
    const bool per_head = c.qk_norm == QkNorm::kPerHead;
    const int64_t d = c.head_dim;
    MB_RETURN_IF_ERROR(gpu::RmsNorm(q_, Tensor(s, layer, lw.q_norm), dtype_,
                                    per_head ? tokens * c.num_attention_heads : tokens,
                                    per_head ? d : c.q_size(), eps, q_, GpuDType::kF32, compute_));
    MB_RETURN_IF_ERROR(gpu::RmsNorm(k_, Tensor(s, layer, lw.k_norm), dtype_,
                                    per_head ? tokens * c.num_key_value_heads : tokens,
                                    per_head ? d : c.kv_size(), eps, k_, GpuDType::kF32, compute_));
  }
  if (c.clip_qkv) {
    const float limit = static_cast<float>(*c.clip_qkv);
    MB_RETURN_IF_ERROR(gpu::ClampAbs(q_, tokens * c.q_size(), limit, compute_));
    MB_RETURN_IF_ERROR(gpu::ClampAbs(k_, tokens * c.kv_size(), limit, compute_));
    MB_RETURN_IF_ERROR(gpu::ClampAbs(v_, tokens * c.kv_size(), limit, compute_));
  }
  MB_RETURN_IF_ERROR(gpu::ApplyRope(q_, tokens, c.num_attention_heads, c.head_dim,
                                    positions_[micro_batch], inv_freq_, rope_scaling_, compute_));
  return gpu::ApplyRope(k_, tokens, c.num_key_value_heads, c.head_dim, positions_[micro_batch],
                        inv_freq_, rope_scaling_, compute_);
}

absl::Status CudaDevice::MlaQueryAndLatent(int micro_batch, const std::byte* s, int64_t layer,
                                           int64_t tokens) {
  const ModelConfig& c = config();
  const MlaConfig& m = *c.mla;
  const LayerWeights& lw = store_.weights().layers[layer];
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, lora = m.kv_lora_rank;
  const int64_t qk = m.qk_head_dim(), latent = m.latent_dim(), vd = m.v_head_dim;
  constexpr float kLowRankNormEps = 1e-6f;  // DeepseekV2RMSNorm's default: q_a / kv_a_layernorm
  // q [T, heads, qk] f32: q_proj, or q_b_proj(q_a_layernorm(q_a_proj(x))).
  if (m.q_lora_rank == 0) {
    MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.q_proj, tokens, heads * qk, hidden, mla_q_));
  } else {
    MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.q_a_proj, tokens, m.q_lora_rank, hidden, mla_a_));
    MB_RETURN_IF_ERROR(gpu::RmsNorm(mla_a_, Tensor(s, layer, lw.q_a_layernorm),
                                    TensorDType(lw.q_a_layernorm), tokens, m.q_lora_rank,
                                    kLowRankNormEps, mla_a_c_, dtype_, compute_));
    MB_RETURN_IF_ERROR(
        Gemm(mla_a_c_, s, layer, lw.q_b_proj, tokens, heads * qk, m.q_lora_rank, mla_q_));
  }
  // The latent rows [c_kv | k_pe] into k_: kv_a_proj_with_mqa, c_kv normed, k_pe rotated.
  const int64_t* positions = positions_[micro_batch];
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.kv_a_proj, tokens, latent, hidden, k_));
  MB_RETURN_IF_ERROR(gpu::RmsNormStrided(k_, latent, Tensor(s, layer, lw.kv_a_layernorm),
                                         TensorDType(lw.kv_a_layernorm), tokens, lora,
                                         kLowRankNormEps, compute_));
  MB_RETURN_IF_ERROR(gpu::MlaRope(k_ + lora, latent, k_ + lora, latent, tokens, 1, rope, positions,
                                  inv_freq_, rope_scaling_, m.rope_interleave, compute_));
  // Each head's q_pe, rotated, into the tail of its absorbed query row [T, heads, latent].
  MB_RETURN_IF_ERROR(gpu::MlaRope(mla_q_ + nope, qk, q_ + lora, latent, tokens, heads, rope,
                                  positions, inv_freq_, rope_scaling_, m.rope_interleave,
                                  compute_));
  // The absorbed q_nope: per head, q_nope[h] [T, nope] times W_UK[h] [nope, lora] (rows
  // [h (nope + v), + nope) of kv_b_proj) into the head's first kv_lora_rank values.
  MB_RETURN_IF_ERROR(gpu::ConvertF32To(mla_q_, tokens * heads * qk, mla_q_c_, dtype_, compute_));
  const auto* kv_b = static_cast<const std::byte*>(Tensor(s, layer, lw.kv_b_proj));
  for (int64_t h = 0; h < heads; ++h) {
    MB_RETURN_IF_ERROR(GemmStrided(static_cast<const std::byte*>(mla_q_c_) + h * qk * elem_,
                                   heads * qk, kv_b + h * (nope + vd) * lora * elem_, lora,
                                   /*w_rows_out=*/false, tokens, lora, nope, q_ + h * latent,
                                   heads * latent));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::MlaValueUp(const std::byte* slot, int64_t layer, int64_t from,
                                    int64_t to) {
  const ModelConfig& c = config();
  const MlaConfig& m = *c.mla;
  const int64_t heads = c.num_attention_heads, lora = m.kv_lora_rank, vd = m.v_head_dim;
  const int64_t nope = m.qk_nope_head_dim, latent = m.latent_dim(), rows = to - from;
  const auto* attn_c = static_cast<const std::byte*>(attn_c_) + from * heads * latent * elem_;
  const auto* kv_b =
      static_cast<const std::byte*>(Tensor(slot, layer, store_.weights().layers[layer].kv_b_proj));
  float* out = mla_v_ + from * heads * vd;
  // Per head: attention output [rows, lora] times W_UV[h]ᵀ, W_UV[h] [v, lora] being rows
  // [h (nope + v) + nope, + v) of kv_b_proj.
  for (int64_t h = 0; h < heads; ++h) {
    MB_RETURN_IF_ERROR(GemmStrided(attn_c + h * latent * elem_, heads * latent,
                                   kv_b + (h * (nope + vd) + nope) * lora * elem_, lora,
                                   /*w_rows_out=*/true, rows, vd, lora, out + h * vd, heads * vd));
  }
  return gpu::ConvertF32To(out, rows * heads * vd,
                           static_cast<std::byte*>(mla_v_c_) + from * heads * vd * elem_, dtype_,
                           compute_);
}

absl::Status CudaDevice::RunTaskB(int micro_batch, int64_t layer, const float* attn,
                                  ForwardStats* stats) {
  const int64_t tokens = TokensOf(micro_batch);
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, layer, tokens));
  const ModelConfig& c = config();
  auto slot = AwaitLayer(layer);
  if (!slot.ok()) return slot.status();
  const std::byte* s = *slot;
  const int64_t hidden = c.hidden_size;
  float* h = h_[micro_batch];
  if (tokens > 0) {
    // The attention output of the rows the CPU attended (all but the prefill segments', which
    // task A applied) to the device on the transfer stream; the compute stream waits for it.
    const int64_t segments = prefill_segments_[micro_batch];
    const int64_t first = segments > 0 ? prefill_first_[micro_batch] : tokens;
    const int64_t last = segments > 0 ? prefill_last_[micro_batch] : tokens;
    const int64_t q_row = c.q_size();
    for (auto [from, to] : {std::pair{int64_t{0}, first}, std::pair{last, tokens}}) {
      if (to <= from) continue;
      MB_RETURN_IF_ERROR(
          CudaError(cudaMemcpyAsync(attn_f_ + from * q_row, attn + from * q_row,
                                    static_cast<size_t>((to - from) * q_row) * sizeof(float),
                                    cudaMemcpyHostToDevice, transfer_),
                    "attention H2D"));
    }
    MB_RETURN_IF_ERROR(CudaError(cudaEventRecord(transferred_, transfer_), "event"));
    MB_RETURN_IF_ERROR(CudaError(cudaStreamWaitEvent(compute_, transferred_, 0), "event wait"));
    MB_RETURN_IF_ERROR(OutputProjection(micro_batch, s, layer, 0, first));
    MB_RETURN_IF_ERROR(OutputProjection(micro_batch, s, layer, last, tokens));
    const LayerWeights& lw = store_.weights().layers[layer];
    MB_RETURN_IF_ERROR(HiddenNorm(c, h, Tensor(s, layer, lw.post_attention_layernorm), dtype_,
                                  tokens, x_, compute_));
    if (lw.router == nullptr) {
      // A dense layer: its FFN over every token, added to the residual (CpuDevice's one expert
      // with weight 1 gives the same f32 sums: 0 + out * 1, then h + that).
      MB_RETURN_IF_ERROR(Ffn(s, layer, lw.experts[0], x_, tokens, expert_out_));
      MB_RETURN_IF_ERROR(gpu::AddResidual(h, expert_out_, tokens * hidden, compute_));
      if (stats != nullptr) {
        stats->expert_token_pairs += tokens;
        stats->experts_touched += 1;
      }
    } else {
      MB_RETURN_IF_ERROR(RoutedExperts(s, layer, lw, tokens, h, stats));
    }
  }
  // The layer's weights are done with once every micro-batch ran its task B.
  MB_RETURN_IF_ERROR(weight_slots_->TaskBDone(layer));
  return CudaError(cudaStreamSynchronize(compute_), "task B");
}

absl::Status CudaDevice::Ffn(const std::byte* slot, int64_t layer, const ExpertWeights& ew,
                             const void* in, int64_t n, float* out) {
  const int64_t hidden = config().hidden_size, width = ew.w1->shape[0];
  MB_RETURN_IF_ERROR(Gemm(in, slot, layer, ew.w1, n, width, hidden, gate_));
  MB_RETURN_IF_ERROR(Gemm(in, slot, layer, ew.w3, n, width, hidden, up_));
  MB_RETURN_IF_ERROR(Activation(gate_, up_, n, width, act_));
  return Gemm(act_, slot, layer, ew.w2, n, hidden, width, out);
}

absl::Status CudaDevice::Activation(const float* gate, const float* up, int64_t rows, int64_t width,
                                    void* act) {
  if (const auto& limit = config().swiglu_limit) {
    return gpu::ClampedSwiglu(gate, up, rows, width, static_cast<float>(*limit), act, dtype_,
                              compute_);
  }
  return gpu::SiluMul(gate, up, GpuDType::kF32, rows, width, act, dtype_, compute_);
}

absl::Status CudaDevice::RoutedExperts(const std::byte* s, int64_t layer, const LayerWeights& lw,
                                       int64_t tokens, float* h, ForwardStats* stats) {
  const ModelConfig& c = config();
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  const int64_t E = c.num_local_experts, top_k = c.num_experts_per_tok;
  MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.router, tokens, E, hidden, router_));
  if (lw.router_linear_bias != nullptr) {  // GptOssTopKRouter: F.linear with bias
    MB_RETURN_IF_ERROR(gpu::AddBias(router_, tokens, E, Tensor(s, layer, lw.router_linear_bias),
                                    TensorDType(lw.router_linear_bias), compute_));
  }
  // DBRX's p-norm (p != 1) divides the top-k weights after the selection, as CpuDevice::TaskB.
  const bool p_norm = c.norm_topk_prob && c.topk_norm_p != 1.0;
  if (c.topk_method != TopkMethod::kSoftmax) {  // DeepSeek's routers
    const float* bias = c.topk_method == TopkMethod::kNoauxTc ? router_bias_ + layer * E : nullptr;
    const gpu::RouterMethod method =
        c.topk_method == TopkMethod::kGreedy               ? gpu::RouterMethod::kGreedy
        : c.topk_method == TopkMethod::kGroupLimitedGreedy ? gpu::RouterMethod::kGroupLimitedGreedy
                                                           : gpu::RouterMethod::kNoauxTc;
    MB_RETURN_IF_ERROR(gpu::RouterDeepseek(
        router_, bias, tokens, E, top_k, method, c.n_group, c.topk_group, c.norm_topk_prob,
        static_cast<float>(c.routed_scaling_factor), ids_, route_w_, compute_));
  } else {
    MB_RETURN_IF_ERROR(gpu::RouterTopK(router_, tokens, E, top_k, ids_, route_w_,
                                       c.norm_topk_prob && !p_norm, compute_));
  }
  if (p_norm) {
    MB_RETURN_IF_ERROR(gpu::NormalizeTopKWeights(route_w_, tokens, top_k,
                                                 static_cast<float>(c.topk_norm_p), compute_));
  }
  MB_RETURN_IF_ERROR(gpu::BuildExpertPermutation(ids_, tokens, top_k, E, offsets_, sorted_token_,
                                                 slot_of_, compute_));
  MB_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(host_offsets_.data(), offsets_, (E + 1) * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, compute_),
                "expert offsets D2H"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(compute_), "router"));
  const int64_t rows = host_offsets_[E];
  MB_RETURN_IF_ERROR(
      gpu::GatherRows(x_, dtype_, tokens, hidden, sorted_token_, rows, expert_in_, compute_));
  const auto* in = static_cast<const std::byte*>(expert_in_);
  auto* act = static_cast<std::byte*>(act_);
  // gpt-oss's expert biases: gate_up_proj_bias [E, 2 ffn] (gate at even, up at odd positions)
  // and down_proj_bias [E, hidden], added to each expert's GEMM outputs (GptOssExperts.forward).
  const auto* gate_up_bias =
      static_cast<const std::byte*>(Tensor(s, layer, lw.experts_gate_up_bias));
  const auto* down_bias = static_cast<const std::byte*>(Tensor(s, layer, lw.experts_down_bias));
  const size_t bias_elem = gate_up_bias != nullptr ? DTypeSize(*lw.experts_gate_up_bias->dtype) : 0;
  int64_t touched = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets_[e], n = host_offsets_[e + 1] - r0;
    if (n == 0) continue;
    ++touched;
    const void* x = in + r0 * hidden * elem_;
    const ExpertWeights& ew = lw.experts[e];
    MB_RETURN_IF_ERROR(Gemm(x, s, layer, ew.w1, n, ffn, hidden, gate_ + r0 * ffn));
    MB_RETURN_IF_ERROR(Gemm(x, s, layer, ew.w3, n, ffn, hidden, up_ + r0 * ffn));
    if (gate_up_bias != nullptr) {
      const std::byte* b = gate_up_bias + e * 2 * ffn * bias_elem;
      const GpuDType t = TensorDType(lw.experts_gate_up_bias);
      MB_RETURN_IF_ERROR(gpu::AddBiasStrided(gate_ + r0 * ffn, n, ffn, b, t, 2, compute_));
      MB_RETURN_IF_ERROR(
          gpu::AddBiasStrided(up_ + r0 * ffn, n, ffn, b + bias_elem, t, 2, compute_));
    }
  }
  MB_RETURN_IF_ERROR(Activation(gate_, up_, rows, ffn, act_));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets_[e], n = host_offsets_[e + 1] - r0;
    if (n == 0) continue;
    MB_RETURN_IF_ERROR(Gemm(act + r0 * ffn * elem_, s, layer, lw.experts[e].w2, n, hidden, ffn,
                            expert_out_ + r0 * hidden));
    if (down_bias != nullptr) {
      MB_RETURN_IF_ERROR(
          gpu::AddBias(expert_out_ + r0 * hidden, n, hidden,
                       down_bias + e * hidden * DTypeSize(*lw.experts_down_bias->dtype),
                       TensorDType(lw.experts_down_bias), compute_));
    }
  }
  // The shared expert over every token after the routed experts (it reuses their gate/up/act
  // buffers): Qwen2-MoE's scaled by sigmoid(x · shared_expert_gate), DeepSeek's as it is.
  const float* shared = nullptr;
  if (lw.shared_expert.w1 != nullptr) {
    MB_RETURN_IF_ERROR(Ffn(s, layer, lw.shared_expert, x_, tokens, shared_out_));
    shared = shared_out_;
  }
  if (shared != nullptr && lw.shared_expert_gate != nullptr) {
    MB_RETURN_IF_ERROR(Gemm(x_, s, layer, lw.shared_expert_gate, tokens, 1, hidden, shared_gate_));
    MB_RETURN_IF_ERROR(gpu::ScaleBySigmoid(shared_out_, tokens, hidden, shared_gate_, compute_));
  }
  MB_RETURN_IF_ERROR(gpu::CombineExperts(expert_out_, slot_of_, ids_, route_w_, tokens, top_k,
                                         hidden, h, shared, compute_));
  if (stats != nullptr) {
    stats->expert_token_pairs += rows;
    stats->experts_touched += touched;
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::LmHead(int micro_batch, const int64_t* rows, int64_t n) {
  const int64_t tokens = TokensOf(micro_batch);
  MB_RETURN_IF_ERROR(CheckCall(micro_batch, 0, tokens));
  const ModelConfig& c = config();
  if (n < 1 || n > tokens) {  // the row buffers hold the micro-batch's tokens
    return absl::InvalidArgumentError(
        absl::StrCat("logits: ", n, " rows of a micro-batch of ", tokens, " tokens"));
  }
  std::vector<int32_t> host_rows(n);
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits row ", rows[i], " outside the micro-batch's ", tokens, " tokens"));
    }
    host_rows[i] = static_cast<int32_t>(rows[i]);
  }
  MB_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(rows_, host_rows.data(), n * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, compute_),
                               "rows H2D"));
  // The rows' hidden states (f32) into proj_, normed into x_ (compute dtype), then lm_head.
  MB_RETURN_IF_ERROR(gpu::GatherRows(h_[micro_batch], GpuDType::kF32, tokens, c.hidden_size, rows_,
                                     n, proj_, compute_));
  MB_RETURN_IF_ERROR(HiddenNorm(c, proj_, final_norm_, dtype_, n, x_, compute_));
  return Gemm(x_, lm_head_, n, c.vocab_size, c.hidden_size, logits_);
}

absl::Status CudaDevice::RunLogits(int micro_batch, const int64_t* rows, int64_t n, float* logits) {
  if (n == 0) return CheckCall(micro_batch, 0, 0);
  MB_RETURN_IF_ERROR(LmHead(micro_batch, rows, n));
  MB_RETURN_IF_ERROR(CudaError(
      cudaMemcpyAsync(logits, logits_, static_cast<size_t>(n * config().vocab_size) * sizeof(float),
                      cudaMemcpyDeviceToHost, compute_),
      "logits D2H"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(compute_), "logits"));
  return CheckGuards();
}

absl::Status CudaDevice::RunGreedyTokens(int micro_batch, const int64_t* rows, int64_t n,
                                         int32_t* token_ids) {
  if (n == 0) return CheckCall(micro_batch, 0, 0);
  MB_RETURN_IF_ERROR(LmHead(micro_batch, rows, n));
  // The argmax into the top-k ids buffer ([T k] int32, free between passes' task B).
  MB_RETURN_IF_ERROR(gpu::ArgmaxRows(logits_, n, config().vocab_size, ids_, compute_));
  MB_RETURN_IF_ERROR(CudaError(
      cudaMemcpyAsync(token_ids, ids_, n * sizeof(int32_t), cudaMemcpyDeviceToHost, compute_),
      "greedy tokens D2H"));
  MB_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(compute_), "greedy tokens"));
  return CheckGuards();
}

}  // namespace cuda_device_internal
}  // namespace moebatch
