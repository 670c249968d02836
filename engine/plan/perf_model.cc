// The MoE-Lens performance model (§5). See perf_model.h for the equations, symbols and units, and
// for where the paper's printed equations had to be read.
#include "engine/plan/perf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moebatch {
namespace {

// ParseWeightFormat's block formats: name, ggml type.
constexpr std::pair<const char*, GgmlType> kBlockFormats[] = {
    {"q4_0", GgmlType::kQ4_0}, {"q4_1", GgmlType::kQ4_1}, {"q5_0", GgmlType::kQ5_0},
    {"q5_1", GgmlType::kQ5_1}, {"q8_0", GgmlType::kQ8_0}, {"q4_k", GgmlType::kQ4_K},
    {"q5_k", GgmlType::kQ5_K}, {"q6_k", GgmlType::kQ6_K}, {"mxfp4", GgmlType::kMXFP4},
    {"int8", GgmlType::kQ8_0}, {"int4", GgmlType::kQ4_1}};
constexpr std::pair<const char*, DType> kFloatFormats[] = {
    {"bf16", DType::kBF16}, {"f16", DType::kF16}, {"f32", DType::kF32}};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxSequenceTokens = 1'000'000'000;

absl::Status FieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", why));
}

absl::Status CheckPositive(absl::string_view field, int64_t v) {
  if (v <= 0) return FieldError(field, absl::StrCat("must be positive, got ", v));
  return absl::OkStatus();
}

