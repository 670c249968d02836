// moebatch-plan: the MoE-Lens performance model (§5, engine/plan/perf_model.h) for a model, a host
// and a batch workload. Prints the Stage 1 bound and the Stage 2 prediction (tokens/s), the bound
// that limits each (PCIe, GPU compute, KV capacity, CPU attention) and the KV budgets at which it
// changes.
//
//   moebatch-plan --preset mixtral-8x7b --gpu a40 [--pcie_gbs 19.5] [--kv_cache_gb 70]
//       [--prompt_tokens 98 --gen_tokens 128 --batch 20000 --kv_block_size 16]
//   moebatch-plan --model DIR --pcie_gbs 12.3 --gpu_tflops 50 --cpu_mem_gbs 80 --kv_cache_gb 100
//   moebatch-plan --preset mixtral-8x7b --gpu t4 --weight_format q4_k
//   moebatch-plan --model FILE.gguf --backend cpu [--cpu_mem_gbs 25 --cpu_gflops 130]
//
// --backend cpu prints the cpu backend's roofline instead: for decode passes of a few batch sizes
// and for prefill passes, the bytes and FLOPs a pass needs, the memory and compute times they
// take at the host's bandwidth and FMA peak (measured here unless given), and which one bounds it
// (engine/plan/cpu_roofline.h).
//
// --weight_format sets the bytes of a weight (the model's dtype by default; a GGUF --model's own
// bytes per weight): a float dtype or a ggml block format (type_size / block_size bytes, Q4_K
// 0.5625), for the weight transfer (delta) and, with --gpu, the cuda backend's device plan: layer
// regions of blocks in the weight slots and the scratch each matrix is dequantized into.
//
// Flags are the engine's where the idea is the same (engine/tools/engine_flags.cc): --kv_cache_gb
// in GiB, --kv_block_size in tokens; dashes or underscores (engine/tools/program_flags.h).
// Hardware figures: --gpu gives datasheet figures (below); measured ones are better and override
// them: --pcie_gbs from bench_cuda_backend's pinned H2D bandwidth (the paper measured 19.5 GB/s on
// its A40 host, §8, against the link's 32), --gpu_tflops from its GEMM timings, --cpu_mem_gbs from
// bench_attention_bandwidth (what CPU attention reaches, not the DIMMs' peak). Rates: GB/s with
// GB = 1e9 bytes (as the engine's --peak_memory_gbs), TFLOP/s; KV memory: GiB = 2^30 bytes.
// Exit status: 0 on success, 2 on bad flag values (including a --model directory without a
// readable, valid config.json), with a message on stderr; Abseil's own parser exits 1 on an unknown
// or malformed flag (and on --help).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cpu_attention/runtime/host_roof.h"
#include "engine/engine.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_tensors.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_store.h"
#include "engine/offload/gpu_memory_plan.h"
#include "engine/plan/cpu_roofline.h"
#include "engine/plan/perf_model.h"
#include "engine/tools/program_flags.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (its config.json is read)");
ABSL_FLAG(std::string, preset, "",
          "model preset instead of --model: mixtral-8x7b | mixtral-8x22b | qwen3-30b-a3b | "
          "qwen2-57b-a14b | olmoe-1b-7b | llama-3.1-8b | dbrx | deepseek-v2-lite | gpt-oss-20b");
ABSL_FLAG(std::string, gpu, "",
          "GPU preset for --pcie_gbs and --gpu_tflops: t4 | l4 | a40 | l40 | a100 (datasheet "
          "figures; explicit flags override them)");
ABSL_FLAG(double, pcie_gbs, 0,
          "B_IO, CPU->GPU bandwidth, GB/s, GB = 1e9 bytes (0: the --gpu preset's)");
ABSL_FLAG(double, gpu_tflops, 0,
          "C_GPU, dense GEMM rate in the weights' dtype, TFLOP/s (0: the --gpu preset's)");
ABSL_FLAG(double, cpu_mem_gbs, 0,
          "CPU memory bandwidth available to CPU attention and the weight transfer, GB/s, "
          "GB = 1e9 bytes (0: for --backend cuda 150, the paper's Xeon 8380 socket, §7; for "
          "--backend cpu measured here)");
