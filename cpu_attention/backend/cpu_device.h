// The cpu backend's Device (engine/device.h): tasks A and B of the forward pass on the CPU, for
// every family of engine/model/family.h (Mixtral's below; the others' differences after it),
// for runs without a GPU and as the reference other backends are checked against. Each step is a
// call of a cpu op (cpu_attention/ops/ops.h, the CUDA kernels' oracle) or a GEMM
// (cpu_attention/gemm/matmul.h): nothing is computed inline here.
//
// Follows transformers' modeling_mixtral.py (MixtralForCausalLM, 4.x) op for op:
//   h = embed_tokens[ids]
//   task A:  x = RMSNorm(h)                      (MixtralRMSNorm: fp32 variance, w * x)
//            q, k, v = x Wqᵀ, x Wkᵀ, x Wvᵀ; RoPE(q, k)   (rotate_half, inv_freq from rope_theta)
//   task B:  h = h + attn Woᵀ
//            x = RMSNorm(h); router: softmax(x Wgᵀ) in fp32 -> top-k -> renormalise
//            h = h + sum_{e in top-k} w_e * W2_e (silu(W1_e x) * W3_e x) (MixtralSparseMoeBlock)
//   logits = RMSNorm(h) lm_headᵀ
// The other families (engine/model/family.h): biases after the q/k/v (Qwen2) and o projections
// (AddBias); q and k clamped (OLMoE's clip_qkv, ClampAbs) and normalised before RoPE, per head
// (Qwen3: RmsNorm over rows of head_dim) or per projection (OLMoE); RoPE with the config's scaling
// (llama3, yarn: ComputeRope's inv_freq and attention factor); routing weights not renormalised
// without norm_topk_prob; a dense layer's FFN as one expert of weight 1 without a router;
// Qwen2-MoE's shared expert (its FFN over every token, ScaleBySigmoid by its gate) added to the
// routed sum in CombineExperts; DBRX's LayerNorm without bias in place of each RmsNorm of h
// (config.norm), and its top-k weights divided by their p-norm (NormalizeTopKWeights, p != 1);
// gpt-oss's router bias (AddBias on the router logits), expert biases (AddBias after each expert
// GEMM; gate_up_proj_bias de-interleaved into gate and up halves at Create) and clamped SwiGLU
// (ClampedSwiglu in place of SiluMul), and its attention sinks (AttentionSinks, which the runner's
// CPU attention adds to each head's softmax denominator); a Hugging Face checkpoint's MXFP4
// experts (config.mxfp4_experts) multiplied by InvariantLinearMxfp4 (weights widened exactly, f32
// activations: transformers' math) where a GGUF file's quantized weights take QuantLinear's int8
// activations (llama.cpp's), but Q8_0 weights with q8_0_f32_activations, which take
// InvariantLinearQ8_0 (widened exactly: the dequantized model's math). The ops, in order:
// EmbeddingGather; task A: RmsNorm, 3 GEMMs, ApplyRope (q, then k); task B: GEMM, AddResidual,
// RmsNorm, router GEMM, RouterTopK, BuildExpertPermutation, then per expert with tokens (in id
// order) GatherRows, w1 and w3 GEMMs, SiluMul, w2 GEMM into the expert's rows, and CombineExperts
// (the experts' weighted sum in expert id order, then the residual add); logits: RmsNorm per row,
// lm_head GEMM.
//
// Threading: one thread at a time (Device's rule); each call parallelises inside with OpenMP and
// oneDNN. The weights (a Checkpoint's mapping or a WeightStore's host regions) must outlive the
// device: it reads them in place.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cpu_attention/gemm/matmul.h"
#include "engine/device.h"
#include "engine/model/checkpoint.h"

