// The cpu backend's ops: one function per op of a forward pass, GEMMs excepted
// (cpu_attention/gemm/matmul.h). CpuDevice (cpu_attention/backend/cpu_device.cc) is a sequence of
// these calls and Matmul::Linear, and they are the oracle the CUDA kernels are checked against
// (tests/cuda/test_backend_ops.cc, after ggml's test-backend-ops); tests/cpu_attention/test_ops.cc
// checks them against float64 formulas of the transformers math.
//
// Each function has the semantics and the argument order of its namesake in cuda/kernels.h, with
// host pointers and no stream: read that header for what an op computes; the comments here say
// what differs or what the CPU adds. The math follows Hugging Face transformers'
// models/mixtral/modeling_mixtral.py; each function names the transformers code it implements.
//
// Conventions, for every function below:
// - Pointers are host memory; tensors are dense and row-major, shapes written [rows, cols].
//   `const void*` / `void*` tensors are typed by the DType argument next to them
//   (engine/model/dtype.h: f32, f16 and bf16 stored as uint16_t bit patterns, conversions exact
//   or round-to-nearest-even). All arithmetic is f32, each product and sum rounded separately:
//   these files are compiled for baseline x86-64, like cpu_device.cc, so no FMA instruction exists
//   to contract into (g++ contracts across statements by default in C++, even with -std=c++17, once
//   -mfma is on: never add ISA flags to them).
// - InvalidArgument when a size is out of range, a dtype is unknown, or a pointer is null with a
//   non-zero size (nothing is written). The GPU's launch limits (kernels.h's kMax* constants: at
//   most 64 router experts, head_dim <= 256, ...) are not limits here: the cpu backend runs any
//   model its config describes. Zero rows: OK, nothing written (except BuildExpertPermutation,
//   which still zeroes the expert offsets).
// - Synchronous: when a call returns, its outputs are written.
// - Threading: call from one thread; a call parallelises inside with OpenMP where noted (where
//   CpuDevice always has), which never changes a result: the work is split by rows, each row's
//   arithmetic is the same whoever computes it. Thread-safe otherwise: no state.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/dtype.h"

namespace moebatch::cpu_ops {

// --- Embedding -----------------------------------------------------------------------------------

// h[t] = f32(table[token_ids[t]]): MixtralModel.embed_tokens (nn.Embedding) then the f32 hidden
// state. table [vocab, hidden] in table_dtype; token_ids [tokens] int32; h [tokens, hidden] f32.
// An id outside [0, vocab) gives a zero row (CpuDevice::Embed refuses such ids before calling).
// OpenMP over tokens when tokens > 16.
absl::Status EmbeddingGather(const void* table, DType table_dtype, int64_t vocab, int64_t hidden,
                             const int32_t* token_ids, int64_t tokens, float* h);

// --- Task A --------------------------------------------------------------------------------------

// MixtralRMSNorm.forward: out = weight * (x * (1 / sqrt(mean(x^2) + eps))) per row. The sum of
// squares in f32 in index order, then / n, + eps, sqrt, 1 / it; each y = w * (x * inv), rounded
// once to out_dtype. in [rows, n] f32; weight [n] in weight_dtype (widened exactly); out [rows, n]
// in out_dtype; out may be `in` when out_dtype is f32. eps >= 0 (the config's rms_norm_eps as f32).
// OpenMP over rows when rows > 8.
absl::Status RmsNorm(const float* in, const void* weight, DType weight_dtype, int64_t rows,
                     int64_t n, float eps, void* out, DType out_dtype);

// nn.LayerNorm(n, bias=False).forward (DBRX's norm_1, norm_2, norm_f): out = weight * (x - mean) /
// sqrt(var + eps) per row, var the biased variance. In f32: mean = (sum of x in index order) / n,
// var = (sum of (x - mean)^2 in index order) / n, inv = 1 / sqrt(var + eps); each
// y = w * ((x - mean) * inv), rounded once to out_dtype. Shapes, dtypes, aliasing, eps and
// threading as RmsNorm's.
absl::Status LayerNorm(const float* in, const void* weight, DType weight_dtype, int64_t rows,
                       int64_t n, float eps, void* out, DType out_dtype);

// apply_rotary_pos_emb with rotate_half (MixtralRotaryEmbedding, default rope type), in place on
// x [tokens, heads, d] f32; call once for q and once for k. positions [tokens] int64; inv_freq
// [d/2] f32. For i < d/2, f = float(pos) * inv_freq[i], c = cosf(f), s = sinf(f) (glibc):
//   y[i] = x[i] c - x[i + d/2] s,   y[i + d/2] = x[i + d/2] c + x[i] s.
// d even, d >= 2 (no upper limit). c and s are multiplied by `attention_scaling` (the rotary
// embedding's attention factor: 1 but for yarn, ModelConfig's ComputeRope). OpenMP over tokens.
absl::Status ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t d, const int64_t* positions,
                       const float* inv_freq, float attention_scaling = 1.0f);