ABSL_FLAG(double, kv_cache_gb, 70,
          "host memory for the KV cache, GiB, as the engine's --kv_cache_gb (70: the paper's "
          "smallest, §7)");
ABSL_FLAG(int64_t, prompt_tokens, 98, "p, average prompt length, tokens (98: MTBench, Table 3)");
ABSL_FLAG(int64_t, gen_tokens, 128, "g, generated tokens per sequence");
ABSL_FLAG(int64_t, batch, 20000, "K, sequences in the batch (20000: the paper's MTBench runs)");
ABSL_FLAG(int64_t, kv_block_size, 16, "b, token slots per KV block, as the engine's");
ABSL_FLAG(
    std::string, weight_format, "",
    "how the weights are stored: bf16 | f16 | f32 | q4_0 | q4_1 | q5_0 | q5_1 | q8_0 | q4_k | "
    "q5_k | q6_k | mxfp4 | int8 | int4 (--weight_dtype's Q8_0 / Q4_1); empty: the model's "
    "dtype, or a GGUF --model's own types");
ABSL_FLAG(std::string, backend, "cuda",
          "cuda: the MoE-Lens model of weights streamed to a GPU (needs --gpu or --pcie_gbs and "
          "--gpu_tflops); cpu: the cpu backend's roofline per pass (decode and prefill passes "
          "against --cpu_mem_gbs and --cpu_gflops, measured on this host when not given)");
ABSL_FLAG(double, cpu_gflops, 0,
          "--backend cpu: the host's f32 FMA peak, GFLOP/s, all threads (0: measured here)");
ABSL_FLAG(std::string, cpu_decode_batches, "1,64,256",
          "--backend cpu: the sequences per decode pass to show, comma-separated");
ABSL_FLAG(int64_t, resident_layers, -1,
          "-1: delta moves Model Size, every parameter, as §5.2 has it; N >= 0: what moebatch "
          "moves, the decoder layers but N (the embedding stays on the host, lm_head and N layers "
          "on the GPU: the engine's --gpu_resident_layers)");