absl::Status CheckPositive(absl::string_view field, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    return FieldError(field, absl::StrCat("must be positive and finite, got ", v));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const ModelShape& m) {
  const std::pair<const char*, int64_t> ints[] = {{"model.num_layers", m.num_layers},
                                                  {"model.hidden_size", m.hidden_size},
                                                  {"model.ffn_size", m.ffn_size},
                                                  {"model.num_experts", m.num_experts},
                                                  {"model.top_k", m.top_k},
                                                  {"model.num_heads", m.num_heads},
                                                  {"model.num_kv_heads", m.num_kv_heads},
                                                  {"model.head_dim", m.head_dim},
                                                  {"model.vocab_size", m.vocab_size}};
  for (const auto& [field, v] : ints) {
    if (absl::Status s = CheckPositive(field, v); !s.ok()) return s;
  }
  if (absl::Status s = CheckPositive("model.weight_bytes_per_element", m.weight_bytes_per_element);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPositive("model.kv_bytes_per_element", m.kv_bytes_per_element);
      !s.ok()) {
    return s;
  }
  if (!(m.transferred_weight_bytes >= 0)) {
    return FieldError("model.transferred_weight_bytes", "must be >= 0 (0: Model Size)");
  }
  if (m.top_k > m.num_experts) {
    return FieldError("model.top_k", absl::StrCat("(", m.top_k, ") exceeds model.num_experts (",
                                                  m.num_experts, ")"));
  }
  if (m.num_heads % m.num_kv_heads != 0) {
    return FieldError("model.num_heads",
                      absl::StrCat("(", m.num_heads, ") is not a multiple of model.num_kv_heads (",
                                   m.num_kv_heads, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateHardware(const HardwareSpec& hw) {
  if (absl::Status s = CheckPositive("hardware.pcie_bytes_per_s", hw.pcie_bytes_per_s); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPositive("hardware.gpu_flops", hw.gpu_flops); !s.ok()) return s;
  if (absl::Status s = CheckPositive("hardware.cpu_mem_bytes_per_s", hw.cpu_mem_bytes_per_s);
      !s.ok()) {
    return s;
  }
  return CheckPositive("hardware.kv_memory_bytes", hw.kv_memory_bytes);
}

// Everything but the budget-vs-memory check (the transition search goes past the host's memory).
absl::Status ValidateWorkload(const Workload& w) {
  if (absl::Status s = CheckPositive("workload.prompt_tokens", w.prompt_tokens); !s.ok()) return s;
  if (absl::Status s = CheckPositive("workload.gen_tokens", w.gen_tokens); !s.ok()) return s;
  // Keeps eq. 8's block sums (~(p + g)^2 / 2b) inside int64.
  if (w.prompt_tokens > kMaxSequenceTokens) {
    return FieldError("workload.prompt_tokens", absl::StrCat("must be at most ", kMaxSequenceTokens,
                                                             ", got ", w.prompt_tokens));
  }
  if (w.gen_tokens > kMaxSequenceTokens) {
    return FieldError("workload.gen_tokens",
                      absl::StrCat("must be at most ", kMaxSequenceTokens, ", got ", w.gen_tokens));
  }
  if (absl::Status s = CheckPositive("workload.batch_size", w.batch_size); !s.ok()) return s;
  if (absl::Status s = CheckPositive("workload.block_size", w.block_size); !s.ok()) return s;
  if (w.block_size > kMaxSequenceTokens) {
    return FieldError("workload.block_size",
                      absl::StrCat("must be at most ", kMaxSequenceTokens, ", got ", w.block_size));
  }
  return CheckPositive("workload.kv_budget_bytes", w.kv_budget_bytes);
}

// Parameters of one layer: attention projections, router, experts, two RMSNorms.
// The FFN weights of an average layer with `experts` routed experts: a MoE layer's experts, its
// shared expert and gate, and (`router`) its router, weighted by the share of MoE layers; a dense
// layer's FFN by the share of dense layers.
double FfnParamsPerLayer(const ModelShape& m, int64_t experts, bool router) {
  const double h = static_cast<double>(m.hidden_size);
  const double shared = m.shared_ffn_size > 0 ? 3.0 * h * m.shared_ffn_size + h : 0;
  const double moe = 3.0 * experts * h * m.ffn_size + shared +
                     (router ? static_cast<double>(m.num_experts) * h : 0);
  return (1 - m.dense_layer_fraction) * moe + m.dense_layer_fraction * 3.0 * h * m.dense_ffn_size;
}

// The attention's projection weights per layer: q, k, v, o of GQA, or MLA's.
double AttentionParams(const ModelShape& m) {
  if (m.mla_attention_params > 0) return m.mla_attention_params;
  const double h = static_cast<double>(m.hidden_size);
  const double q = static_cast<double>(m.num_heads) * m.head_dim;
  const double kv = static_cast<double>(m.num_kv_heads) * m.head_dim;
  return 2 * h * q + 2 * h * kv;
}

double LayerParams(const ModelShape& m) {
  const double h = static_cast<double>(m.hidden_size);
  return AttentionParams(m) + FfnParamsPerLayer(m, m.num_experts, true) + 2 * h;
}

// The GEMM weights of eq. 1 per layer, with `experts` experts (N_k for the FLOP, N_e for the
// bytes).
double GemmParamsPerLayer(const ModelShape& m, int64_t experts) {
  if (m.mla_attention_params > 0) return FfnParamsPerLayer(m, experts, false) + AttentionParams(m);
  const double h = static_cast<double>(m.hidden_size);
  const double q = static_cast<double>(m.num_heads) * m.head_dim;
  const double kv = static_cast<double>(m.num_kv_heads) * m.head_dim;
  return FfnParamsPerLayer(m, experts, false) + 2 * h * q + 2 * h * kv;
}

// The iteration time with CPU memory in the picture: the smallest t >= delta with
// t >= (KV read(t) + W) / B_cpu (eq. 5 solved for t), where the CPU attention reads
// KV read(t) = min(kv_cap_bytes, kv_gpu_bytes_per_s * t): the KV the memory side holds
// (kv_cap_bytes), unless the GPU admits less work than that, in which case only the KV of what the
// GPU processes in t (kv_gpu_bytes_per_s * t) is held and read. The right-hand side is
// nondecreasing and piecewise linear in t, so the least fixed point is found directly. Seconds.
double IterationSeconds(double delta_s, double kv_cap_bytes, double kv_gpu_bytes_per_s,
                        double weight_bytes, double cpu_mem_bytes_per_s) {
  const auto cpu_s = [&](double t) {
    return CpuMemorySeconds(std::min(kv_cap_bytes, kv_gpu_bytes_per_s * t), weight_bytes,
                            cpu_mem_bytes_per_s);
  };
  if (cpu_s(delta_s) <= delta_s) return delta_s;
  // On the GPU branch t = (c t + W) / B has the solution W / (B - c) when B > c.
  if (cpu_mem_bytes_per_s > kv_gpu_bytes_per_s) {
    const double t = weight_bytes / (cpu_mem_bytes_per_s - kv_gpu_bytes_per_s);
    if (kv_gpu_bytes_per_s * t <= kv_cap_bytes) return std::max(delta_s, t);
  }
  return CpuMemorySeconds(kv_cap_bytes, weight_bytes, cpu_mem_bytes_per_s);
}

// Stage 1 and Stage 2 without validation (the transition search calls them many times).
Stage1Result Stage1(const ModelShape& model, const HardwareSpec& hw, const Workload& w) {
  Stage1Result r;
  const double kv_per_token = KvBytesPerSequenceToken(
      model, static_cast<double>(w.prompt_tokens) + static_cast<double>(w.gen_tokens));
  r.model_bytes = TransferredWeightBytes(model);
  r.delta_s = WeightTransferSeconds(model, hw);
  r.flops_per_token = static_cast<double>(model.num_layers) * GemmFlopsPerTokenPerLayer(model);
  r.gpu_tokens_per_s = GpuTokensPerSecond(model, hw);
  r.tokens_to_saturate = r.gpu_tokens_per_s * r.delta_s;
  r.tokens_to_saturate_eq2 = TokensToSaturateGpuEq2(model, hw);
  r.pme = ParallelismMemoryEfficiency(w.prompt_tokens, w.gen_tokens);
  r.kv_tokens = w.kv_budget_bytes / kv_per_token;
  r.effective_kv_tokens = EffectiveKvCapacity(r.kv_tokens, w.prompt_tokens, w.gen_tokens);
  r.required_cpu_mem_bytes_per_s =
      RequiredCpuMemoryBandwidth(w.kv_budget_bytes, r.model_bytes, hw.pcie_bytes_per_s);
  // The GPU processes T_GPU tokens/s; PME * M' = T_GPU * t of them per iteration needs
  // M' = T_GPU * t / PME tokens of KV.
  const double kv_gpu_bytes_per_s = r.gpu_tokens_per_s / r.pme * kv_per_token;
  r.iteration_s = IterationSeconds(r.delta_s, w.kv_budget_bytes, kv_gpu_bytes_per_s, r.model_bytes,
                                   hw.cpu_mem_bytes_per_s);
  r.kv_read_bytes = std::min(w.kv_budget_bytes, kv_gpu_bytes_per_s * r.iteration_s);
  r.cpu_iteration_s = CpuMemorySeconds(r.kv_read_bytes, r.model_bytes, hw.cpu_mem_bytes_per_s);
  r.parallel_tokens = r.pme * r.kv_tokens;
  r.max_tokens_per_s = MaxThroughput(r.pme, r.kv_tokens, r.iteration_s, r.gpu_tokens_per_s);
  const double p = static_cast<double>(w.prompt_tokens), g = static_cast<double>(w.gen_tokens);
  r.max_generated_tokens_per_s = r.max_tokens_per_s * g / (p + g);
  r.gpu_utilization = r.max_tokens_per_s / r.gpu_tokens_per_s;

  // The smallest M with PME * M / t(M) >= T_GPU: M = T_GPU * t / PME with t the iteration once
  // the GPU is saturated, max(delta, W / (B_cpu - c)) with c = kv_gpu_bytes_per_s (equivalently
  // PME * M * B_cpu / (M kv + W) = T_GPU past delta); none when B_cpu <= c, i.e. when the CPU's
  // asymptotic rate PME * B_cpu / kv is below T_GPU.
  if (hw.cpu_mem_bytes_per_s > kv_gpu_bytes_per_s) {
    const double t =
        std::max(r.delta_s, r.model_bytes / (hw.cpu_mem_bytes_per_s - kv_gpu_bytes_per_s));
    r.saturating_kv_bytes = kv_gpu_bytes_per_s * t;
  } else {
    r.saturating_kv_bytes = kInf;
  }

  const double memory_side = r.parallel_tokens / r.iteration_s;
  if (r.gpu_tokens_per_s <= memory_side) {
    r.bound = LimitingBound::kGpuCompute;
  } else if (r.iteration_s > r.delta_s) {
    r.bound = LimitingBound::kCpuAttention;
  } else {
    r.bound = LimitingBound::kKvCapacity;
  }
  return r;
}

Stage2Result Stage2(const ModelShape& model, const HardwareSpec& hw, const Workload& w) {
  Stage2Result r;
  const int64_t p = w.prompt_tokens, g = w.gen_tokens, b = w.block_size, k = w.batch_size;
  const double kv_per_token = KvBytesPerSequenceToken(model, static_cast<double>(p + g));
  const double model_bytes = TransferredWeightBytes(model);
  r.delta_s = WeightTransferSeconds(model, hw);
  const double blocks = std::floor(w.kv_budget_bytes / (static_cast<double>(b) * kv_per_token));
  r.kv_blocks = blocks >= static_cast<double>(std::numeric_limits<int64_t>::max())
                    ? std::numeric_limits<int64_t>::max()
                    : static_cast<int64_t>(blocks);
  r.lifetime_blocks = LifetimeKvBlocks(p, g, b);
  r.q = PrefillSequencesPerIteration(r.kv_blocks, p, g, b);
  r.decode_sequences = static_cast<double>(g) * r.q;
  r.separate_decode_sequences = SeparateDecodeSequences(r.kv_blocks, p, g, b);
  // The KV the CPU reads per iteration. The memory side holds the whole cache, or only K of the
  // g q sequence slots when K < g q; when the GPU admits fewer sequences than q, T_GPU t / (p + g)
  // per iteration of t, it holds their lifetime blocks only.
  const double cache_bytes =
      static_cast<double>(r.kv_blocks) * static_cast<double>(b) * kv_per_token;
  const double memory_side_bytes =
      r.decode_sequences > 0
          ? cache_bytes * std::min(1.0, static_cast<double>(k) / r.decode_sequences)
          : 0.0;
  const double kv_gpu_bytes_per_s = GpuTokensPerSecond(model, hw) / static_cast<double>(p + g) *
                                    static_cast<double>(r.lifetime_blocks) *
                                    static_cast<double>(b) * kv_per_token;
  r.iteration_s = IterationSeconds(r.delta_s, memory_side_bytes, kv_gpu_bytes_per_s, model_bytes,
                                   hw.cpu_mem_bytes_per_s);
  r.kv_read_bytes = std::min(memory_side_bytes, kv_gpu_bytes_per_s * r.iteration_s);
  r.kv_in_use_fraction = cache_bytes > 0 ? r.kv_read_bytes / cache_bytes : 0.0;
  r.cpu_iteration_s = CpuMemorySeconds(r.kv_read_bytes, model_bytes, hw.cpu_mem_bytes_per_s);

  r.t1_tokens_per_s = MemoryBoundThroughput(k, g, r.q, r.iteration_s);

  // The GPU processes T_GPU(tokens/s) * iteration tokens per iteration: n of eq. 2 when the
  // iteration is delta, more when CPU memory stretches it.
  r.gpu_tokens_per_iteration = GpuTokensPerSecond(model, hw) * r.iteration_s;
  r.prefill_tokens_per_iteration = PrefillTokensPerIteration(r.gpu_tokens_per_iteration, p, g);
  const double prologue_tokens =
      (r.prefill_tokens_per_iteration + r.gpu_tokens_per_iteration) / 2 * static_cast<double>(g);
  r.pipeline_filled = static_cast<double>(k) * static_cast<double>(p) >= prologue_tokens;
  r.iterations = PipelineIterations(k, p, g, r.gpu_tokens_per_iteration);
  r.t2_tokens_per_s = ComputeBoundThroughput(k, g, r.iterations, r.iteration_s);
  r.gpu_condition = r.gpu_tokens_per_iteration < r.q * static_cast<double>(p + g);

  r.tokens_per_s = std::min(r.t1_tokens_per_s, r.t2_tokens_per_s);  // eq. 14
  const double gpu_generated_per_s =
      GpuTokensPerSecond(model, hw) * static_cast<double>(g) / static_cast<double>(p + g);
  r.gpu_utilization = r.tokens_per_s / gpu_generated_per_s;

  // Both eq. 10 and eq. 12 count admission iterations (K/q, or It - g when the GPU admits) plus g
  // drain iterations, each an iteration long. The bound is what sets the larger share: CPU memory
  // when it stretches the iteration while reading the memory side's KV; else the admission limit
  // (KV capacity for T1, GPU compute for T2) when admission takes at least g iterations; else the
  // weight transfer every iteration waits for (PCIe), or CPU memory if it stretches that.
  const bool stretched = r.iteration_s > r.delta_s;
  const bool gpu_side = r.t2_tokens_per_s < r.t1_tokens_per_s;
  const double admission_iterations =
      gpu_side ? r.iterations - static_cast<double>(g) : static_cast<double>(k) / r.q;
  if (stretched && r.kv_read_bytes >= memory_side_bytes) {
    r.bound = LimitingBound::kCpuAttention;
  } else if (admission_iterations >= static_cast<double>(g)) {
    r.bound = gpu_side    ? LimitingBound::kGpuCompute
              : stretched ? LimitingBound::kCpuAttention
                          : LimitingBound::kKvCapacity;
  } else {
    r.bound = stretched ? LimitingBound::kCpuAttention : LimitingBound::kPcie;
  }
  return r;
}

LimitingBound BoundAt(const ModelShape& model, const HardwareSpec& hw, Workload w, PerfStage stage,
                      double kv_bytes) {
  w.kv_budget_bytes = kv_bytes;
  return stage == PerfStage::kStage1 ? Stage1(model, hw, w).bound : Stage2(model, hw, w).bound;
}

}  // namespace

std::string_view LimitingBoundName(LimitingBound bound) {
  switch (bound) {
    case LimitingBound::kPcie:
      return "PCIe";
    case LimitingBound::kGpuCompute:
      return "GPU compute";
    case LimitingBound::kKvCapacity:
      return "KV capacity";
    case LimitingBound::kCpuAttention:
      return "CPU attention";
  }
  return "unknown";
}

absl::StatusOr<ModelShape> ModelShapeFromConfig(const ModelConfig& config, DType weight_dtype,
                                                DType kv_dtype) {
  const std::pair<const char*, int64_t> keys[] = {
      {"num_hidden_layers", config.num_hidden_layers},
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.intermediate_size},
      {"num_local_experts", config.num_local_experts},
      {"num_experts_per_tok", config.num_experts_per_tok},
      {"num_attention_heads", config.num_attention_heads},
      {"num_key_value_heads", config.num_key_value_heads},
      {"head_dim", config.head_dim},
      {"vocab_size", config.vocab_size}};
  for (const auto& [key, v] : keys) {
    if (v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("key \"", key, "\" must be positive, got ", v));
    }
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key \"num_attention_heads\" (", config.num_attention_heads,
        ") is not a multiple of \"num_key_value_heads\" (", config.num_key_value_heads, ")"));
  }
  if (config.num_experts_per_tok > config.num_local_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"num_experts_per_tok\" (", config.num_experts_per_tok,
                     ") exceeds \"num_local_experts\" (", config.num_local_experts, ")"));
  }
  ModelShape m;
  m.num_layers = config.num_hidden_layers;
  m.hidden_size = config.hidden_size;
  m.ffn_size = config.intermediate_size;
  m.shared_ffn_size = config.shared_expert_intermediate_size;
  int64_t dense_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l)
    dense_layers += config.IsMoeLayer(l) ? 0 : 1;
  m.dense_layer_fraction = static_cast<double>(dense_layers) / config.num_hidden_layers;
  m.dense_ffn_size = config.dense_intermediate_size;
  m.num_experts = config.num_local_experts;
  m.top_k = config.num_experts_per_tok;
  m.num_heads = config.num_attention_heads;
  m.num_kv_heads = config.num_key_value_heads;
  m.head_dim = config.head_dim;
  m.vocab_size = config.vocab_size;
  m.tie_word_embeddings = config.tie_word_embeddings;
  m.weight_bytes_per_element = static_cast<double>(DTypeSize(weight_dtype));
  m.kv_bytes_per_element = static_cast<double>(DTypeSize(kv_dtype));
  m.window_layers = config.NumSlidingLayers();
  if (m.window_layers > 0) m.sliding_window = *config.sliding_window;
  if (config.mla) {  // DeepSeek: latent rows; q (or q_a, q_b), kv_a, kv_b, o
    const MlaConfig& a = *config.mla;
    const double h = static_cast<double>(config.hidden_size);
    const double heads = static_cast<double>(config.num_attention_heads);
    const double q = a.q_lora_rank == 0
                         ? h * heads * a.qk_head_dim()
                         : h * a.q_lora_rank + a.q_lora_rank * heads * a.qk_head_dim();
    m.kv_value_in_key = true;
    m.mla_attention_params = q + h * a.latent_dim() +
                             a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim) +
                             heads * a.v_head_dim * h;
  }
  return m;
}

