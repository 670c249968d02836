// The cpu ops of the DeepSeek-V2 / V3 families (engine/model/families/deepseek.cc) beyond
// cpu_attention/ops/ops.h's: the routers (greedy, group_limited_greedy, noaux_tc) and the pieces of
// multi-head latent attention (MLA) in its absorbed form.
//
// MLA, absorbed (DeepSeek-V2 paper §2.1.2-2.1.3; the math of transformers' DeepseekV2Attention /
// DeepseekV3Attention rearranged): per head h, with kv_b_proj's rows split into W_UK[h]
// [qk_nope, kv_lora_rank] and W_UV[h] [v_head_dim, kv_lora_rank],
//   q_nope . k_nope = q_nope . (W_UK[h] c_kv) = (W_UK[h]^T q_nope) . c_kv
//   out[h] = sum_j p_j v_j = W_UV[h] (sum_j p_j c_kv_j)
// so the cache keeps one latent row [c_kv | k_pe] per token (kv_lora_rank + qk_rope values) and
// each head attends it with the absorbed query [W_UK[h]^T q_nope | q_pe] (MQA: one KV head whose
// value is the row's first kv_lora_rank values); W_UV and o_proj follow in task B.
//
// Conventions as ops.h: host pointers, dense row-major f32, InvalidArgument for bad sizes or null
// pointers, synchronous, call from one thread.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/model_config.h"

namespace moebatch::cpu_ops {

// DeepSeek's routers: logits [tokens, experts] f32 (x · gateᵀ in f32) -> ids [tokens, top_k]
// int32 and weights [tokens, top_k] f32.
//   kGreedy, kGroupLimitedGreedy (DeepseekV2MoEGate): scores = softmax(logits); group_limited
//     keeps the topk_group groups (n_group contiguous groups of experts / n_group) of highest
//     max score and sets the other scores to 0; top_k by score; weight = score.
//   kNoauxTc (DeepseekV3TopkRouter.get_topk_indices): scores = sigmoid(logits); choice = scores +
//     bias (e_score_correction_bias [experts] f32); groups ranked by the sum of their 2 largest
//     choice values, the topk_group best kept, the others' choice set to 0; top_k by choice;
//     weight = score (unbiased).
// Then, with `renormalize` (norm_topk_prob), weight /= (sum of the top-k weights + 1e-20 for
// noaux_tc); then weight *= scaling (routed_scaling_factor). Ties go to the lower expert id
// (torch.topk's order on ties is unspecified; the fixtures have none). ids are written in
// descending choice order. bias is read only for kNoauxTc. method kSoftmax is InvalidArgument
// (RouterTopK computes it). 1 <= top_k <= topk_group * (experts / n_group); experts % n_group ==
// 0.
absl::Status RouterDeepseek(const float* logits, const float* bias, int64_t tokens, int64_t experts,
                            int64_t top_k, TopkMethod method, int64_t n_group, int64_t topk_group,
                            bool renormalize, float scaling, int32_t* ids, float* weights);

// RoPE of MLA's decoupled part on `heads` vectors of `d` values per token that sit at
// x + (t * heads + h) * stride: rotated in place as transformers does, the pairs (2i, 2i + 1)
// (interleave: V2's apply_rotary_emb, V3's apply_rotary_pos_emb_interleave) or the halves
// (i, i + d/2) (V3 without rope_interleave). With interleave the result is stored in V3's
// de-interleaved order (the pair (2i, 2i + 1) moved to (i, i + d/2)): a query and a key rotated
// by this function have the dot product transformers computes. positions [tokens] int64;
// inv_freq [d / 2]; cos and sin multiplied by attention_scaling; d even.
absl::Status MlaRope(float* x, int64_t tokens, int64_t heads, int64_t stride, int64_t d,
                     const int64_t* positions, const float* inv_freq, float attention_scaling,
                     bool interleave);

}  // namespace moebatch::cpu_ops
