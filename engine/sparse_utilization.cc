#include "engine/sparse_utilization.h"

namespace moebatch {

SparseUtilization ComputeSparseUtilization(const ModelConfig& c, double weight_bytes,
                                           double kv_bytes, const ForwardStats& pass,
                                           double peak_bytes_per_second, double peak_flops) {
  const double h = static_cast<double>(c.hidden_size);
  const double attn_params = h * c.q_size() * 2 + h * c.kv_size() * 2 + 2 * h;  // q, o, k, v, norms
  const double router_params = h * c.num_local_experts;
  const double expert_params = 3 * h * c.intermediate_size;  // w1, w3, w2
  SparseUtilization u;
  u.activated_weight_bytes =
      weight_bytes * (c.num_hidden_layers * (attn_params + router_params) +
                      static_cast<double>(pass.experts_touched) * expert_params);
  u.kv_bytes =
      kv_bytes * static_cast<double>(pass.kv_tokens_read) * c.num_hidden_layers * 2.0 * c.kv_size();
  // 2 FLOPs per parameter used by a token, every layer; the router counted like MoE-CAP's
  // N_counter; attention scores are left out, as in MoE-CAP.
  u.flops = static_cast<double>(pass.tokens) * c.num_hidden_layers *
            (2 * attn_params + 2 * router_params + 2.0 * c.num_experts_per_tok * expert_params);
  if (pass.pass_seconds > 0) {
    u.bytes_per_second = (u.activated_weight_bytes + u.kv_bytes) / pass.pass_seconds;
    u.flops_per_second = u.flops / pass.pass_seconds;
  }
  if (peak_bytes_per_second > 0) u.s_mbu = u.bytes_per_second / peak_bytes_per_second;
  if (peak_flops > 0) u.s_mfu = u.flops_per_second / peak_flops;
  return u;
}

}  // namespace moebatch