absl::StatusOr<WeightFormat> ParseWeightFormat(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  WeightFormat f;
  f.name = lower;
  for (const auto& [n, dtype] : kFloatFormats) {
    if (lower != n) continue;
    f.dtype = dtype;
    f.bytes_per_element = static_cast<double>(DTypeSize(dtype));
    return f;
  }
  for (const auto& [n, type] : kBlockFormats) {
    if (lower != n) continue;
    const GgmlTypeTraits t = GgmlTypeInfoOf(type);
    f.quant = type;
    f.bytes_per_element = static_cast<double>(t.type_size) / static_cast<double>(t.block_size);
    return f;
  }
  return absl::InvalidArgumentError(absl::StrCat("weight format \"", std::string(name),
                                                 "\": one of ",
                                                 absl::StrJoin(WeightFormatNames(), ", ")));
}

std::vector<std::string> WeightFormatNames() {
  std::vector<std::string> names;
  for (const auto& [n, dtype] : kFloatFormats) names.emplace_back(n);
  for (const auto& [n, type] : kBlockFormats) names.emplace_back(n);
  return names;
}

double ModelWeightBytes(const ModelShape& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double embeddings = (m.tie_word_embeddings ? 1.0 : 2.0) * m.vocab_size * h;
  const double params = static_cast<double>(m.num_layers) * LayerParams(m) + embeddings + h;
  return params * m.weight_bytes_per_element;
}

