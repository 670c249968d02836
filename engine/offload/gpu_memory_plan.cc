#include "engine/offload/gpu_memory_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moebatch {
namespace {

std::string GiB(int64_t bytes) { return absl::StrFormat("%.2f GiB", bytes / double(1 << 30)); }

int64_t AlignedLayerBytes(int64_t max_layer_bytes) { return (max_layer_bytes + 255) / 256 * 256; }

int64_t FixedBytes(const ModelConfig& c, DType dtype, int64_t max_layer_bytes,
                   int64_t dequant_bytes) {
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t resident = (c.vocab_size + 1) * c.hidden_size * elem;
  return 2 * max_layer_bytes + resident + std::max<int64_t>(0, dequant_bytes) +
         GpuMemoryPlan::kWorkspaceBytes;
}

}  // namespace

std::string GpuMemoryPlan::ToString() const {
  return absl::StrCat(
      "2 x ", GiB(weight_slot_bytes), " weight slots + ", GiB(resident_bytes), " lm_head + ",
      resident_layers > 0
          ? absl::StrCat(resident_layers, " resident layers (", GiB(resident_layer_bytes), ") + ")
          : std::string(),
      GiB(activation_bytes), " activations (", tokens_per_pass, " tokens/pass) + ",
      dequant_bytes > 0 ? absl::StrCat(GiB(dequant_bytes), " dequantization scratch + ")
                        : std::string(),
      GiB(workspace_bytes), " workspace = ", GiB(total_bytes));
}

int64_t GpuFfnColumnsPerToken(const ModelConfig& c) {
  int64_t columns = c.shared_expert_intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    columns = std::max(columns, c.IsMoeLayer(l) ? c.num_experts_per_tok * c.intermediate_size
                                                : c.dense_intermediate_size);
  }
  return columns;
}

int64_t GpuDequantScratchBytes(const ModelConfig& c, DType dtype) {
  const int64_t hidden = c.hidden_size;
  int64_t elements =
      std::max({c.q_size() * hidden, c.kv_size() * hidden, c.num_local_experts * hidden,
                c.shared_expert_intermediate_size * hidden});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    elements = std::max(
        elements, (c.IsMoeLayer(l) ? c.intermediate_size : c.dense_intermediate_size) * hidden);
  }
  return elements * static_cast<int64_t>(DTypeSize(dtype));
}

int64_t GpuActivationBytesPerToken(const ModelConfig& c, DType dtype) {
  const int64_t e = static_cast<int64_t>(DTypeSize(dtype)), f = 4;
  const int64_t hidden = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  const int64_t k = c.num_experts_per_tok, ffn = GpuFfnColumnsPerToken(c);
  int64_t bytes = 0;
  bytes += 2 * (hidden * f + 8 + 4);  // h, position, prefill segment offset, each micro-batch
  bytes += hidden * e;                // x = RMSNorm(h), GEMM input
  bytes += (q + 2 * kv) * f;          // q, k, v
  bytes += q * f + q * e;             // attention output, and as GEMM input
  bytes += hidden * f;                // o-proj output
  bytes += c.num_local_experts * f;   // router logits
  bytes += k * 16;                    // top-k ids, weights, slots; tokens sorted by expert
  bytes += k * hidden * e;            // expert inputs (rows sorted by expert)
  bytes += 2 * ffn * f;               // gate and up
  bytes += ffn * e;                   // silu(gate) * up, GEMM input
  bytes += k * hidden * f;            // expert outputs
  if (c.shared_expert_intermediate_size > 0) bytes += hidden * f + f;  // shared expert, its gate
  if (c.mla) {  // MLA's projected q, its low-rank q, and the heads' values after W_UV
    const MlaConfig& m = *c.mla;
    bytes += (c.num_attention_heads * m.qk_head_dim() + m.q_lora_rank +
              c.num_attention_heads * m.v_head_dim) *
             (f + e);
  }
  bytes += c.vocab_size * f + 4;  // logits and their row index
  return bytes;
}

absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const ModelConfig& c, DType dtype,
                                            int64_t max_layer_bytes, int64_t tokens_per_pass,
                                            int64_t budget_bytes, int64_t resident_layers,
                                            int64_t dequant_bytes) {
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) {
    return absl::InvalidArgumentError("GPU compute dtype: must be bf16, f16 or f32");
  }
  if (resident_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory plan: resident layers must be >= 0, got ", resident_layers));
  }
  if (dequant_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU memory plan: dequantization scratch must be >= 0 bytes, got ", dequant_bytes));
  }
  if (max_layer_bytes <= 0 || tokens_per_pass <= 0 || budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory plan: layer bytes (", max_layer_bytes, "), tokens per pass (",
                     tokens_per_pass, ") and budget (", budget_bytes, ") must be positive"));
  }
  GpuMemoryPlan plan;
  plan.tokens_per_pass = tokens_per_pass;
  plan.weight_slot_bytes = max_layer_bytes;
  plan.resident_bytes = (c.vocab_size + 1) * c.hidden_size * static_cast<int64_t>(DTypeSize(dtype));
  plan.resident_layers = resident_layers;
  plan.resident_layer_bytes = resident_layers * AlignedLayerBytes(max_layer_bytes);
  plan.activation_bytes = tokens_per_pass * GpuActivationBytesPerToken(c, dtype);
  plan.dequant_bytes = dequant_bytes;
  plan.workspace_bytes = GpuMemoryPlan::kWorkspaceBytes;
  plan.total_bytes = 2 * plan.weight_slot_bytes + plan.resident_bytes + plan.resident_layer_bytes +
                     plan.activation_bytes + plan.dequant_bytes + plan.workspace_bytes;
  if (plan.total_bytes > budget_bytes) {
    const int64_t fit = MaxTokensPerPassForBudget(c, dtype, max_layer_bytes, budget_bytes,
                                                  resident_layers, dequant_bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU memory: ", plan.ToString(), " exceeds the budget of ", GiB(budget_bytes),
        fit > 0 ? absl::StrCat("; at most ", fit, " tokens per pass fit",
                               resident_layers > 0
                                   ? absl::StrCat(" beside ", resident_layers, " resident layers")
                                   : std::string())
        : resident_layers > 0
            ? absl::StrCat("; the weight slots, lm_head",
                           dequant_bytes > 0 ? ", dequantization scratch" : "",
                           " and resident layers alone do not fit")
            : absl::StrCat(
                  "; the two weight slots",
                  dequant_bytes > 0 ? ", lm_head and dequantization scratch" : " and lm_head",
                  " alone do not fit")));
  }
  return plan;
}

int64_t AutomaticTokensPerPass(const ModelConfig& c, DType dtype, int64_t max_layer_bytes,
                               int64_t budget_bytes, int64_t num_layers, int64_t resident_layers,
                               int64_t dequant_bytes) {
  const int64_t resident =
      std::clamp<int64_t>(resident_layers, 0, std::max<int64_t>(0, num_layers - 2));
  return std::min(
      kMaxAutomaticTokensPerPass,
      MaxTokensPerPassForBudget(c, dtype, max_layer_bytes, budget_bytes, resident, dequant_bytes));
}

int64_t MaxResidentLayers(const ModelConfig& c, DType dtype, int64_t max_layer_bytes,
                          int64_t tokens_per_pass, int64_t budget_bytes, int64_t num_layers,
                          int64_t dequant_bytes) {
  auto plan =
      PlanGpuMemory(c, dtype, max_layer_bytes, tokens_per_pass, budget_bytes, 0, dequant_bytes);
  if (!plan.ok() || num_layers <= 2) return 0;
  const int64_t room = (budget_bytes - plan->total_bytes) / AlignedLayerBytes(max_layer_bytes);
  return std::min(room, num_layers - 2);
}

int64_t MaxTokensPerPassForBudget(const ModelConfig& c, DType dtype, int64_t max_layer_bytes,
                                  int64_t budget_bytes, int64_t resident_layers,
                                  int64_t dequant_bytes) {
  const int64_t left = budget_bytes - FixedBytes(c, dtype, max_layer_bytes, dequant_bytes) -
                       std::max<int64_t>(0, resident_layers) * AlignedLayerBytes(max_layer_bytes);
  if (left <= 0) return 0;
  return left / GpuActivationBytesPerToken(c, dtype);
}

absl::StatusOr<GpuMemoryPlan> PlanGpuDevice(const ModelConfig& config, DType compute_dtype,
                                            int64_t max_layer_bytes, int64_t num_layers,
                                            int64_t tokens_per_pass, int64_t budget_bytes,
                                            int64_t resident_request, int64_t dequant_bytes) {
  const int64_t clamped =
      std::clamp<int64_t>(resident_request, 0, std::max<int64_t>(0, num_layers - 2));
  int64_t tokens = tokens_per_pass;
  if (tokens == 0) {
    // Beside resident layers the user asked for; automatic ones take what the pass leaves.
    tokens = AutomaticTokensPerPass(config, compute_dtype, max_layer_bytes, budget_bytes,
                                    num_layers, resident_request, dequant_bytes);
    if (tokens < 1) {  // PlanGpuMemory says what does not fit
      return PlanGpuMemory(config, compute_dtype, max_layer_bytes, 1, budget_bytes, clamped,
                           dequant_bytes)
          .status();
    }
  }
  const int64_t resident = resident_request >= 0
                               ? clamped
                               : MaxResidentLayers(config, compute_dtype, max_layer_bytes, tokens,
                                                   budget_bytes, num_layers, dequant_bytes);
  return PlanGpuMemory(config, compute_dtype, max_layer_bytes, tokens, budget_bytes, resident,
                       dequant_bytes);
}

}  // namespace moebatch
