#include "engine/sparse_utilization.h"

#include <algorithm>

namespace moebatch {

SparseUtilization ComputeSparseUtilization(const ModelConfig& c, double weight_bytes,
                                           double kv_bytes, const ForwardStats& pass,
                                           double peak_bytes_per_second, double peak_flops) {
  const double h = static_cast<double>(c.hidden_size);
  const double attn_params = h * c.q_size() * 2 + h * c.kv_size() * 2 + 2 * h;  // q, o, k, v, norms
  const double router_params = h * c.num_local_experts;
  const double expert_params = 3 * h * c.intermediate_size;  // w1, w3, w2
  // Qwen2-MoE's shared expert and its gate, in every MoE layer; a dense layer's FFN instead of the
  // routed ones (the forward counts it as one expert touched: take those out of experts_touched).
  const double shared_params =
      c.shared_expert_intermediate_size > 0 ? 3 * h * c.shared_expert_intermediate_size + h : 0;
  const double dense_params = 3 * h * c.dense_intermediate_size;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  const int64_t dense_layers = c.num_hidden_layers - moe_layers;
  const double routed_touched = std::max<double>(
      0, static_cast<double>(pass.experts_touched) - (pass.tokens > 0 ? dense_layers : 0));
  SparseUtilization u;
  u.activated_weight_bytes =
      weight_bytes *
      (c.num_hidden_layers * attn_params + moe_layers * (router_params + shared_params) +
       dense_layers * dense_params + routed_touched * expert_params);
  u.kv_bytes =
      kv_bytes * static_cast<double>(pass.kv_tokens_read) * c.num_hidden_layers * 2.0 * c.kv_size();
  // 2 FLOPs per parameter used by a token, every layer; the router counted like MoE-CAP's
  // N_counter; attention scores are left out, as in MoE-CAP.
  u.flops = static_cast<double>(pass.tokens) *
            (c.num_hidden_layers * 2 * attn_params +
             moe_layers * (2 * router_params + 2.0 * c.num_experts_per_tok * expert_params +
                           2 * shared_params) +
             dense_layers * 2 * dense_params);
  if (pass.pass_seconds > 0) {
    u.bytes_per_second = (u.activated_weight_bytes + u.kv_bytes) / pass.pass_seconds;
    u.flops_per_second = u.flops / pass.pass_seconds;
  }
  if (peak_bytes_per_second > 0) u.s_mbu = u.bytes_per_second / peak_bytes_per_second;
  if (peak_flops > 0) u.s_mfu = u.flops_per_second / peak_flops;
  return u;
}

}  // namespace moebatch
