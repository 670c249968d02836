// CUDA kernels of the GPU tasks of one forward pass (MoE-Lens §6.4), cuBLAS GEMMs excepted:
//   task A: RMSNorm, RoPE, prefill attention, and for the families q/k/v biases, q/k norms (RMSNorm
//           again) and clip_qkv (ClampAbs); DeepSeek's multi-head latent attention (MlaRope,
//           PrefillAttentionLatent);
//   task B: router softmax / top-k (DeepSeek's routers), permutation of tokens by expert, SiLU-mul
//   (gpt-oss's clamped
//           SwiGLU), weighted combine (with Qwen2-MoE's shared expert, ScaleBySigmoid), residual
//           adds, o_proj, router and expert biases;
// plus the embedding gather and dtype conversions, and the dequantization of weights kept in
// ggml's block formats (cuda/kernels_quant.cu).
//
// The math is the cpu backend's: each kernel has a cpu op of the same name and semantics
// (cpu_attention/ops/ops.h, the steps of CpuDevice), which follows Hugging Face transformers'
// models/mixtral/modeling_mixtral.py (and modeling_qwen2_moe.py, modeling_qwen3_moe.py,
// modeling_olmoe.py, modeling_llama.py, modeling_dbrx.py, modeling_gpt_oss.py for what the families
// add); each function names the transformers code it implements.
// tests/cuda/test_backend_ops*.cc check every kernel against its cpu op on random shapes and
// dtypes; tests/cuda/test_cuda_kernels_task_a.cc and _task_b.cc what is particular to the kernels
// (launch limits, ties).
//
// Conventions, for every function below:
// - Pointers are device memory; tensors are dense and row-major, shapes written [rows, cols].
// - The hidden state h is f32 on the GPU. GEMM inputs are in the compute dtype: bf16 (sm_80+) or
//   f16 (sm_75, T4). `const void*` / `void*` tensors are typed by the GpuDType argument next to
//   them. All arithmetic is f32 (float accumulators, no fast-math intrinsics).
// - Each call enqueues its work on `stream` and returns without waiting. InvalidArgument when a
//   size is out of range or a pointer is null with a non-zero size (nothing is launched); Internal
//   when the launch fails (cudaGetLastError, which also reports earlier asynchronous failures).
//   Errors inside a kernel surface at the caller's next synchronisation. Zero rows: OK, nothing
//   launched (except BuildExpertPermutation, which still zeroes the expert offsets).
// - Thread-safe: the functions keep no state; ordering is the stream's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/ggml_type.h"

namespace moebatch::gpu {

// Element type of a device tensor: f16 = __half, bf16 = __nv_bfloat16, f32 = float.
enum class GpuDType : uint8_t { kF16, kBF16, kF32 };

// Bytes per element.
constexpr size_t GpuDTypeSize(GpuDType t) { return t == GpuDType::kF32 ? 4 : 2; }

// Largest router width RouterTopK accepts (Mixtral has 8 experts, OLMoE 64, Qwen3-30B-A3B 128).
inline constexpr int64_t kMaxRouterExperts = 256;
// Largest expert count BuildExpertPermutation accepts.
inline constexpr int64_t kMaxPermutationExperts = 256;
// Largest top_k CombineExperts accepts.
inline constexpr int64_t kMaxCombineTopK = 64;
// Largest head_dim PrefillAttention and PrefillAttentionLatent accept (DeepSeek's latent rows:
// 576).
inline constexpr int64_t kMaxAttentionHeadDim = 1024;
// Largest n_group RouterDeepseek accepts (DeepSeek-V3: 8).
inline constexpr int64_t kMaxRouterGroups = 64;
// MlaRope keeps a token's (heads + 1) * d values in shared memory: at most this many (48 KiB).
inline constexpr int64_t kMaxMlaRopeValues = 12288;

// DeepSeek's routing methods (ModelConfig's TopkMethod but kSoftmax, which RouterTopK computes).
enum class RouterMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };

// --- Embedding -----------------------------------------------------------------------------------

// h[t] = f32(table[token_ids[t]]): MixtralModel.embed_tokens (nn.Embedding) then the f32 hidden
// state. table [vocab, hidden] in table_dtype; token_ids [tokens] int32; h [tokens, hidden] f32.
// Ids outside [0, vocab) (which callers validate first, like CpuDevice::Embed) give a zero row
// rather than an out-of-bounds read.
absl::Status EmbeddingGather(const void* table, GpuDType table_dtype, int64_t vocab, int64_t hidden,
                             const int32_t* token_ids, int64_t tokens, float* h,
                             cudaStream_t stream);