namespace moebatch {
namespace {

constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct GpuPreset {
  const char* name;
  const char* description;
  double pcie_gbs;    // one direction of the host link, GB/s
  double gpu_tflops;  // dense tensor-core rate in the dtype the engine uses there, TFLOP/s
  double memory_gib;  // device memory, GiB
  DType dtype;        // what the cuda backend computes in there (bf16 from sm_80; f16 on the T4)
};

// Sources. PCIe: the link's nominal rate per direction, as the paper's eq. 2 example uses it for
// the A40 (B = 32 GB/s for Gen4 x16; NVIDIA's datasheets give 64 GB/s for both directions
// together); Gen3 x16 (T4) is 16 GB/s. GEMM rates: dense (not "with sparsity") tensor-core figures.
//   T4: NVIDIA T4 datasheet, 65 TFLOPS mixed precision FP16/FP32 (no bf16 on Turing: the engine
//       stores f16 weights there, same 2 bytes); PCIe Gen3 x16.
//   L4: NVIDIA L4 datasheet, BF16 tensor core 242 TFLOPS with sparsity = 121 dense; PCIe Gen4 x16.
//   A40, L40, A100: the paper's Table 2 (150, 181, 312 TFLOPS BF16; NVIDIA's datasheets give
//       149.7, 181.05 and 312 dense); PCIe Gen4 x16 (the A100 PCIe card; an SXM board's host link
//       is Gen4 x16 too).
constexpr GpuPreset kGpuPresets[] = {
    {"t4", "NVIDIA T4 (datasheet)", 16, 65, 16, DType::kF16},
    {"l4", "NVIDIA L4 (datasheet)", 32, 121, 24, DType::kBF16},
    {"a40", "NVIDIA A40 (paper Table 2)", 32, 150, 48, DType::kBF16},
    {"l40", "NVIDIA L40 (paper Table 2)", 32, 181, 48, DType::kBF16},
    {"a100", "NVIDIA A100 (paper Table 2)", 32, 312, 80, DType::kBF16},
};

std::string Bytes(double bytes) {
  if (std::isinf(bytes)) return "never";
  if (bytes >= 1e12) return absl::StrFormat("%.2f TB", bytes / 1e12);
  if (bytes >= kGB) return absl::StrFormat("%.1f GB", bytes / kGB);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  return absl::StrFormat("%.0f B", bytes);
}

// A KV size as --kv_cache_gb takes it, GiB, and in GB: "70.0 GiB (75.2 GB)".
std::string KvBytes(double bytes) {
  if (std::isinf(bytes)) return "never";
  return absl::StrFormat("%.1f GiB (%s)", bytes / kGiB, Bytes(bytes));
}

// What moebatch's cuda backend would put on `gpu` for `config`: the plan it makes at start-up
// (PlanGpuDevice: the budget the device's memory leaves after 1 GiB for CUDA, the tokens per pass
// that budget holds activations for, the layers kept resident beside them), before the pipeline
// profiler lowers the tokens per pass to n_real. Float weights are stored in the GPU's compute
// dtype; a block format keeps the layer's matrices in its blocks (the store's layout: routers and
// norms in the compute dtype; a matrix whose rows are not whole blocks would stay float, which
// this does not model) and adds the dequantization scratch.
void PrintDevicePlan(const ModelConfig& config, const GpuPreset& gpu, const WeightFormat& format) {
  const int64_t budget = static_cast<int64_t>(gpu.memory_gib * kGiB) - (int64_t{1} << 30);
  std::optional<WeightQuantization> quantize;
  if (format.quant) quantize = WeightQuantization{*format.quant, 32};
  const int64_t layer_bytes = WeightStore::LayerRegionBytes(config, gpu.dtype, 256, quantize);
  const int64_t dequant_bytes = quantize ? GpuDequantScratchBytes(config, gpu.dtype) : 0;
  auto plan = PlanGpuDevice(config, gpu.dtype, layer_bytes, config.num_hidden_layers, 0, budget, -1,
                            dequant_bytes);
  const std::string weights = format.quant
                                  ? absl::StrCat(GgmlTypeInfoOf(*format.quant).name, " weights (",
                                                 std::string(DTypeName(gpu.dtype)), " compute)")
                                  : absl::StrCat(std::string(DTypeName(gpu.dtype)), " weights");
  std::printf("\nmoebatch on this GPU (the cuda backend's start-up plan, GiB = 2^30 bytes)\n");
  std::printf(
      "  budget              %.1f GiB (%.0f GiB less 1 GiB for CUDA), %s, %.2f GiB "
      "per layer\n",
      budget / kGiB, gpu.memory_gib, weights.c_str(), layer_bytes / kGiB);
  if (!plan.ok()) {
    std::printf("  does not fit        %s\n", std::string(plan.status().message()).c_str());
    return;
  }
  std::printf("  tokens per pass     %lld (automatic; the profiler lowers it to n_real)\n",
              static_cast<long long>(plan->tokens_per_pass));
  std::printf("  resident layers     %lld of %lld\n", static_cast<long long>(plan->resident_layers),
              static_cast<long long>(config.num_hidden_layers));
  std::printf("  device memory       %s\n", plan->ToString().c_str());
}

// What the engine would do with --model on this host (Engine::Plan, what `moebatch-run --dry_run`
// prints; the backend --backend=auto picks), with this run's KV cache and block size.
// With --weight_format int8 or int4, the engine's --weight_dtype of that name.
void PrintEnginePlan(const std::string& model_dir, double kv_cache_gb, int64_t block_size,
                     const WeightFormat& format) {
  EngineOptions options;
  options.model_dir = model_dir;
  if (format.name == "int8" || format.name == "int4") {
    options.weights.quantize = WeightQuantization{*format.quant, 32};
  }
  options.backend = "auto";
  options.kv.bytes = static_cast<int64_t>(kv_cache_gb * kGiB);
  options.kv.block_size = block_size;
  std::printf("\nmoebatch on this host (Engine::Plan, as moebatch-run --dry_run prints it)\n");
  auto plan = Engine::Plan(options);
  if (!plan.ok()) {
    std::printf("  no plan: %s\n", std::string(plan.status().message()).c_str());
    return;
  }
  for (const absl::string_view line : absl::StrSplit(plan->ToString(), '\n')) {
    std::printf("  %s\n", std::string(line).c_str());
  }
}

void PrintTransitions(const absl::StatusOr<std::vector<BoundTransition>>& transitions,
                      double budget, double lo, double hi) {
  if (!transitions.ok()) {
    std::printf("  bound changes       (search failed: %s)\n",
                std::string(transitions.status().message()).c_str());
    return;
  }
  if (transitions->empty()) {
    std::printf("  bound changes       none for KV budgets from %s to %s\n", KvBytes(lo).c_str(),
                KvBytes(hi).c_str());
    return;
  }
  bool first = true;
  for (const BoundTransition& t : *transitions) {
    std::printf(
        "  %-19s at %s: %s -> %s%s\n", first ? "bound changes" : "",
        KvBytes(t.kv_budget_bytes).c_str(), std::string(LimitingBoundName(t.below)).c_str(),
        std::string(LimitingBoundName(t.above)).c_str(),
        t.kv_budget_bytes > budget
            ? (t.within_kv_memory ? " (a larger budget)" : " (more than this host's KV memory)")
            : " (a smaller budget)");
    first = false;
  }
}

// --backend cpu: the roofline of decode passes of each --cpu_decode_batches size (every sequence at
// context p + g / 2, the middle of its generation) and of prefill passes (one prompt; as many
// prompts of p tokens as the cpu backend's 2048 tokens per pass hold), engine/plan/cpu_roofline.h.
void PrintCpuRoofline(const ModelShape& m, const Workload& w, const std::vector<int64_t>& batches,
                      double mem_bytes_per_s, double flops_per_s, const std::string& host_note) {
  const HostCeilings host{mem_bytes_per_s, flops_per_s};
  std::printf(
      "CPU roofline per pass (cpu backend, engine/plan/cpu_roofline.h): memory %.1f GB/s, "
      "f32 FMA peak %.1f GFLOP/s%s\n",
      mem_bytes_per_s / kGB, flops_per_s / 1e9, host_note.c_str());
  std::printf("  %-30s %10s %10s %10s %10s %10s %8s %12s\n", "pass", "weights", "KV", "GFLOP",
              "memory ms", "compute ms", "bound", "tokens/s");
  auto row = [&](const std::string& name, const PassWork& work, double tokens) {
    const Roofline r = RooflineOf(work, host);
    std::printf("  %-30s %10s %10s %10.2f %10.3f %10.3f %8s %12.1f\n", name.c_str(),
                Bytes(work.weight_bytes).c_str(), Bytes(work.kv_bytes).c_str(), work.flops / 1e9,
                r.memory_seconds * 1e3, r.compute_seconds * 1e3, r.bound_name(),
                r.seconds() > 0 ? tokens / r.seconds() : 0.0);
  };
  const int64_t context = w.prompt_tokens + w.gen_tokens / 2;
  for (int64_t b : batches) {
    row(absl::StrCat("decode ", b, " x 1, context ", context), DecodePassWork(m, b, context),
        static_cast<double>(b));
  }
  constexpr int64_t kCpuTokensPerPass = 2048;  // the cpu backend's default pass
  const int64_t prompts =
      std::max<int64_t>(1, kCpuTokensPerPass / std::max<int64_t>(1, w.prompt_tokens));
  for (int64_t n : {int64_t{1}, prompts}) {
    row(absl::StrCat("prefill ", n, " x ", w.prompt_tokens), PrefillPassWork(m, n, w.prompt_tokens),
        static_cast<double>(n * w.prompt_tokens));
  }
  std::printf(
      "  (tokens/s: the pass's tokens over its bound, the most it can do; a pass that takes "
      "longer names here what it waits on)\n");
}

int Run(int argc, char** argv) {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string preset = absl::GetFlag(FLAGS_preset);
  auto usage = [](const std::string& message) {
    std::cerr << "moebatch-plan: " << message << " (see --help)\n";
    return 2;
  };
  if (argc > 1) return usage(absl::StrCat("unexpected argument \"", argv[1], "\""));
  if (model_dir.empty() == preset.empty()) {
    return usage(absl::StrCat("give exactly one of --model DIR or --preset ",
                              absl::StrJoin(KnownModelConfigNames(), "|")));
  }

  // The model.
  ModelConfig config;
  std::string model_name;
  if (!preset.empty()) {
    if (auto known = KnownModelConfig(preset)) {
      config = *known;
    } else {
      return usage(absl::StrCat("unknown --preset \"", preset, "\" (one of ",
                                absl::StrJoin(KnownModelConfigNames(), ", "), ")"));
    }
    model_name = absl::StrCat(preset, " (preset)");
  } else {
    auto loaded = LoadModelConfig(model_dir);
    if (!loaded.ok()) {
      return usage(
          absl::StrCat("cannot read --model ", model_dir, ": ", loaded.status().message()));
    }
    config = *std::move(loaded);
    model_name = model_dir;
  }
  auto shape = ModelShapeFromConfig(config, config.torch_dtype, DType::kBF16);
  if (!shape.ok()) {
    return usage(absl::StrCat("--model ", model_dir, ": ", shape.status().message()));
  }
  // The weights' format: the flag's, else a GGUF file's own (its bytes over its parameters, named
  // by the type holding most of them), else the model's dtype.
  WeightFormat format;
  format.name = std::string(DTypeName(config.torch_dtype));
  format.dtype = config.torch_dtype;
  format.bytes_per_element = static_cast<double>(DTypeSize(config.torch_dtype));
  if (const std::string name = absl::GetFlag(FLAGS_weight_format); !name.empty()) {
    auto parsed = ParseWeightFormat(name);
    if (!parsed.ok()) return usage(absl::StrCat("--weight_format: ", parsed.status().message()));
    format = *std::move(parsed);
  } else if (config.mxfp4_experts) {
    // gpt-oss's official checkpoints: the routed experts in MXFP4 (17 bytes per 32 weights: 4.25
    // bits), everything else in torch_dtype.
    ModelShape count = *shape;
    count.weight_bytes_per_element = 1;
    const double params = ModelWeightBytes(count);
    const double expert_params = static_cast<double>(shape->num_layers) * shape->num_experts * 3 *
                                 shape->hidden_size * shape->ffn_size;
    format.name = absl::StrCat("MXFP4 experts + ", std::string(DTypeName(config.torch_dtype)));
    format.bytes_per_element =
        ((params - expert_params) * DTypeSize(config.torch_dtype) + expert_params * 17.0 / 32.0) /
        params;
  } else if (!model_dir.empty() && IsGgufFile(model_dir)) {
    auto file = GgufFile::Open(model_dir);
    if (!file.ok()) return usage(std::string(file.status().message()));
    auto bytes = GgufTensorBytes(**file, config);
    if (!bytes.ok()) return usage(std::string(bytes.status().message()));
    if (auto main = ParseWeightFormat(bytes->main_type); main.ok()) format = *std::move(main);
    format.name = absl::StrCat("GGUF ", bytes->main_type);
    format.bytes_per_element = static_cast<double>(bytes->total) /
                               static_cast<double>(std::max<int64_t>(1, bytes->params));
  }
  shape->weight_bytes_per_element = format.bytes_per_element;
  if (const int64_t r = absl::GetFlag(FLAGS_resident_layers); r >= 0) {
    if (r > std::max<int64_t>(0, shape->num_layers - 2)) {
      return usage(absl::StrCat("--resident_layers: at most ",
                                std::max<int64_t>(0, shape->num_layers - 2),
                                " (two layers always stream), got ", r));
    }
    shape->transferred_weight_bytes =
        static_cast<double>(shape->num_layers - r) * LayerWeightBytes(*shape);
  } else if (r < -1) {
    return usage(absl::StrCat("--resident_layers: must be >= -1, got ", r));
  }

  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "cuda" && backend != "cpu") {
    return usage(absl::StrCat("--backend: cuda or cpu, got \"", backend, "\""));
  }
  if (backend == "cpu") {
    Workload w;
    w.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
    w.gen_tokens = absl::GetFlag(FLAGS_gen_tokens);
    if (w.prompt_tokens < 1 || w.gen_tokens < 1) {
      return usage("--prompt_tokens and --gen_tokens must be positive");
    }
    std::vector<int64_t> batches;
    for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_cpu_decode_batches), ',')) {
      int64_t b = 0;
      if (!absl::SimpleAtoi(part, &b) || b < 1) {
        return usage(
            absl::StrCat("--cpu_decode_batches: \"", part, "\" is not a positive integer"));
      }
      batches.push_back(b);
    }
    double mem = absl::GetFlag(FLAGS_cpu_mem_gbs) * kGB;
    double flops = absl::GetFlag(FLAGS_cpu_gflops) * 1e9;
    if (!(mem >= 0) || !(flops >= 0) || !std::isfinite(mem) || !std::isfinite(flops)) {
      return usage("--cpu_mem_gbs and --cpu_gflops must be positive");
    }
    std::string note = " (given)";
    if (mem == 0 || flops == 0) {
      const MeasuredHost measured = MeasureHost();
      if (mem == 0) mem = measured.triad_bytes_per_s;
      if (flops == 0) flops = measured.fma_flops_per_s;
      note = absl::StrFormat(
          " (measured here, %d threads: STREAM triad %.1f GB/s, %s FMA loop "
          "%.1f GFLOP/s; given flags take precedence)",
          measured.threads, measured.triad_bytes_per_s / kGB, measured.fma_isa,
          measured.fma_flops_per_s / 1e9);
    }
    const ModelShape& m = *shape;
    std::printf(
        "model     %s: %lld layers, h %lld, h_i %lld, %lld experts top-%lld; weights %s "
        "(%s, %.4g bytes/weight), KV %.0f bytes/token\n",
        model_name.c_str(), static_cast<long long>(m.num_layers),
        static_cast<long long>(m.hidden_size), static_cast<long long>(m.ffn_size),
        static_cast<long long>(m.num_experts), static_cast<long long>(m.top_k),
        Bytes(ModelWeightBytes(m)).c_str(), format.name.c_str(), m.weight_bytes_per_element,
        KvBytesPerSequenceToken(
            m, static_cast<double>(w.prompt_tokens) + static_cast<double>(w.gen_tokens)));
    PrintCpuRoofline(m, w, batches, mem, flops, note);
    return 0;
  }

  // The host.
  const std::string gpu = absl::GetFlag(FLAGS_gpu);
  const GpuPreset* gpu_preset = nullptr;
  if (!gpu.empty()) {
    for (const GpuPreset& g : kGpuPresets) {
      if (gpu == g.name) gpu_preset = &g;
    }
    if (gpu_preset == nullptr) {
      return usage(absl::StrCat("unknown --gpu \"", gpu, "\" (t4, l4, a40, l40 or a100)"));
    }
  }
  double pcie_gbs = absl::GetFlag(FLAGS_pcie_gbs);
  double gpu_tflops = absl::GetFlag(FLAGS_gpu_tflops);
  const double cpu_mem_gbs =
      absl::GetFlag(FLAGS_cpu_mem_gbs) == 0 ? 150 : absl::GetFlag(FLAGS_cpu_mem_gbs);
  const double kv_cache_gb = absl::GetFlag(FLAGS_kv_cache_gb);  // GiB
  for (const auto& [flag, value] :
       {std::pair<const char*, double>{"pcie_gbs", pcie_gbs}, {"gpu_tflops", gpu_tflops}}) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return usage(absl::StrCat("--", flag, " must be positive, got ", value));
    }
  }
  if (pcie_gbs == 0) {
    if (gpu_preset == nullptr) return usage("give --pcie_gbs or a --gpu preset");
    pcie_gbs = gpu_preset->pcie_gbs;
  }
  if (gpu_tflops == 0) {
    if (gpu_preset == nullptr) return usage("give --gpu_tflops or a --gpu preset");
    gpu_tflops = gpu_preset->gpu_tflops;
  }
  HardwareSpec hw;
  hw.pcie_bytes_per_s = pcie_gbs * kGB;
  hw.gpu_flops = gpu_tflops * 1e12;
  hw.cpu_mem_bytes_per_s = cpu_mem_gbs * kGB;
  hw.kv_memory_bytes = kv_cache_gb * kGiB;

  Workload w;
  w.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  w.gen_tokens = absl::GetFlag(FLAGS_gen_tokens);
  w.batch_size = absl::GetFlag(FLAGS_batch);
  w.block_size = absl::GetFlag(FLAGS_kv_block_size);
  w.kv_budget_bytes = hw.kv_memory_bytes;

  // Validation errors name the struct field; say which flag that is.
  if (absl::Status s = ValidatePerfInputs(*shape, hw, w); !s.ok()) {
    std::string message(s.message());
    const std::pair<const char*, const char*> flag_of[] = {
        {"hardware.pcie_bytes_per_s", "--pcie_gbs"},
        {"hardware.gpu_flops", "--gpu_tflops"},
        {"hardware.cpu_mem_bytes_per_s", "--cpu_mem_gbs"},
        {"hardware.kv_memory_bytes", "--kv_cache_gb"},
        {"workload.kv_budget_bytes", "--kv_cache_gb"},
        {"workload.prompt_tokens", "--prompt_tokens"},
        {"workload.gen_tokens", "--gen_tokens"},
        {"workload.batch_size", "--batch"},
        {"workload.block_size", "--kv_block_size"}};
    for (const auto& [field, flag] : flag_of) {
      if (message.rfind(field, 0) == 0) message = absl::StrCat(flag, " (", message, ")");
    }
    return usage(message);
  }
  auto s1 = PredictStage1(*shape, hw, w);
  auto s2 = PredictStage2(*shape, hw, w);
  if (!s1.ok() || !s2.ok()) {
    return usage(std::string((s1.ok() ? s2.status() : s1.status()).message()));
  }
  const double lo = w.kv_budget_bytes / 4096, hi = w.kv_budget_bytes * 4096;
  const auto t1 = FindBoundTransitions(*shape, hw, w, PerfStage::kStage1, lo, hi);
  const auto t2 = FindBoundTransitions(*shape, hw, w, PerfStage::kStage2, lo, hi);

  const ModelShape& m = *shape;
  std::printf("MoE-Lens performance model (§5); GB = 1e9 bytes, GiB = 2^30 bytes, tokens/s\n");
  std::printf(
      "model     %s: %lld layers, h %lld, h_i %lld, %lld experts top-%lld, %lld/%lld heads "
      "x %lld\n",
      model_name.c_str(), static_cast<long long>(m.num_layers),
      static_cast<long long>(m.hidden_size), static_cast<long long>(m.ffn_size),
      static_cast<long long>(m.num_experts), static_cast<long long>(m.top_k),
      static_cast<long long>(m.num_heads), static_cast<long long>(m.num_kv_heads),
      static_cast<long long>(m.head_dim));
  std::printf(
      "          weights %s (%s, %.4g bytes/weight), KV %.0f bytes/token (bf16), %.4g "
      "GFLOP/token\n",
      Bytes(ModelWeightBytes(m)).c_str(), format.name.c_str(), m.weight_bytes_per_element,
      KvBytesPerToken(m), s1->flops_per_token / 1e9);
  if (m.window_layers > 0) {
    const int64_t context = w.prompt_tokens + w.gen_tokens;
    std::printf(
        "          %lld of %lld layers attend the last %lld tokens (their KV blocks behind it are "
        "freed): KV %.0f bytes/token at p + g = %lld tokens (%.2fx)\n",
        static_cast<long long>(m.window_layers), static_cast<long long>(m.num_layers),
        static_cast<long long>(m.sliding_window),
        KvBytesPerSequenceToken(m, static_cast<double>(context)), static_cast<long long>(context),
        KvBytesPerSequenceToken(m, static_cast<double>(context)) / KvBytesPerToken(m));
  }
  if (m.transferred_weight_bytes > 0) {
    std::printf("          moved per iteration %s (%lld streamed layers of %s)\n",
                Bytes(s1->model_bytes).c_str(),
                static_cast<long long>(m.num_layers - absl::GetFlag(FLAGS_resident_layers)),
                Bytes(LayerWeightBytes(m)).c_str());
  }
  std::printf(
      "hardware  %sB_IO %.1f GB/s, C_GPU %.1f TFLOP/s, CPU memory %.1f GB/s, KV memory %s\n",
      gpu_preset ? absl::StrCat(gpu_preset->description, ": ").c_str() : "", pcie_gbs, gpu_tflops,
      cpu_mem_gbs, KvBytes(hw.kv_memory_bytes).c_str());
  std::printf("workload  p %lld, g %lld, K %lld sequences, b %lld tokens/block, KV budget %s\n\n",
              static_cast<long long>(w.prompt_tokens), static_cast<long long>(w.gen_tokens),
              static_cast<long long>(w.batch_size), static_cast<long long>(w.block_size),
              KvBytes(w.kv_budget_bytes).c_str());

  std::printf("Stage 1: upper bound (§5.2, K -> inf, b = 1)\n");
  std::printf("  delta               %.3f s per weight transfer\n", s1->delta_s);
  std::printf("  T_GPU               %.1f tokens/s\n", s1->gpu_tokens_per_s);
  std::printf("  n to saturate GPU   %.0f tokens/iteration (eq. 2 as printed: %.0f)\n",
              s1->tokens_to_saturate, s1->tokens_to_saturate_eq2);
  std::printf("  PME (eq. 3)         %.6f; M = %.0f tokens (eq. 7 effective %.0f)\n", s1->pme,
              s1->kv_tokens, s1->effective_kv_tokens);
  std::printf("  CPU memory (eq. 5)  %.1f GB/s needed, %.1f given\n",
              s1->required_cpu_mem_bytes_per_s / kGB, cpu_mem_gbs);
  std::printf(
      "  T_max (eq. 4)       %.1f tokens/s processed = %.1f generated tokens/s "
      "(GPU %.1f%%)\n",
      s1->max_tokens_per_s, s1->max_generated_tokens_per_s, 100 * s1->gpu_utilization);
  std::printf("  limiting bound      %s\n", std::string(LimitingBoundName(s1->bound)).c_str());
  PrintTransitions(t1, w.kv_budget_bytes, lo, hi);

  std::printf("\nStage 2: prediction (§5.5, K = %lld, b = %lld)\n",
              static_cast<long long>(w.batch_size), static_cast<long long>(w.block_size));
  std::printf("  KV blocks N         %lld\n", static_cast<long long>(s2->kv_blocks));
  std::printf("  q (eq. 8)           %.2f sequences prefilled per iteration\n", s2->q);
  std::printf("  decoding (eq. 9)    g q = %.0f sequences (separate prefill/decode: %.0f)\n",
              s2->decode_sequences, s2->separate_decode_sequences);
  std::printf("  T1 (eq. 10)         %.1f generated tokens/s (memory side)\n", s2->t1_tokens_per_s);
  std::printf(
      "  T2 (eq. 13)         %.1f generated tokens/s (compute side, It = %.1f "
      "iterations%s)\n",
      s2->t2_tokens_per_s, s2->iterations,
      s2->pipeline_filled ? "" : ", batch too small to fill the pipeline");
  std::printf("  T (eq. 14)          %.1f generated tokens/s (GPU %.1f%%)\n", s2->tokens_per_s,
              100 * s2->gpu_utilization);
  std::printf("  limiting bound      %s\n", std::string(LimitingBoundName(s2->bound)).c_str());
  PrintTransitions(t2, w.kv_budget_bytes, lo, hi);
  if (gpu_preset != nullptr) PrintDevicePlan(config, *gpu_preset, format);
  if (!model_dir.empty()) PrintEnginePlan(model_dir, kv_cache_gb, w.block_size, format);
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  // --help lists the flags of this file (Abseil's default looks for a file named after the
  // program).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "moebatch_plan_main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> args = moebatch::ParseProgramFlags(
      argc, argv,
      "the MoE-Lens performance model: predicted throughput, its limiting bound, and the KV "
      "budget at which the bound changes.\n  moebatch-plan --preset mixtral-8x7b --gpu a40 "
      "[--pcie_gbs 19.5 --kv_cache_gb 70 --prompt_tokens 98 --gen_tokens 128 --batch 20000]");
  return moebatch::Run(static_cast<int>(args.size()), args.data());
}
