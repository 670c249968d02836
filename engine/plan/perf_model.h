// The MoE-Lens performance model (MoE-Lens §5): what throughput a host can reach on a batch job,
// which resource limits it, and how much KV cache it takes to move the limit.
//
//   Stage 1 (§5.1-§5.4, eq. 1-7): the upper bound. GEMM intensity I (eq. 1), the tokens n that
//     saturate the GPU (eq. 2), the parallelism-memory efficiency PME (eq. 3), the bound
//     T_max = min(PME * M / delta, T_GPU) (eq. 4), the CPU memory bandwidth it needs (eq. 5) and
//     the KV capacity prefill/decode overlap effectively gives (eq. 7). No batch limit (K -> inf),
//     one-token KV blocks.
//   Stage 2 (§5.5, eq. 8-14): a finite batch of K sequences and a paged KV cache of N blocks of b
//     tokens: q sequences prefilled per iteration (eq. 8), g*q decoding at once (eq. 9), the
//     memory-side throughput T1 (eq. 10), the compute-side throughput T2 (eq. 11-13) and
//     T = min(T1, T2) (eq. 14). It tends to Stage 1 as K -> inf and b -> 1 (§5.5).
//
// Symbols are the paper's: h hidden size, h_i expert FFN width, N_e experts, N_k experts per
// token (top-k), s = GQA group size (heads / KV heads), n tokens processed in parallel, B_IO the
// CPU->GPU (PCIe) bandwidth, C_GPU the GPU's GEMM rate, p prompt tokens, g generated tokens, M the
// KV cache in tokens, delta = Model Size / B_IO, K sequences in the batch, b tokens per KV block, N
// KV blocks.
//
// Units: bytes, seconds, FLOP (one multiply or one add), tokens; rates per second. Throughputs
// are tokens per second: Stage 1's T_max counts every token processed, prompt and generated (the
// paper says only "tokens/sec"; PME * M counts p + g tokens per sequence and T_GPU every token the
// GPU processes, so that is how eq. 4 reads), Stage 2's T counts generated tokens (eq. 10, 13:
// K g over the time). Stage 1 also reports T_max * g / (p + g), its generated-token rate, which
// is what Stage 2 converges to.
//
// Beyond the paper's equations, one bound is added: CPU attention. §5.3 (eq. 5) derives the CPU
// memory bandwidth the pipeline needs (the weights read for the transfer plus the KV cache read by
// CPU decode attention, every iteration) and argues it is usually available. When the given CPU
// bandwidth is below it, an iteration cannot be shorter than (KV bytes read + weight bytes) / CPU
// bandwidth, which then replaces delta as the iteration time. Give the bandwidth CPU attention
// actually reaches (bench/attention_bandwidth measures it), not the DIMMs' peak.
//
// Pure arithmetic; thread-safe. The scalar equation functions take already-validated numbers
// (positive, finite; they never abort, but return inf or NaN on others); the Predict* and Find*
// functions validate their structs and return InvalidArgument naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/dtype.h"
#include "engine/model/ggml_type.h"
#include "engine/model/model_config.h"