double GemmFlopsPerTokenPerLayer(const ModelShape& m) {
  return 2 * GemmParamsPerLayer(m, m.top_k);  // a multiply and an add per weight
}

double GemmWeightBytesPerLayer(const ModelShape& m) {
  return m.weight_bytes_per_element * GemmParamsPerLayer(m, m.num_experts);
}

double GemmIntensity(const ModelShape& m, double n) {
  return n * GemmFlopsPerTokenPerLayer(m) / GemmWeightBytesPerLayer(m);
}

double KvBytesPerToken(const ModelShape& m) {
  return (m.kv_value_in_key ? 1.0 : 2.0) * static_cast<double>(m.num_layers) *
         static_cast<double>(m.num_kv_heads) * static_cast<double>(m.head_dim) *
         m.kv_bytes_per_element;
}

double KvBytesPerSequenceToken(const ModelShape& m, double context_tokens) {
  const double all = KvBytesPerToken(m);
  if (m.window_layers <= 0 || m.sliding_window <= 0 || context_tokens <= m.sliding_window) {
    return all;
  }
  const double per_layer = all / static_cast<double>(m.num_layers);
  const double window = static_cast<double>(m.window_layers);
  return per_layer * (static_cast<double>(m.num_layers) - window +
                      window * static_cast<double>(m.sliding_window) / context_tokens);
}