namespace moebatch {

struct CpuDeviceOptions {
  // f32 (reference) or bf16; f16 is the reference for the cuda backend's T4 path
  // (cpu_attention/gemm/matmul.h)
  DType compute_dtype = DType::kF32;
  // f32 mode, oneDNN path: bytes of f32 weight copies kept between passes (see
  // cpu_attention/gemm/matmul.h). 0 = convert on every use.
  int64_t widened_weight_budget_bytes = 0;
  // Fixed-order matmuls whose per-row results do not depend on the batch
  // (cpu_attention/gemm/matmul.h, cpu_attention/gemm/invariant_linear.h); false: each matmul's
  // faster path for its size.
  bool batch_invariant = true;
  // A Hugging Face checkpoint's MXFP4 experts (ModelConfig::mxfp4_experts) through
  // InvariantLinearMxfp4 (weights widened exactly, f32 activations: transformers' math); false:
  // QuantLinear's int8 activations, as a GGUF file's quantized weights.
  bool mxfp4_f32_activations = true;
  // Q8_0 weights (a GGUF file's, or the load-time int8 store) through InvariantLinearQ8_0 (widened
  // exactly, f32 activations: the dequantized model's math, InvariantLinear's fixed order); false:
  // QuantLinear's int8 activations (llama.cpp's method). The engine's default is the host's,
  // DefaultQ8_0F32Activations().
  bool q8_0_f32_activations = false;
};

// The faster Q8_0 path of this host (--q8_0_activations=auto), for SelectedCpuIsa(): int8
// activations (false) where QuantLinear runs its AVX-512 VNNI kernels (QuantLinearUsesVnni), f32
// (true) elsewhere. Without VNNI the int8 dot products are no faster per product than f32 FMAs, so
// the widened weights run faster at prefill sizes (Zen 3, 2 threads: 1.2-1.5x from 64 rows a GEMM)
// and slower at decode sizes (1.2-1.4x at 1 row, up to 1.3x at 8-16), and whole jobs gain
// (docs/performance.md, "The weights prefetched one block ahead, and Q8_0's activations chosen
// per host"). Thread-safe; MOEBATCH_CPU_ISA, read once, can force a level (cpu_isa.h).
bool DefaultQ8_0F32Activations();

class CpuDevice final : public Device {
 public:
  // `weights` must hold every tensor of `config` (Checkpoint::Load or WeightStore checked them).
  static absl::StatusOr<std::unique_ptr<CpuDevice>> Create(const ModelConfig& config,
                                                           const ModelWeights& weights,
                                                           const CpuDeviceOptions& options);
  ~CpuDevice() override;

  const char* name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }
  absl::Status Embed(int micro_batch, const int32_t* token_ids, const int64_t* positions,
                     int64_t tokens) override;
  absl::Status TaskA(int micro_batch, int64_t layer, float* q, float* k, float* v,
                     float* attn) override;
  absl::Status TaskB(int micro_batch, int64_t layer, const float* attn,
                     ForwardStats* stats) override;
  absl::Status Logits(int micro_batch, const int64_t* rows, int64_t n, float* logits) override;
  const float* AttentionSinks(int64_t layer) const override {
    return layer >= 0 && layer < static_cast<int64_t>(small_.size()) && !small_[layer].sinks.empty()
               ? small_[layer].sinks.data()
               : nullptr;
  }

  // The GEMMs of bf16/f16/f32 weights (quantized ones take cpu_attention/gemm/quant_linear.h).
  const Matmul& matmul() const { return *matmul_; }

 private:
  struct MicroBatch {
    int64_t tokens = 0;
    std::vector<float> h;  // [tokens, hidden]
    std::vector<int64_t> positions;
  };
  CpuDevice(const ModelConfig& config, const ModelWeights& weights, std::unique_ptr<Matmul> matmul);
  absl::StatusOr<MicroBatch*> Get(int micro_batch, int64_t layer);
  absl::Status Linear(const float* x, int64_t rows, const TensorInfo& w, float* y);
  absl::Status Linear(const std::vector<float>& x, int64_t rows, const TensorInfo& w,
                      std::vector<float>* y);