namespace moebatch {

// The model dimensions the performance model needs.
struct ModelShape {
  int64_t num_layers = 0;   // L
  int64_t hidden_size = 0;  // h
  int64_t ffn_size = 0;     // h_i, one expert's FFN width
  // Beyond the paper's Mixtral shape: a shared expert of this width run for every token in every
  // MoE layer (Qwen2-MoE; 0: none), and the share of layers whose FFN is one dense FFN of
  // dense_ffn_size instead of the routed experts (a dense model: 1; Qwen-MoE's mlp_only_layers).
  int64_t shared_ffn_size = 0;
  double dense_layer_fraction = 0;
  int64_t dense_ffn_size = 0;
  int64_t num_experts = 0;           // N_e
  int64_t top_k = 0;                 // N_k, experts per token
  int64_t num_heads = 0;             // query heads
  int64_t num_kv_heads = 0;          // KV heads; s = num_heads / num_kv_heads
  int64_t head_dim = 0;              // elements per head
  int64_t vocab_size = 0;            // embedding rows (and lm_head rows)
  bool tie_word_embeddings = false;  // lm_head shares the embedding (counted once)
  // Bytes per stored weight element (2: bf16/f16; a ggml block format's type_size / block_size,
  // e.g. Q4_K 0.5625: WeightFormat). One figure for every parameter: the embedding, lm_head,
  // routers and norms, which a quantized checkpoint may keep wider, are ~1% of an MoE's bytes.
  double weight_bytes_per_element = 2;
  double kv_bytes_per_element = 2;  // bytes per KV cache element (2: bf16, the engine's)
  // Bytes one iteration moves to the GPU (and reads from CPU memory for it). 0: Model Size, every
  // parameter, as §5.2 has it. A system that keeps some weights on the GPU (moebatch: lm_head, the
  // resident layers) and gathers the embedding on the host moves less: give that here.
  double transferred_weight_bytes = 0;
  // Multi-head latent attention (DeepSeek): the cache row per token and layer is one latent row of
  // head_dim values (num_kv_heads 1, no separate V), and the attention's projections hold
  // mla_attention_params weights per layer instead of the GQA formula's. 0: GQA.
  bool kv_value_in_key = false;
  double mla_attention_params = 0;
  // Layers whose attention reads only the last sliding_window tokens (gpt-oss's sliding layers,
  // every layer of a model with sliding_window): the engine frees their KV blocks behind the
  // window (engine/kv/kv_cache.h), so their rows stop growing with the context. 0: none.
  int64_t window_layers = 0;
  int64_t sliding_window = 0;
};

// The hardware figures, measured where possible.
struct HardwareSpec {
  double pcie_bytes_per_s = 0;     // B_IO: CPU->GPU weight transfer bandwidth, bytes/s
  double gpu_flops = 0;            // C_GPU: GPU GEMM rate, FLOP/s (dense, the weights' dtype)
  double cpu_mem_bytes_per_s = 0;  // CPU memory bandwidth available to transfer + attention, B/s
  double kv_memory_bytes = 0;      // CPU memory the host can give to the KV cache, bytes
};

// The batch job.
struct Workload {
  int64_t prompt_tokens = 0;   // p, average prompt length, tokens
  int64_t gen_tokens = 0;      // g, generated tokens per sequence
  int64_t batch_size = 0;      // K, sequences in the batch (Stage 2)
  int64_t block_size = 0;      // b, token slots per KV block (Stage 2)
  double kv_budget_bytes = 0;  // C_KV, the KV cache size, bytes (<= HardwareSpec::kv_memory_bytes)
};

// What limits the throughput.
enum class LimitingBound {
  // Iterations are one weight transfer (delta) long and the batch is too small to amortize it:
  // Stage 2 when the g drain iterations of eq. 10 / eq. 12 outweigh the iterations that admit the
  // batch (K/q for T1, K < g q; It - g for T2). A larger batch or a faster link helps; a larger
  // KV cache hardly does.
  kPcie,
  // The GPU's GEMM rate: T_GPU (eq. 4) is the minimum, or T2 < T1 (eq. 13) with the GPU-limited
  // admission taking at least g iterations.
  kGpuCompute,
  // The KV cache holds too few tokens to give each weight transfer enough work: PME * M / delta
  // (eq. 4), or T1 <= T2 (eq. 10) with K >= g q. More KV cache helps until the bound changes.
  kKvCapacity,
  // The CPU's memory bandwidth (KV reads of decode attention plus the weight transfer, eq. 5)
  // makes an iteration longer than delta.
  kCpuAttention,
};

// "PCIe", "GPU compute", "KV capacity", "CPU attention".
std::string_view LimitingBoundName(LimitingBound bound);

// How the weights are stored, for the model's bytes: a float dtype or one of ggml's block formats
// (engine/model/ggml_type.h; the cuda backend streams the blocks and dequantizes them on the GPU,
// the cpu backend computes on them in place).
struct WeightFormat {
  std::string name;               // as given: "bf16", "q4_k", "int4", ...
  std::optional<DType> dtype;     // a float format
  std::optional<GgmlType> quant;  // a block format
  double bytes_per_element = 2;   // DTypeSize, or type_size / block_size (GgmlTypeInfoOf)
};

// The format named `name`, case-insensitive: bf16, f16, f32; the ggml block types q4_0, q4_1,
// q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, mxfp4; int8 and int4, moebatch's load-time quantization
// (--weight_dtype: Q8_0 and Q4_1). InvalidArgument listing them otherwise.
absl::StatusOr<WeightFormat> ParseWeightFormat(std::string_view name);

// The names ParseWeightFormat takes, for messages and --help.
std::vector<std::string> WeightFormatNames();

// ---- Model quantities (pure; `model` must be valid) ----

// The shape of a Mixtral config. Weights stored as `weight_dtype`, the KV cache as `kv_dtype`.
// InvalidArgument (naming the config key) for non-positive sizes, heads not divisible by KV heads
// or top-k above the number of experts.
absl::StatusOr<ModelShape> ModelShapeFromConfig(const ModelConfig& config, DType weight_dtype,
                                                DType kv_dtype = DType::kBF16);

// Model Size of delta (§5.2): every parameter (embedding, layers, lm_head unless tied, norms,
// routers) times weight_bytes_per_element. Bytes. Mixtral-8x7B in bf16: 93.4e9 (the paper: 94 GB).
double ModelWeightBytes(const ModelShape& model);

// Eq. 1's numerator per token and layer: GEMM FLOP of the q, k, v, o projections and N_k experts'
// three matrices, 2 * (3 N_k h h_i + 2 h (heads*head_dim) + 2 h (kv_heads*head_dim)); with
// heads*head_dim = h and kv_heads*head_dim = h/s it is the paper's 6 N_k h h_i + 4 h^2 + 4 h^2/s.
// FLOP per token per layer. (Router and lm_head GEMMs are left out, as in eq. 1.)
double GemmFlopsPerTokenPerLayer(const ModelShape& model);

// Eq. 1's denominator: bytes of those weights for all N_e experts, per layer,
// weight_bytes_per_element * (3 N_e h h_i + 2 h (heads*head_dim) + 2 h (kv_heads*head_dim));
// in bf16 the paper's 6 N_e h h_i + 4 h^2 + 4 h^2/s. Bytes per layer.
double GemmWeightBytesPerLayer(const ModelShape& model);

// Eq. 1: the GEMM arithmetic-to-IO intensity of n tokens processed in parallel,
// I = n * (6 N_k h h_i + 4 h^2 + 4 h^2/s) / (6 N_e h h_i + 4 h^2 + 4 h^2/s) ~ n N_k / N_e.
// FLOP per byte of weights moved. The first form is implemented: the paper's middle form,
// n (6 m N_k + 2 + 2/s) / (6 m N_e + 2 + 2/s) with h_i = m h, halves the h^2 terms but not the
// expert terms (dividing by h^2 gives 4 + 4/s); for Mixtral-8x7B (m = 3.5, s = 4) the first form
// is 47/173 per token, the middle one 44.5/170.5.
double GemmIntensity(const ModelShape& model, double n);

// KV cache bytes per token: 2 (K and V) * L * kv_heads * head_dim * kv_bytes_per_element, or
// L * head_dim * kv_bytes_per_element for MLA's latent rows (kv_value_in_key).
// Mixtral-8x7B in bf16: 131072; DeepSeek-V2-Lite: 27 * 576 * 2 = 31104.
double KvBytesPerToken(const ModelShape& model);

// The KV cache bytes a sequence of `context_tokens` tokens holds, per token: KvBytesPerToken with
// each window layer's rows counted for min(context_tokens, sliding_window) tokens only. Equal to
// KvBytesPerToken without window layers. gpt-oss-20b in bf16 (24 layers, 12 with a window of 128,
// 8 KV heads x 64): 49152 bytes per token at 128 tokens, 27648 at 1024.
double KvBytesPerSequenceToken(const ModelShape& model, double context_tokens);

// ---- Stage 1 (§5.1-§5.4) ----

// Eq. 2 as the paper evaluates it (§5.1, Table 2): the tokens processed in parallel that saturate
// the GPU, n = C_GPU / B_IO * N_e / N_k (intensity approximated by n N_k / N_e; scaled by
// weight_bytes_per_element / 2 for weights other than 2 bytes). Tokens. The A40 gives
// 150e12 / 32e9 * 4 = 18750; Table 2 prints 19.2k, which is C in TFLOPS * 128, i.e. 1 TFLOP read
// as 1024 GFLOP (2.4% more).
double TokensToSaturateGpuEq2(const ModelShape& model, const HardwareSpec& hw);

// Eq. 2 with eq. 1's intensity unsimplified: n = C_GPU / (B_IO * I(1)). Tokens. 8% below
// TokensToSaturateGpuEq2 for Mixtral-8x7B (17254 vs 18750 on the A40): the attention projections
// count in I.
double TokensToSaturateGpu(const ModelShape& model, const HardwareSpec& hw);

// Table 2's second row: the KV cache that holds n = TokensToSaturateGpuEq2 sequences of
// seq_len tokens each (n decode tokens in parallel, one per sequence). Bytes.
double KvBytesToSaturateGpu(const ModelShape& model, const HardwareSpec& hw, int64_t seq_len);

// One decoder layer's weights: attention projections, router, every expert, the two RMSNorms, times
// weight_bytes_per_element. Bytes. Model Size = L of these + the embedding, lm_head (unless tied)
// and the final norm. What moebatch streams per layer (engine/model/weight_store.h: one region a
// layer).
double LayerWeightBytes(const ModelShape& model);

// The bytes an iteration moves: model.transferred_weight_bytes, or Model Size when it is 0. Bytes.
double TransferredWeightBytes(const ModelShape& model);

// delta = TransferredWeightBytes / B_IO (§5.2: Model Size / B_IO): seconds to move the weights
// to the GPU once; one iteration (a forward pass over every layer) takes at least this long.
double WeightTransferSeconds(const ModelShape& model, const HardwareSpec& hw);

// T_GPU: tokens per second the GPU's GEMMs can process, C_GPU / (L * eq. 1's numerator).
double GpuTokensPerSecond(const ModelShape& model, const HardwareSpec& hw);

// Eq. 3: PME = (p + g) / sum_{j=0..g} (p + j) = 2 (p + g) / ((2p + g) g), tokens processed per
// token of KV cache held per iteration (1/token). The closed form is what is implemented: the
// printed sum has g + 1 terms and equals (g + 1)(2p + g) / 2, so it is not exactly the closed
// form; the closed form is the steady state of overlapped scheduling (M / (p + g/2) sequences in
// the cache, each processing (p + g) / g tokens per iteration), which is what eq. 4 needs.
double ParallelismMemoryEfficiency(int64_t p, int64_t g);

// Eq. 4: T_max = min(PME * M / delta, T_GPU), tokens processed per second. `pme` 1/token, `m`
// KV cache in tokens, `iteration_s` seconds (delta, or longer when CPU memory is the bound),
// `gpu_tokens_per_s` T_GPU.
double MaxThroughput(double pme, double m, double iteration_s, double gpu_tokens_per_s);

// Eq. 5: the CPU memory bandwidth a fully overlapped pipeline needs, B_Mem = B_KV + B_IO =
// (M_KV + M_weight) / M_weight * B_IO: the KV cache is read once per iteration of delta =
// M_weight / B_IO. The printed equation reads "B_KV + B_IO = M / (M_weight / B_IO)" with M "the
// total memory capacity", i.e. KV cache plus weights; so read. Bytes, bytes, bytes/s -> bytes/s.
double RequiredCpuMemoryBandwidth(double kv_bytes, double weight_bytes, double pcie_bytes_per_s);

// The shortest iteration CPU memory allows: (KV bytes read + weight bytes transferred) / CPU
// memory bandwidth (eq. 5 solved for the iteration time). Seconds.
double CpuMemorySeconds(double kv_bytes, double weight_bytes, double cpu_mem_bytes_per_s);

// Eq. 7: C_KV,eff = (p + g) / (p + g/2) * C_KV, the KV capacity prefill/decode overlap
// effectively gives (a sequence holds p + g/2 tokens on average instead of p + g). Same unit as
// c_kv (bytes or tokens).
double EffectiveKvCapacity(double c_kv, int64_t p, int64_t g);

// ---- Stage 2 (§5.5) ----

// Eq. 8's denominator: sum_{i=0..g} ceil((p + i) / b), the KV blocks one sequence holds summed
// over the g + 1 iterations of its life (prefill, then g generation steps). Blocks x iterations.
int64_t LifetimeKvBlocks(int64_t p, int64_t g, int64_t b);

// Eq. 8: q = N / sum_{i=0..g} ceil((p + i) / b), sequences prefilled per iteration so that the q
// sequences of each age 0..g together fill the N blocks. Sequences per iteration (not rounded:
// the paper's q is a rate).
double PrefillSequencesPerIteration(int64_t n_blocks, int64_t p, int64_t g, int64_t b);

// Eq. 9's right-hand side: sequences decoding at once when prefill and decode are separate
// stages and each sequence holds its maximum length from the start. The paper writes N / (p + g)
// with N counted in tokens (b = 1); with blocks it is N / ceil((p + g) / b). Sequences.
// (Eq. 9's left-hand side is g * q.)
double SeparateDecodeSequences(int64_t n_blocks, int64_t p, int64_t g, int64_t b);

// Eq. 10: T1 = K g / ((K/q + g) delta) = K / (K + g q) * g q / delta: the batch is admitted at q
// sequences per iteration (K/q iterations) and the last ones finish g iterations later.
// Generated tokens per second; 0 when q is 0.
double MemoryBoundThroughput(int64_t k, int64_t g, double q, double iteration_s);

// Eq. 11: T_prefill = T_GPU * p / (p + g), prompt tokens prefilled per iteration once the
// pipeline is full. Here and in eq. 12 T_GPU is in tokens per iteration (It counts iterations and
// §5.5 compares T_GPU with q (p + g), tokens per iteration): the n the GPU saturates at.
double PrefillTokensPerIteration(double gpu_tokens_per_iteration, int64_t p, int64_t g);

// Eq. 12: It = 2g + (K p - (T_prefill + T_GPU) / 2 * g) / T_prefill, iterations of the GPU-bound
// software pipeline (a g-iteration prologue prefilling at (T_prefill + T_GPU) / 2, the main part
// at T_prefill, a g-iteration epilogue). Eq. 12 simplifies to g + K (p + g) / T_GPU - g^2 / (2p).
// Two floors are ours, so that It stays physical where eq. 12's derivation does not hold:
//  - g + K p / T_GPU, for a batch too small to fill the prologue (K p below its
//    (T_prefill + T_GPU) / 2 * g tokens): the prompts prefilled at the GPU's full rate, then g
//    decode iterations. It meets eq. 12 at K = g T_GPU / (2p), below that threshold, so It stays
//    continuous and equals eq. 12 for every batch that fills the prologue;
//  - K (p + g) / T_GPU, the GPU's work: eq. 12 falls below it when g > 2p (its prologue estimate
//    is then too optimistic), which would make T2 exceed the GPU's own rate.
// It = max(eq. 12, g + K p / T_GPU, K (p + g) / T_GPU). Iterations.
double PipelineIterations(int64_t k, int64_t p, int64_t g, double gpu_tokens_per_iteration);

// Eq. 13: T2 = K g / (It delta), generated tokens per second. (The paper's lowercase k is K.)
double ComputeBoundThroughput(int64_t k, int64_t g, double iterations, double iteration_s);

// ---- Whole-model predictions ----

// (*) The iteration time with the CPU attention bound (our addition, see the top of this file):
// the shortest t >= delta in which CPU memory serves the weight transfer and the KV reads,
// t >= (KV read + Model Size) / CPU bandwidth. The KV read is what the memory side holds (Stage 1:
// the whole budget; Stage 2: the cache, or K of its g q sequence slots when K < g q), except that
// when the GPU is saturated only the KV of what the GPU processes in t is held and read. Equal to
// delta whenever the CPU bandwidth covers eq. 5's requirement.
// (**) Eq. 4's switch PME * M / delta = T_GPU is at PME * M = T_GPU * delta, which is eq. 2's n
// (TokensToSaturateGpu) scaled by Model Size over the layer GEMM weights (+0.6% for Mixtral-8x7B:
// embeddings, lm_head, routers and norms also cross PCIe in delta).
struct Stage1Result {
  double model_bytes = 0;                   // TransferredWeightBytes (Model Size by default)
  double delta_s = 0;                       // delta, seconds
  double flops_per_token = 0;               // L * eq. 1's numerator, FLOP
  double gpu_tokens_per_s = 0;              // T_GPU, tokens/s
  double tokens_to_saturate = 0;            // T_GPU * delta, tokens: where eq. 4 switches (**)
  double tokens_to_saturate_eq2 = 0;        // eq. 2 as printed (Table 2), tokens
  double pme = 0;                           // eq. 3, 1/token
  double kv_tokens = 0;                     // M, tokens
  double effective_kv_tokens = 0;           // eq. 7 applied to M, tokens
  double required_cpu_mem_bytes_per_s = 0;  // eq. 5 with the whole KV budget, bytes/s
  double kv_read_bytes = 0;                 // KV CPU attention reads per iteration, bytes (*)
  double cpu_iteration_s = 0;               // (kv_read_bytes + Model Size) / CPU bandwidth, seconds
  double iteration_s = 0;                   // max(delta, cpu_iteration_s), seconds (*)
  double parallel_tokens = 0;               // PME * M, tokens per iteration from the KV side
  double max_tokens_per_s = 0;              // T_max (eq. 4), tokens processed per second
  double max_generated_tokens_per_s = 0;    // T_max * g / (p + g), generated tokens/s
  double gpu_utilization = 0;               // T_max / T_GPU, in [0, 1]
  double saturating_kv_bytes = 0;           // KV budget where T_max reaches T_GPU, bytes (inf:
                                            // CPU memory never lets the GPU saturate)
  LimitingBound bound = LimitingBound::kKvCapacity;  // kKvCapacity, kGpuCompute, kCpuAttention
};

struct Stage2Result {
  double delta_s = 0;                       // delta, seconds
  int64_t kv_blocks = 0;                    // N = floor(C_KV / (b * KV bytes per token))
  int64_t lifetime_blocks = 0;              // eq. 8's denominator
  double q = 0;                             // eq. 8, sequences prefilled per iteration
  double decode_sequences = 0;              // g q, eq. 9's left-hand side
  double separate_decode_sequences = 0;     // eq. 9's right-hand side
  double kv_read_bytes = 0;                 // KV CPU attention reads per iteration, bytes (*)
  double kv_in_use_fraction = 0;            // kv_read_bytes / (N b KV bytes per token)
  double cpu_iteration_s = 0;               // (kv_read_bytes + Model Size) / CPU bandwidth, seconds
  double iteration_s = 0;                   // max(delta, cpu_iteration_s), seconds (*)
  double t1_tokens_per_s = 0;               // eq. 10, generated tokens/s
  double gpu_tokens_per_iteration = 0;      // T_GPU of eq. 11-12: T_GPU(tokens/s) * iteration_s
  double prefill_tokens_per_iteration = 0;  // eq. 11
  bool pipeline_filled = false;             // K p >= the prologue's (T_prefill + T_GPU) / 2 * g
  double iterations = 0;                    // It, eq. 12 with our floors (PipelineIterations)
  double t2_tokens_per_s = 0;               // eq. 13, generated tokens/s
  bool gpu_condition = false;               // the paper's "T_GPU < q (p + g)" (GPU-bound regime)
  double tokens_per_s = 0;                  // T = min(T1, T2), eq. 14, generated tokens/s
  double gpu_utilization = 0;               // T / (T_GPU * g / (p + g)), in [0, 1]
  LimitingBound bound = LimitingBound::kKvCapacity;
};

// InvalidArgument naming the field ("model.hidden_size", "hardware.gpu_flops",
// "workload.kv_budget_bytes", ...) when a size or rate is not positive and finite, p, g or b
// exceeds 1e9 tokens (keeps eq. 8's block sums inside int64), top_k exceeds num_experts,
// num_heads is not a multiple of num_kv_heads, or the KV budget exceeds hardware.kv_memory_bytes.
absl::Status ValidatePerfInputs(const ModelShape& model, const HardwareSpec& hw,
                                const Workload& workload);

// Stage 1 for the workload's p, g and KV budget (K and b are validated but unused: Stage 1 is
// K -> inf, b = 1). Bound: kGpuCompute when T_GPU is the minimum of eq. 4, else kCpuAttention when
// CPU memory makes the iteration longer than delta, else kKvCapacity.
absl::StatusOr<Stage1Result> PredictStage1(const ModelShape& model, const HardwareSpec& hw,
                                           const Workload& workload);

// Stage 2. Eq. 10 and eq. 12 both count admission iterations (K/q for T1; It - g for T2) plus g
// drain iterations. Bound: kCpuAttention when CPU memory stretches the iteration past delta
// while reading the memory side's KV; else, when admission takes at least g iterations, what
// limits admission (kKvCapacity for T1 <= T2, kGpuCompute for T2 < T1; kCpuAttention if the
// iteration is stretched); else kPcie (kCpuAttention if stretched).
absl::StatusOr<Stage2Result> PredictStage2(const ModelShape& model, const HardwareSpec& hw,
                                           const Workload& workload);

enum class PerfStage { kStage1, kStage2 };

// A KV budget at which the limiting bound changes.
struct BoundTransition {
  double kv_budget_bytes = 0;  // the bound is `above` from here up (to 1e-6 relative), bytes
  LimitingBound below = LimitingBound::kKvCapacity;  // the bound just under kv_budget_bytes
  LimitingBound above = LimitingBound::kKvCapacity;  // the bound at kv_budget_bytes
  bool within_kv_memory = false;                     // kv_budget_bytes <= hardware.kv_memory_bytes
};

// Every KV budget in [min_kv_bytes, max_kv_bytes] at which `stage`'s limiting bound changes, in
// increasing order, with everything else as in `workload` and `hw` (the search ignores
// hw.kv_memory_bytes as a limit and reports it in within_kv_memory). A geometric scan (16 points
// per doubling) finds the changes, bisection pins each to 1e-6 relative; two changes closer than
// one scan step may be missed. InvalidArgument for invalid inputs or min_kv_bytes not in
// (0, max_kv_bytes).
absl::StatusOr<std::vector<BoundTransition>> FindBoundTransitions(
    const ModelShape& model, const HardwareSpec& hw, const Workload& workload, PerfStage stage,
    double min_kv_bytes, double max_kv_bytes);

}  // namespace moebatch