// Causal self-attention of variable-length sequences whose whole context is in the call
// (MixtralAttention.forward with eager_attention_forward: repeat_kv, causal and sliding window
// masks, softmax in f32), as kernels.h's PrefillAttention: q [tokens, heads, d], k and v
// [tokens, kv_heads, d], out [tokens, heads, d], f32; cu_seqlens [num_seqs + 1] int32; query i of
// a sequence sees its keys j with j <= i and (sliding_window == 0 or i - sliding_window < j);
// query head h reads kv head h / (heads / kv_heads); rows outside every sequence are left
// untouched. The arithmetic is cpu_attention/attention/paged_attention.cc's
// (PagedAttentionReference with an f32 cache): per key, s = (q . k in index order) * scale, an
// online softmax with a running max and sum, out = acc * (1 / sum). Here cu_seqlens is checked:
// 0 <= cu_seqlens[0] <= ... <= cu_seqlens[num_seqs] <= tokens, else InvalidArgument.
// heads a multiple of kv_heads; d >= 1; sliding_window >= 0; scale finite. sinks: [heads] f32
// learned sink logits (gpt-oss) joining each softmax's denominator as SoftmaxNormalizer
// (cpu_attention/attention/paged_attention.h) has it, or null for none.
// OpenMP over (query row, head).
absl::Status PrefillAttention(const float* q, const float* k, const float* v,
                              const int32_t* cu_seqlens, int64_t num_seqs, int64_t tokens,
                              int64_t heads, int64_t kv_heads, int64_t d, float scale,
                              int64_t sliding_window, float* out, const float* sinks = nullptr);

// --- Task B --------------------------------------------------------------------------------------

// The router of MixtralSparseMoeBlock.forward: softmax(router_logits) in f32 (max by
// std::max_element, exp of logit - max and their sum in expert order, each divided by the sum),
// the top_k experts by probability in descending order, ties to the lower expert id
// (std::partial_sort), weights = p / (sum of the top-k p in that order). logits [tokens, experts]
// f32; ids [tokens, top_k] int32; weights [tokens, top_k] f32. 1 <= top_k <= experts.
// With renormalize false the weights are the top-k probabilities as they are (Qwen-MoE and OLMoE
// without norm_topk_prob).
absl::Status RouterTopK(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                        int32_t* ids, float* weights, bool renormalize = true);

// DbrxRouter's renormalisation for p != 1, on RouterTopK's weights taken without renormalize: each
// token's top-k weights divided by their p-norm, torch.norm(w, p): in f32, s = sum of |w|^p in
// choice order (w * w for p = 2), norm = sqrt(s) for p = 2, else powf(s, 1 / p).
// weights [tokens, top_k] f32 in place; p > 0.
absl::Status NormalizeTopKWeights(float* weights, int64_t tokens, int64_t top_k, float p);

// Sorts the (token, choice) pairs by expert (replacing MixtralSparseMoeBlock's one_hot expert_mask
// and torch.where): a counting sort in pair order, so expert e owns rows [expert_offsets[e],
// expert_offsets[e + 1]) in increasing token order. ids [tokens, top_k] int32; expert_offsets
// [experts + 1] int32; sorted_token [tokens * top_k] int32 (rows past expert_offsets[experts] are
// not written); slot_of [tokens, top_k] int32. An id outside [0, experts) gets slot_of = -1 and no
// row. experts >= 1; tokens * top_k < 2^31.
absl::Status BuildExpertPermutation(const int32_t* ids, int64_t tokens, int64_t top_k,
                                    int64_t experts, int32_t* expert_offsets, int32_t* sorted_token,
                                    int32_t* slot_of);

// dst[r] = src[row_index[r]] (`hidden_states[None, top_x]`), a byte copy; an index outside
// [0, src_rows) gives a zero row. src [src_rows, n], dst [rows, n] in dtype; row_index [rows]
// int32.
absl::Status GatherRows(const void* src, DType dtype, int64_t src_rows, int64_t n,
                        const int32_t* row_index, int64_t rows, void* dst);