// Eq. 2: I >= C_GPU / B_IO with I ~ n N_k / N_e (FLOP per byte: 2 FLOP per weight over
// weight_bytes_per_element bytes, which is 1 in bf16 as the paper assumes).
double TokensToSaturateGpuEq2(const ModelShape& m, const HardwareSpec& hw) {
  return hw.gpu_flops / hw.pcie_bytes_per_s * static_cast<double>(m.num_experts) /
         static_cast<double>(m.top_k) * m.weight_bytes_per_element / 2.0;
}

double TokensToSaturateGpu(const ModelShape& m, const HardwareSpec& hw) {
  return hw.gpu_flops / (hw.pcie_bytes_per_s * GemmIntensity(m, 1.0));
}

double KvBytesToSaturateGpu(const ModelShape& m, const HardwareSpec& hw, int64_t seq_len) {
  return TokensToSaturateGpuEq2(m, hw) * static_cast<double>(seq_len) * KvBytesPerToken(m);
}

double LayerWeightBytes(const ModelShape& m) { return LayerParams(m) * m.weight_bytes_per_element; }

double TransferredWeightBytes(const ModelShape& m) {
  return m.transferred_weight_bytes > 0 ? m.transferred_weight_bytes : ModelWeightBytes(m);
}

double WeightTransferSeconds(const ModelShape& m, const HardwareSpec& hw) {
  return TransferredWeightBytes(m) / hw.pcie_bytes_per_s;
}