// --- Quantized weights --------------------------------------------------------------------------

// Whether DequantizeRows decodes ggml type `type`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K
// and MXFP4 (the block types engine/model/ggml_quants.h decodes; F32/F16/BF16 tensors are stored
// as floats and never come here).
bool GpuDequantizes(GgmlType type);

// dst = the weights of `rows` rows of `cols` elements stored as ggml blocks of `type` at src (each
// row cols / block_size blocks, rows back to back: a WeightStore or GGUF tensor, or rows gathered
// from one), each element computed as engine/model/ggml_quants.cc's DequantizeRow computes it
// (ggml-quants.c's dequantize_row_<type>, the same f32 operations in the same order, nothing
// contracted into an FMA: bit-equal to DequantizeRow in f32) and rounded once to dst_dtype (to
// nearest even). src: rows * cols / block_size * type_size bytes, any alignment; dst [rows, cols]
// in dst_dtype, 16-byte aligned: the compute dtype for a GEMM's weight, f32 for embedding rows.
// InvalidArgument for a type GpuDequantizes refuses, cols not a positive multiple of its block
// size, rows < 0, rows * cols > 2^62 or a dst not 16-byte aligned. One thread per 8 elements.
absl::Status DequantizeRows(const void* src, GgmlType type, int64_t rows, int64_t cols, void* dst,
                            GpuDType dst_dtype, cudaStream_t stream);

// --- Task A --------------------------------------------------------------------------------------

// MixtralRMSNorm.forward: out = weight * (x * 1/sqrt(mean(x^2) + eps)) per row, the mean in f32
// (a block reduction per row; the CPU sums in order, so results differ by rounding only).
// in [rows, n] f32; weight [n] in weight_dtype; out [rows, n] in out_dtype (f32 for the residual
// path, the compute dtype for a GEMM input). out may be `in` when out_dtype is f32. eps is used as
// f32, as on the CPU (static_cast<float>(config.rms_norm_eps)).
absl::Status RmsNorm(const float* in, const void* weight, GpuDType weight_dtype, int64_t rows,
                     int64_t n, float eps, void* out, GpuDType out_dtype, cudaStream_t stream);

// RmsNorm in place on f32 rows `stride` elements apart, each row's first n values (MLA's
// kv_a_layernorm over the c_kv part of [c_kv | k_pe] rows). stride >= n; otherwise as RmsNorm.
absl::Status RmsNormStrided(float* x, int64_t stride, const void* weight, GpuDType weight_dtype,
                            int64_t rows, int64_t n, float eps, cudaStream_t stream);

// nn.LayerNorm(n, bias=False).forward (DBRX): out = weight * ((x - mean) * 1/sqrt(var + eps)) per
// row, mean and biased variance in f32 by block reductions (two passes, as the CPU's LayerNorm,
// whose in-order sums differ by rounding only). Shapes, dtypes, aliasing and eps as RmsNorm's.
absl::Status LayerNorm(const float* in, const void* weight, GpuDType weight_dtype, int64_t rows,
                       int64_t n, float eps, void* out, GpuDType out_dtype, cudaStream_t stream);

// apply_rotary_pos_emb with rotate_half (cos/sin of MixtralRotaryEmbedding, default rope type), in
// place on x [tokens, heads, d] f32; call once for q (heads = num_attention_heads) and once for k
// (heads = num_key_value_heads). positions [tokens] int64 (absolute positions); inv_freq [d/2] f32
// (1 / theta^(2i/d), as CpuDevice::Create computes it). For i < d/2, with
// f = float(pos) * inv_freq[i], c = cosf(f) * attention_scaling, s = sinf(f) * attention_scaling
// (accurate f32 cosf/sinf, not __cosf; attention_scaling is 1 but for yarn, ComputeRope's):
//   y[i] = x[i] c - x[i + d/2] s,   y[i + d/2] = x[i + d/2] c + x[i] s,
// each product and sum rounded separately (no FMA), like the CPU; CUDA's cosf/sinf are within 2 ulp
// of glibc's, so a result may differ from the CPU's in the last bit. d even, 2 <= d <= 1024.
absl::Status ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t d, const int64_t* positions,
                       const float* inv_freq, float attention_scaling, cudaStream_t stream);