// MixtralBlockSparseTop2MLP.forward's act_fn(w1(x)) * w3(x), act_fn = SiLU:
// out = g / (1 + expf(-g)) * u in f32, g and u widened from in_dtype, rounded once to out_dtype.
// gate, up [rows, inter] in in_dtype; out [rows, inter] in out_dtype; out may be gate or up when
// out_dtype == in_dtype.
absl::Status SiluMul(const void* gate, const void* up, DType in_dtype, int64_t rows, int64_t inter,
                     void* out, DType out_dtype);

// GptOssExperts.forward's clamped SwiGLU, in f32: g = min(gate, limit), u = clamp(up, -limit,
// limit), out = (u + 1) * (g * sigmoid(g * 1.702)) with sigmoid(x) = 1 / (1 + expf(-x)).
// gate, up, out [rows, inter] f32; out may be gate or up. limit > 0 (the config's swiglu_limit).
absl::Status ClampedSwiglu(const float* gate, const float* up, int64_t rows, int64_t inter,
                           float limit, float* out);

// The end of MixtralSparseMoeBlock.forward (expert output * routing weight, index_add_) and the
// residual add of MixtralDecoderLayer.forward, in CpuDevice's order: per token, moe = 0.0f, then
// moe += expert_out[slot] * weight over its choices in increasing expert id order (equal ids keep
// their choice order), then h += moe. expert_out [tokens * top_k, hidden] f32, row = slot;
// slot_of, ids [tokens, top_k] int32; weights [tokens, top_k] f32; h [tokens, hidden] f32,
// updated. A slot outside [0, tokens * top_k) is skipped. top_k >= 1; tokens * top_k < 2^31.
// With `shared` [tokens, hidden] f32 (Qwen2-MoE's gated shared expert output), moe += shared[t]
// before the residual add, as Qwen2MoeSparseMoeBlock adds it to the routed sum.
absl::Status CombineExperts(const float* expert_out, const int32_t* slot_of, const int32_t* ids,
                            const float* weights, int64_t tokens, int64_t top_k, int64_t hidden,
                            float* h, const float* shared = nullptr);

// --- Greedy decoding -----------------------------------------------------------------------------

// torch.argmax(logits, dim=-1) as Sampler's greedy path: ids[r] = std::max_element(x[r, 0..n)),
// the first maximum winning; -1 for a row holding a NaN or an infinity (logits that are not
// finite: the request fails rather than emit an arbitrary token). x [rows, n] f32; ids [rows]
// int32; 1 <= n < 2^31.
absl::Status ArgmaxRows(const float* x, int64_t rows, int64_t n, int32_t* ids);

// --- Elementwise ---------------------------------------------------------------------------------

// h[i] += x[i] for i < n (MixtralDecoderLayer.forward's residual add). h, x [n] f32.
absl::Status AddResidual(float* h, const float* x, int64_t n);

// x[r, i] += bias[i]: a Linear layer's bias (nn.Linear with bias=True). x [rows, n] f32, bias [n]
// f32.
absl::Status AddBias(float* x, int64_t rows, int64_t n, const float* bias);

// x[i] = clamp(x[i], -limit, limit) (OLMoE's clip_qkv). x [n] f32; limit > 0.
absl::Status ClampAbs(float* x, int64_t n, float limit);

// Qwen2-MoE's shared expert gate: out[t] = sigmoid(gate_logit[t]) * x[t, :], in f32
// (torch.sigmoid, then the product). x [tokens, n] f32 in place; gate_logit [tokens] f32.
absl::Status ScaleBySigmoid(float* x, int64_t tokens, int64_t n, const float* gate_logit);

// dst = src rounded to nearest even in dst_dtype (`Tensor.to(dtype)`, engine/model/dtype.h's
// ConvertFromF32: a NaN stays a NaN, its bits may differ from CUDA's). src [n] f32, dst [n].
// OpenMP when n > 65536.
absl::Status ConvertF32To(const float* src, int64_t n, void* dst, DType dst_dtype);

// dst = f32(src), exact. src [n] in src_dtype, dst [n] f32. OpenMP when n > 65536.
absl::Status ConvertToF32(const void* src, DType src_dtype, int64_t n, float* dst);

}  // namespace moebatch::cpu_ops