double GpuTokensPerSecond(const ModelShape& m, const HardwareSpec& hw) {
  return hw.gpu_flops / (static_cast<double>(m.num_layers) * GemmFlopsPerTokenPerLayer(m));
}

double ParallelismMemoryEfficiency(int64_t p, int64_t g) {
  const double pd = static_cast<double>(p), gd = static_cast<double>(g);
  return 2 * (pd + gd) / ((2 * pd + gd) * gd);
}

double MaxThroughput(double pme, double m, double iteration_s, double gpu_tokens_per_s) {
  return std::min(pme * m / iteration_s, gpu_tokens_per_s);
}

double RequiredCpuMemoryBandwidth(double kv_bytes, double weight_bytes, double pcie_bytes_per_s) {
  return (kv_bytes + weight_bytes) / weight_bytes * pcie_bytes_per_s;
}

double CpuMemorySeconds(double kv_bytes, double weight_bytes, double cpu_mem_bytes_per_s) {
  return (kv_bytes + weight_bytes) / cpu_mem_bytes_per_s;
}

double EffectiveKvCapacity(double c_kv, int64_t p, int64_t g) {
  const double pd = static_cast<double>(p), gd = static_cast<double>(g);
  return (pd + gd) / (pd + gd / 2) * c_kv;
}