// cpu_ops::MlaRope on the GPU: RoPE of multi-head latent attention's decoupled part (DeepSeek-V2's
// apply_rotary_emb, V3's apply_rotary_pos_emb_interleave, or rotate_half without
// rope_interleave), `heads` vectors of d values per token read at in + (t * heads + h) *
// in_stride and written rotated at out + (t * heads + h) * out_stride; with interleave the pairs
// (2i, 2i + 1) are rotated and stored at (i, i + d/2). cos and sin as ApplyRope's (accurate
// cosf/sinf times attention_scaling, each product and sum rounded separately). out may be in
// (same stride) or another buffer (task A writes q_pe into the absorbed query rows this way).
// positions [tokens] int64; inv_freq [d / 2] f32. d even, (heads + 1) * d <= kMaxMlaRopeValues,
// strides >= d. One block per token.
absl::Status MlaRope(const float* in, int64_t in_stride, float* out, int64_t out_stride,
                     int64_t tokens, int64_t heads, int64_t d, const int64_t* positions,
                     const float* inv_freq, float attention_scaling, bool interleave,
                     cudaStream_t stream);

// Causal self-attention of variable-length prefill sequences whose whole context is in this call
// (MixtralAttention.forward with eager_attention_forward: repeat_kv for GQA, causal and sliding
// window masks, softmax in f32). q [tokens, heads, d], k and v [tokens, kv_heads, d], out [tokens,
// heads, d], all f32. cu_seqlens [num_seqs + 1] int32, non-decreasing: sequence s is rows
// [cu_seqlens[s], cu_seqlens[s + 1]) at positions 0, 1, ... within it; rows outside every
// sequence are left untouched. Query head h reads kv head h / (heads / kv_heads). Query i sees
// key j of its sequence iff j <= i and (sliding_window == 0 or i - sliding_window < j) (positions
// within the sequence; the same set as cpu_attention's max(0, p - window + 1) <= j <= p).
// scale: usually 1/sqrt(d). heads a multiple of kv_heads; 1 <= d <= 256; sliding_window >= 0.
// sinks: [heads] f32 learned sink logits in the scaled scores' units (gpt-oss's
// GptOssAttention.sinks: one more logit per head in the softmax's denominator, with no value;
// eager_attention_forward in modeling_gpt_oss.py), normalised as cpu_attention's
// SoftmaxNormalizer does; null for none.
//
// This is the correctness-first kernel: one 128-thread block per (query row, head), keys in tiles
// of 64 (scores and probabilities in shared memory, one warp per key for q.k), an online softmax
// across tiles in f32. It reads K/V once per query and has no tensor cores: O(len^2) memory
// traffic per head. A FlashAttention-style kernel (query tiles, MMA) replaces it when it shows up
// in the profile; it is checked against this one.
absl::Status PrefillAttention(const float* q, const float* k, const float* v,
                              const int32_t* cu_seqlens, int64_t num_seqs, int64_t tokens,
                              int64_t heads, int64_t kv_heads, int64_t d, float scale,
                              int64_t sliding_window, const float* sinks, float* out,
                              cudaStream_t stream);

// Multi-head latent attention over the prefill segments in its absorbed form
// (cpu_attention/ops/deepseek_ops.h): MQA whose one KV head is the latent row [c_kv | k_pe] of
// each token, key and value at once, the value being its first value_dim (kv_lora_rank) values.
// q [tokens, heads, d] (the absorbed queries [W_UK[h]ᵀ q_nope | q_pe]); latent [tokens, d]; out
// [tokens, heads, d]: per head the first value_dim values of sum_j p_j latent_j, the rest 0 (as
// the CPU's attention over an MLA cache). The causal masks, online softmax and arithmetic of
// PrefillAttention with kv_heads 1, v = latent and no window or sinks; scale: MLA's
// softmax_scale. 1 <= value_dim <= d <= kMaxAttentionHeadDim.
absl::Status PrefillAttentionLatent(const float* q, const float* latent, const int32_t* cu_seqlens,
                                    int64_t num_seqs, int64_t tokens, int64_t heads, int64_t d,
                                    int64_t value_dim, float scale, float* out,
                                    cudaStream_t stream);

// --- Task B --------------------------------------------------------------------------------------

// The router of MixtralSparseMoeBlock.forward: routing_weights = softmax(router_logits) in f32
// (max subtracted, sum in expert order); the top_k experts by probability, ties to the lower expert
// id, in descending probability order; weights renormalised to sum 1 over the top-k (sum taken in
// that order), as CpuDevice::TaskB; with renormalize false the weights are the top-k probabilities
// as they are (Qwen-MoE and OLMoE without norm_topk_prob). logits [tokens, experts] f32; ids
// [tokens, top_k] int32; weights [tokens, top_k] f32. 1 <= experts <= 256, 1 <= top_k <=
// min(experts, 64). One thread per token.
absl::Status RouterTopK(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                        int32_t* ids, float* weights, bool renormalize, cudaStream_t stream);