  ModelConfig config_;
  const ModelWeights& weights_;
  std::unique_ptr<Matmul> matmul_;
  bool mxfp4_f32_activations_ = true;  // CpuDeviceOptions::mxfp4_f32_activations
  bool q8_0_f32_activations_ = false;  // CpuDeviceOptions::q8_0_f32_activations
  MicroBatch micro_batches_[kMaxMicroBatches];
  // Per layer, widened to f32 at Create: the norms, and the biases and q/k norms a family has
  // (empty when it has none).
  struct SmallTensors {
    std::vector<float> input_norm, post_norm;  // [hidden]
    std::vector<float> q_bias, k_bias, v_bias, o_bias;
    std::vector<float> q_norm, k_norm;
    std::vector<float> sinks;        // [heads] (gpt-oss)
    std::vector<float> router_bias;  // [experts] (gpt-oss's router Linear bias)
    // gpt-oss's expert biases: gate [experts, inter] and up [experts, inter] (gate_up_proj_bias's
    // even and odd elements), down [experts, hidden].
    std::vector<float> expert_gate_bias, expert_up_bias, expert_down_bias;
  };
  std::vector<SmallTensors> small_;
  std::vector<float> final_norm_;
  RopeTable rope_;  // inv_freq [head_dim / 2] and the attention factor
  // A layer's FFN: `n` rows of expert_in_ through `ew` into `out` [n, hidden]; with `bias`
  // (gpt-oss: expert e of layer `small`) each GEMM's bias is added and the SwiGLU is clamped.
  absl::Status Ffn(const ExpertWeights& ew, int64_t n, float* out,
                   const SmallTensors* bias = nullptr, int64_t e = 0);
  // out [rows, hidden] f32 = the config's norm (RMSNorm or LayerNorm) of in [rows, hidden] f32
  // with `weight` [hidden] f32.
  absl::Status Norm(const float* in, const std::vector<float>& weight, int64_t rows, float* out);
  // Scratch, shared by the micro-batches and reused across passes.
  std::vector<float> x_, proj_, router_;
  std::vector<int32_t> expert_ids_, expert_offsets_, sorted_token_, slot_of_;  // routing
  std::vector<float> expert_weights_;                                          // [tokens, top_k]
  std::vector<float> expert_in_, gate_, up_;                                   // one expert's rows
  std::vector<float> expert_out_;                // [tokens * top_k, hidden], row = slot
  std::vector<float> shared_out_, shared_gate_;  // the shared expert's [tokens, hidden], [tokens]

  // Multi-head latent attention (config.mla: DeepSeek-V2 / V3), in cpu_device_mla.cc; the
  // absorbed form of cpu_attention/ops/deepseek_ops.h.
  struct MlaLayer {
    std::vector<float> q_a_norm, kv_a_norm;  // [q_lora_rank] (empty without), [kv_lora_rank]
    // W_UK transposed: [heads][kv_lora_rank][qk_nope_head_dim] in kv_b_proj's dtype (an exact
    // copy of its elements).
    std::vector<std::byte> w_uk_t;
  };
  std::vector<MlaLayer> mla_;
  std::vector<std::vector<float>> router_bias_;  // noaux_tc: [experts] per MoE layer, f32
  absl::Status PrepareMla();
  // Task A under MLA: q [tokens, heads, latent] (absorbed), k = v [tokens, latent] (the latent
  // row [c_kv | k_pe]).
  absl::Status TaskAMla(MicroBatch& mb, int64_t layer, float* q, float* k, float* v);
  // attn [tokens, heads, latent] -> out [tokens, heads * v_head_dim]: head h's first
  // kv_lora_rank values times W_UV[h]ᵀ (the input of o_proj).
  absl::Status MlaValueUp(int64_t layer, int64_t tokens, const float* attn, float* out);
  std::vector<float> mla_q_, mla_kv_, mla_a_, mla_b_, mla_v_;  // MLA scratch
};

}  // namespace moebatch