int64_t LifetimeKvBlocks(int64_t p, int64_t g, int64_t b) {
  // sum_{x=p..p+g} ceil(x / b) = F(p + g) - F(p - 1), F(n) = sum_{x=1..n} ceil(x / b): with
  // n = c b + r (0 <= r < b), the c full groups give b (1 + ... + c) and the r rest c + 1 each.
  const auto f = [b](int64_t n) {
    const int64_t c = n / b, r = n % b;
    return b * (c * (c + 1) / 2) + r * (c + 1);
  };
  return f(p + g) - f(p - 1);
}

double PrefillSequencesPerIteration(int64_t n_blocks, int64_t p, int64_t g, int64_t b) {
  return static_cast<double>(n_blocks) / static_cast<double>(LifetimeKvBlocks(p, g, b));
}

double SeparateDecodeSequences(int64_t n_blocks, int64_t p, int64_t g, int64_t b) {
  return static_cast<double>(n_blocks) / static_cast<double>((p + g + b - 1) / b);
}

double MemoryBoundThroughput(int64_t k, int64_t g, double q, double iteration_s) {
  if (!(q > 0)) return 0.0;
  const double kd = static_cast<double>(k), gd = static_cast<double>(g);
  return kd * gd / ((kd / q + gd) * iteration_s);
}

double PrefillTokensPerIteration(double gpu_tokens_per_iteration, int64_t p, int64_t g) {
  return gpu_tokens_per_iteration * static_cast<double>(p) / static_cast<double>(p + g);
}

double PipelineIterations(int64_t k, int64_t p, int64_t g, double gpu_tokens_per_iteration) {
  const double kd = static_cast<double>(k), pd = static_cast<double>(p),
               gd = static_cast<double>(g);
  const double t_prefill = PrefillTokensPerIteration(gpu_tokens_per_iteration, p, g);
  const double eq12 =
      2 * gd + (kd * pd - (t_prefill + gpu_tokens_per_iteration) / 2 * gd) / t_prefill;
  const double small_batch = gd + kd * pd / gpu_tokens_per_iteration;
  const double work = kd * (pd + gd) / gpu_tokens_per_iteration;
  return std::max({eq12, small_batch, work});
}