// DeepSeek's routers, as cpu_ops::RouterDeepseek (cpu_attention/ops/deepseek_ops.h: its
// semantics, tie rules and order of operations): greedy and group_limited_greedy (softmax scores;
// groups ranked by their max) and noaux_tc (sigmoid scores plus bias, the correction bias
// [experts] f32, device memory; groups ranked by the sum of their two largest). weights = the
// chosen scores, renormalised by their sum (+ 1e-20 for noaux_tc) with `renormalize`, times
// scaling (routed_scaling_factor). logits [tokens, experts] f32; ids [tokens, top_k] int32, in
// descending choice order; weights [tokens, top_k] f32. experts <= kMaxRouterExperts, a
// multiple of n_group <= kMaxRouterGroups; 1 <= topk_group <= n_group; 1 <= top_k <=
// min(kMaxCombineTopK, topk_group * experts / n_group). bias is read for kNoauxTc only (null
// otherwise). One thread per token.
absl::Status RouterDeepseek(const float* logits, const float* bias, int64_t tokens, int64_t experts,
                            int64_t top_k, RouterMethod method, int64_t n_group, int64_t topk_group,
                            bool renormalize, float scaling, int32_t* ids, float* weights,
                            cudaStream_t stream);

// DbrxRouter's p-norm renormalisation (p != 1) of RouterTopK's weights taken without
// renormalize, as cpu_ops::NormalizeTopKWeights: s = sum of |w|^p in choice order (w * w for
// p = 2), each w / (sqrtf(s) for p = 2, else powf(s, 1 / p)). weights [tokens, top_k] f32 in
// place; p > 0. One thread per token.
absl::Status NormalizeTopKWeights(float* weights, int64_t tokens, int64_t top_k, float p,
                                  cudaStream_t stream);

// Sorts the (token, choice) pairs by expert, replacing MixtralSparseMoeBlock's one_hot expert_mask
// and `torch.where(expert_mask[expert_idx])`: expert e owns rows [expert_offsets[e],
// expert_offsets[e + 1]) of the expert-sorted buffer, in increasing token order. Deterministic (a
// single-block counting sort: per-warp ranks by __match_any_sync, no atomics order dependence);
// meant for tokens * top_k up to a few 10^4 pairs.
// ids [tokens, top_k] int32 (RouterTopK's; a token names an expert at most once);
// expert_offsets [experts + 1] int32, the exclusive prefix sum of the per-expert counts (copying it
// to the host, for the per-expert GEMM sizes, is the caller's business); sorted_token
// [tokens * top_k] int32: the token each sorted row comes from; slot_of [tokens, top_k] int32: the
// sorted row of each (token, choice). An id outside [0, experts) gets slot_of = -1 and no row (then
// expert_offsets[experts] < tokens * top_k). 1 <= experts <= 256; tokens * top_k < 2^31.
absl::Status BuildExpertPermutation(const int32_t* ids, int64_t tokens, int64_t top_k,
                                    int64_t experts, int32_t* expert_offsets, int32_t* sorted_token,
                                    int32_t* slot_of, cudaStream_t stream);

// dst[r] = src[row_index[r]]: the expert-input buffer (`hidden_states[None, top_x]` in
// MixtralSparseMoeBlock.forward) when row_index is BuildExpertPermutation's sorted_token.
// src [src_rows, n] and dst [rows, n] in dtype (a copy, no conversion); row_index [rows] int32. An
// index outside [0, src_rows) gives a zero row.
absl::Status GatherRows(const void* src, GpuDType dtype, int64_t src_rows, int64_t n,
                        const int32_t* row_index, int64_t rows, void* dst, cudaStream_t stream);

// MixtralBlockSparseTop2MLP.forward's act_fn(w1(x)) * w3(x) with act_fn = SiLU:
// out = gate / (1 + expf(-gate)) * up, in f32, rounded once to out_dtype. gate and up [rows, inter]
// in in_dtype (the w1 and w3 GEMM outputs); out [rows, inter] in out_dtype (the compute dtype, the
// w2 GEMM input). out may be gate or up when out_dtype == in_dtype.
absl::Status SiluMul(const void* gate, const void* up, GpuDType in_dtype, int64_t rows,
                     int64_t inter, void* out, GpuDType out_dtype, cudaStream_t stream);

// GptOssExperts.forward's clamped SwiGLU, as cpu_ops::ClampedSwiglu: g = min(gate, limit),
// u = clamp(up, -limit, limit), out = (u + 1) * (g * sigmoid(1.702 g)), the sigmoid
// 1 / (1 + expf(-(g * 1.702))), each product and sum rounded separately in f32, then rounded once
// to out_dtype. gate and up [rows, inter] f32 (the gate and up GEMM outputs with their biases); out
// [rows, inter] in out_dtype (the compute dtype, the down GEMM input; may be gate when f32).
// limit > 0 and finite.
absl::Status ClampedSwiglu(const float* gate, const float* up, int64_t rows, int64_t inter,
                           float limit, void* out, GpuDType out_dtype, cudaStream_t stream);

// The end of MixtralSparseMoeBlock.forward (expert output * routing weight, index_add_ into
// final_hidden_states) and the residual add of MixtralDecoderLayer.forward, in the CPU's order:
// for each token, moe = 0.0f, then moe += expert_out[slot] * weight over its choices taken in
// increasing expert id order, then (with `shared`, Qwen2-MoE's gated shared expert output
// [tokens, hidden] f32) moe += shared[t], then h += moe (products and sums rounded separately, no
// FMA, so the f32 result equals CpuDevice::TaskB's when expert_out and the weights do; the weights
// come through expf, within 2 ulp of the CPU's). No atomics: one block per token.
// expert_out [tokens * top_k, hidden] f32, row = slot (the w2 GEMM output over the sorted buffer);
// slot_of, ids [tokens, top_k] int32 (BuildExpertPermutation's, RouterTopK's); weights
// [tokens, top_k] f32; h [tokens, hidden] f32, updated; shared may be null. A slot outside
// [0, tokens * top_k) is skipped. 1 <= top_k <= 64.
absl::Status CombineExperts(const float* expert_out, const int32_t* slot_of, const int32_t* ids,
                            const float* weights, int64_t tokens, int64_t top_k, int64_t hidden,
                            float* h, const float* shared, cudaStream_t stream);

// --- Greedy decoding -----------------------------------------------------------------------------

// torch.argmax(logits, dim=-1), as Sampler's greedy path (std::max_element): ids[r] = the index of
// the largest of x[r, 0..n), the first maximum winning (ties go to the lower index); -1 for a row
// that holds a NaN or an infinity. x [rows, n] f32, ids [rows] int32;
// 1 <= n < 2^31. One block per row, so the result does not depend on how many rows there are.
absl::Status ArgmaxRows(const float* x, int64_t rows, int64_t n, int32_t* ids, cudaStream_t stream);

// --- Elementwise ---------------------------------------------------------------------------------

// h[i] += x[i] for i < n (MixtralDecoderLayer.forward's `residual + hidden_states`, e.g. after
// o_proj). h, x [n] f32.
absl::Status AddResidual(float* h, const float* x, int64_t n, cudaStream_t stream);

// x[r, i] += f32(bias[i]): a Linear layer's bias (nn.Linear with bias=True; Qwen2's q/k/v). x
// [rows, n] f32; bias [n] in bias_dtype.
absl::Status AddBias(float* x, int64_t rows, int64_t n, const void* bias, GpuDType bias_dtype,
                     cudaStream_t stream);
// x[r, i] += f32(bias[i * bias_step]): a bias read every bias_step elements, as gpt-oss's
// gate_up_proj_bias[e] [2 inter] holds the gate's bias at even and the up projection's at odd
// positions (GptOssExperts.forward: gate_up[..., ::2], gate_up[..., 1::2]). bias_step >= 1;
// otherwise as AddBias.
absl::Status AddBiasStrided(float* x, int64_t rows, int64_t n, const void* bias,
                            GpuDType bias_dtype, int64_t bias_step, cudaStream_t stream);
// x[i] = min(max(x[i], -limit), limit) (OLMoE's clip_qkv). x [n] f32; limit > 0.
absl::Status ClampAbs(float* x, int64_t n, float limit, cudaStream_t stream);
// Qwen2-MoE's shared expert gate: x[t, :] = sigmoid(gate_logit[t]) * x[t, :], the sigmoid
// 1 / (1 + expf(-g)) in f32, then the products. x [tokens, n] f32 in place; gate_logit [tokens]
// f32.
absl::Status ScaleBySigmoid(float* x, int64_t tokens, int64_t n, const float* gate_logit,
                            cudaStream_t stream);
// dst = src rounded to nearest even in dst_dtype (`Tensor.to(dtype)`); src [n] f32, dst [n].
absl::Status ConvertF32To(const float* src, int64_t n, void* dst, GpuDType dst_dtype,
                          cudaStream_t stream);

// dst = f32(src), exact; src [n] in src_dtype, dst [n] f32.
absl::Status ConvertToF32(const void* src, GpuDType src_dtype, int64_t n, float* dst,
                          cudaStream_t stream);

}  // namespace moebatch::gpu