double ComputeBoundThroughput(int64_t k, int64_t g, double iterations, double iteration_s) {
  return static_cast<double>(k) * static_cast<double>(g) / (iterations * iteration_s);
}

absl::Status ValidatePerfInputs(const ModelShape& model, const HardwareSpec& hw,
                                const Workload& workload) {
  if (absl::Status s = ValidateModel(model); !s.ok()) return s;
  if (absl::Status s = ValidateHardware(hw); !s.ok()) return s;
  if (absl::Status s = ValidateWorkload(workload); !s.ok()) return s;
  if (workload.kv_budget_bytes > hw.kv_memory_bytes) {
    return FieldError(
        "workload.kv_budget_bytes",
        absl::StrCat("(", workload.kv_budget_bytes, ") exceeds hardware.kv_memory_bytes (",
                     hw.kv_memory_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Stage1Result> PredictStage1(const ModelShape& model, const HardwareSpec& hw,
                                           const Workload& workload) {
  if (absl::Status s = ValidatePerfInputs(model, hw, workload); !s.ok()) return s;
  return Stage1(model, hw, workload);
}

absl::StatusOr<Stage2Result> PredictStage2(const ModelShape& model, const HardwareSpec& hw,
                                           const Workload& workload) {
  if (absl::Status s = ValidatePerfInputs(model, hw, workload); !s.ok()) return s;
  return Stage2(model, hw, workload);
}

absl::StatusOr<std::vector<BoundTransition>> FindBoundTransitions(
    const ModelShape& model, const HardwareSpec& hw, const Workload& workload, PerfStage stage,
    double min_kv_bytes, double max_kv_bytes) {
  if (absl::Status s = ValidateModel(model); !s.ok()) return s;
  if (absl::Status s = ValidateHardware(hw); !s.ok()) return s;
  if (absl::Status s = ValidateWorkload(workload); !s.ok()) return s;
  if (absl::Status s = CheckPositive("max_kv_bytes", max_kv_bytes); !s.ok()) return s;
  if (!(min_kv_bytes > 0) || !(min_kv_bytes < max_kv_bytes)) {
    return FieldError("min_kv_bytes", absl::StrCat("must be in (0, max_kv_bytes = ", max_kv_bytes,
                                                   "), got ", min_kv_bytes));
  }
  constexpr double kStepsPerDoubling = 16;
  constexpr double kRelTolerance = 1e-6;
  const int steps =
      static_cast<int>(std::ceil(std::log2(max_kv_bytes / min_kv_bytes) * kStepsPerDoubling));
  const double ratio = std::pow(max_kv_bytes / min_kv_bytes, 1.0 / steps);
  std::vector<BoundTransition> out;
  double lo = min_kv_bytes;
  LimitingBound lo_bound = BoundAt(model, hw, workload, stage, lo);
  for (int i = 1; i <= steps; ++i) {
    const double hi_end = i == steps ? max_kv_bytes : min_kv_bytes * std::pow(ratio, i);
    const LimitingBound hi_bound = BoundAt(model, hw, workload, stage, hi_end);
    if (hi_bound != lo_bound) {
      // Bisect (geometrically) for the smallest budget with a bound other than lo_bound.
      double a = lo, b = hi_end;
      LimitingBound b_bound = hi_bound;
      while (b / a - 1 > kRelTolerance) {
        const double mid = std::sqrt(a * b);
        const LimitingBound mid_bound = BoundAt(model, hw, workload, stage, mid);
        if (mid_bound == lo_bound) {
          a = mid;
        } else {
          b = mid;
          b_bound = mid_bound;
        }
      }
      out.push_back({b, lo_bound, b_bound, b <= hw.kv_memory_bytes});
      // A further change inside this step (b_bound != hi_bound) is found from b on.
      if (b_bound != hi_bound) {
        lo = b;
        lo_bound = b_bound;
        --i;  // scan the rest of this step again from b
        continue;
      }
    }
    lo = hi_end;
    lo_bound = hi_bound;
  }
  return out;
}

}  // namespace moebatch
