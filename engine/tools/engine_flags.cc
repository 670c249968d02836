#include "engine/tools/engine_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, backend, "auto",
          "auto, cpu or cuda. auto runs the cpu backend: the cuda backend is compiled but not yet "
          "validated on a GPU (docs/performance.md), so it runs only when asked for");
ABSL_FLAG(int32_t, gpu_device, 0, "CUDA device ordinal for --backend=cuda");
ABSL_FLAG(double, gpu_memory_gb, 0.0,
          "--backend=cuda: GPU memory the engine may use, GiB, a hard budget (16 emulates a T4, "
          "24 an L4); 0: the device's free memory");
ABSL_FLAG(int64_t, weight_packet_mb, 64, "--backend=cuda: the data mover's packet size, MiB");
ABSL_FLAG(int64_t, gpu_resident_layers, -1,
          "--backend=cuda: layers kept on the GPU for good, the rest streamed (-1: as many as the "
          "GPU budget leaves room for after the pass's buffers; 0: stream every layer)");
ABSL_FLAG(bool, profile_token_budget, true,
          "--backend=cuda: profile the pipeline at start-up (MoE-Lens §6.3) and cap the tokens per "
          "pass at n_real");
ABSL_FLAG(std::string, profile_dir, "",
          "where pipeline profiles are cached (moebatchd: its --data_dir when unset)");
ABSL_FLAG(
    double, peak_memory_gbs, 0.0,
    "peak bandwidth of the memory weights and KV are read from, GB/s, for S-MBU (0: unknown)");
ABSL_FLAG(double, peak_tflops, 0.0, "peak GEMM compute, TFLOP/s, for S-MFU (0: unknown)");
ABSL_FLAG(std::string, trace_file, "",
          "write a Chrome trace (chrome://tracing, Perfetto) of every pass's device calls and CPU "
          "tasks to this file when the engine stops");
ABSL_FLAG(
    std::string, vslpipe, "auto",
    "on, off or auto: run passes of two or more sequences as two micro-batches in the VSLPipe "
    "CPU/device pipeline (MoE-Lens §6.4); auto: on for the cuda backend, off for the cpu "
    "backend");
ABSL_FLAG(std::string, compute_dtype, "f32", "f32 (reference) or bf16 (oneDNN bf16 GEMMs)");
ABSL_FLAG(bool, batch_invariant, true,
          "cpu backend: matmuls in a fixed order per row, so a greedy request's output does not "
          "depend on what else shares its passes (identical after a crash restart); false: each "
          "matmul's faster path for its size (oneDNN for prefill-sized ones: faster prefill, "
          "outputs may differ in the last bits with the batch)");
ABSL_FLAG(std::string, mxfp4_activations, "f32",
          "cpu backend, a Hugging Face checkpoint's MXFP4 experts (gpt-oss): f32 (the weights "
          "widened exactly in registers: transformers' results, the speed of a bf16 checkpoint) "
          "or int8 (activations quantized per 32 as llama.cpp does: ~2.5x faster at batch 1, "
          "logits within ~5e-2 of transformers'). A GGUF file's MXFP4 always takes int8");
ABSL_FLAG(std::string, q8_0_activations, "auto",
          "cpu backend, Q8_0 weights (a GGUF file's, or --weight_dtype int8): int8 (activations "
          "quantized per 32 as llama.cpp does: its results), f32 (the 8-bit weights widened "
          "exactly: the dequantized model's results; on CPUs without VNNI 1.3-1.5x faster GEMMs "
          "at prefill sizes, 1.2-1.4x slower at batch 1) or auto (int8 where the CPU has "
          "AVX-512 VNNI, f32 elsewhere)");
ABSL_FLAG(std::string, kv_dtype, "", "KV cache element type f32|bf16|f16 (default: compute dtype)");
ABSL_FLAG(double, kv_cache_gb, 1.0,
          "host memory for the paged KV cache, GiB (0: what --host_memory_gb, or the memory "
          "available, leaves after the weights, less 1 GiB and the pass's host buffers)");
ABSL_FLAG(int64_t, kv_block_size, 16, "token slots per KV block");
ABSL_FLAG(int64_t, max_num_seqs, 0,
          "sequences holding KV cache at once (0: no limit but the tokens per pass, so decode "
          "can fill a pass)");
ABSL_FLAG(int64_t, max_tokens_per_pass, 0,
          "prefill + decode tokens per forward pass, the ceiling (0: the cuda backend's GPU budget "
          "holds the activations of, lowered to the profiled n_real; the cpu backend's 2048)");
ABSL_FLAG(int32_t, cpu_threads, 0,
          "CPU threads for attention and the cpu backend (0: one per CPU this process may use, "
          "at most its cgroup's CPU quota)");
ABSL_FLAG(bool, pin_cpu_threads, false,
          "pin CPU thread i to the i-th CPU this process may use (false: the threads float, or "
          "keep OpenMP's binding when OMP_PROC_BIND is set)");
ABSL_FLAG(std::string, weights, "mapped",
          "where the weights live: mapped (the safetensors files, read in place), host (copied "
          "into one host region per layer, as the cuda backend streams them) or synthetic "
          "(generated from config.json, for benchmarks without the checkpoint)");
ABSL_FLAG(std::string, weight_dtype, "",
          "with --weights=host|synthetic: store weights as bf16|f16|f32 (default: the model's); "
          "int8|int4: quantize the weight matrices at load, round to nearest in groups of "
          "--weight_group_size (a copy: --weights=mapped becomes host)");
ABSL_FLAG(int64_t, weight_group_size, 32,
          "with --weight_dtype=int8|int4: elements sharing one scale, a multiple of 32");
ABSL_FLAG(int64_t, synthetic_layers, 0, "with --weights=synthetic: layers to generate (0: all)");
ABSL_FLAG(uint64_t, synthetic_seed, 0, "with --weights=synthetic: seed of the generated values");
ABSL_FLAG(std::string, chat_template, "",
          "the chat layout of chat requests: chatml, qwen1.5, qwen2.5, qwen3, smollm2, llama3, "
          "llama3.1, llama3.2, harmony for a tokenizer.json model, mistral-v1 or mistral-v3 for a "
          "tokenizer.model one (empty: the layout recognised from the model's chat template; "
          "with a template moebatch does not recognise the model loads, prompts run and chat "
          "requests are refused naming this flag)");
ABSL_FLAG(bool, verify_weights, false,
          "check every weight for NaN and infinity at load (one pass over the weights; the small "
          "tensors are always checked) and refuse a checkpoint that holds one, naming the tensor");
ABSL_FLAG(bool, dry_run, false,
          "print the engine's plan (backend, weights, tokens per pass, KV cache) from config.json "
          "and the options, without loading the weights, and exit");
ABSL_FLAG(double, host_memory_gb, 0.0,
          "host memory the weights (host|synthetic) and the KV cache must fit in, GiB (0: what "
          "the kernel reports available)");

namespace moebatch {

void ShowEngineFlagsInHelp() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "_main.cc") || absl::EndsWith(file, "engine_flags.cc");
  };
  absl::SetFlagsUsageConfig(config);
}

absl::StatusOr<EngineOptions> EngineOptionsFromFlags(const std::string& model_dir) {
  EngineOptions options;
  options.model_dir = model_dir;
  auto compute = DTypeFromString(absl::GetFlag(FLAGS_compute_dtype));
  if (!compute || (*compute != DType::kF32 && *compute != DType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat("--compute_dtype: must be f32 or bf16, got '",
                                                   absl::GetFlag(FLAGS_compute_dtype), "'"));
  }
  options.cpu.compute_dtype = *compute;
  options.cpu.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  if (const std::string a = absl::GetFlag(FLAGS_mxfp4_activations); a == "f32" || a == "int8") {
    options.cpu.mxfp4_f32_activations = a == "f32";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--mxfp4_activations: must be f32 or int8, got '", a, "'"));
  }
  if (const std::string a = absl::GetFlag(FLAGS_q8_0_activations); a == "f32" || a == "int8") {
    options.cpu.q8_0_f32_activations = a == "f32";
  } else if (a != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--q8_0_activations: must be auto, int8 or f32, got '", a, "'"));
  }
  if (const std::string kv = absl::GetFlag(FLAGS_kv_dtype); !kv.empty()) {
    options.kv.dtype = DTypeFromString(kv);
    if (!options.kv.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv_dtype: must be f32, bf16 or f16, got '", kv, "'"));
    }
  }
  options.backend = absl::GetFlag(FLAGS_backend);
  if (options.backend != "auto") {
    std::vector<std::string> names;
    for (const Backend* b : RegisteredBackends()) names.emplace_back(b->name());
    if (std::find(names.begin(), names.end(), options.backend) == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--backend: must be auto or one of ",
                                                     absl::StrJoin(names, ", "), ", got '",
                                                     options.backend, "'"));
    }
  }
  options.gpu.device = absl::GetFlag(FLAGS_gpu_device);
  const double gpu_gb = absl::GetFlag(FLAGS_gpu_memory_gb);
  if (gpu_gb < 0 || !std::isfinite(gpu_gb)) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu_memory_gb: must be >= 0, got ", gpu_gb));
  }
  options.gpu.memory_bytes = static_cast<int64_t>(gpu_gb * (int64_t{1} << 30));
  const int64_t packet_mb = absl::GetFlag(FLAGS_weight_packet_mb);
  if (packet_mb <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_packet_mb: must be positive, got ", packet_mb));
  }
  options.gpu.packet_bytes = packet_mb << 20;
  options.gpu.resident_layers = absl::GetFlag(FLAGS_gpu_resident_layers);
  if (options.gpu.resident_layers < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu_resident_layers: must be >= -1 (-1: automatic), got ", options.gpu.resident_layers));
  }
  if (const std::string v = absl::GetFlag(FLAGS_vslpipe); v == "on") {
    options.schedule.vslpipe = true;
  } else if (v == "off") {
    options.schedule.vslpipe = false;
  } else if (v != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--vslpipe: must be on, off or auto, got '", v, "'"));
  }
  options.metrics.trace_file = absl::GetFlag(FLAGS_trace_file);
  options.schedule.profile_token_budget = absl::GetFlag(FLAGS_profile_token_budget);
  options.schedule.profile_dir = absl::GetFlag(FLAGS_profile_dir);
  const double peak_gbs = absl::GetFlag(FLAGS_peak_memory_gbs);
  const double peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  if (peak_gbs < 0 || peak_tflops < 0 || !std::isfinite(peak_gbs) || !std::isfinite(peak_tflops)) {
    return absl::InvalidArgumentError("--peak_memory_gbs and --peak_tflops: must be >= 0");
  }
  options.metrics.peak_memory_bytes_per_second = peak_gbs * 1e9;
  options.metrics.peak_flops = peak_tflops * 1e12;
  const double kv_gb = absl::GetFlag(FLAGS_kv_cache_gb);
  if (!(kv_gb >= 0) || !std::isfinite(kv_gb)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_cache_gb: must be >= 0 (0: automatic), got ", kv_gb));
  }
  options.kv.bytes = static_cast<int64_t>(kv_gb * (int64_t{1} << 30));
  options.kv.block_size = absl::GetFlag(FLAGS_kv_block_size);
  options.text.chat_template = absl::GetFlag(FLAGS_chat_template);
  options.schedule.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  options.schedule.max_tokens_per_pass = absl::GetFlag(FLAGS_max_tokens_per_pass);
  if (options.schedule.max_num_seqs < 0 || options.schedule.max_tokens_per_pass < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.schedule.max_num_seqs < 0 ? "--max_num_seqs" : "--max_tokens_per_pass",
                     ": must be >= 0 (0: automatic), got ",
                     options.schedule.max_num_seqs < 0 ? options.schedule.max_num_seqs
                                                       : options.schedule.max_tokens_per_pass));
  }
  options.cpu.threads = absl::GetFlag(FLAGS_cpu_threads);
  options.cpu.pin_threads = absl::GetFlag(FLAGS_pin_cpu_threads);

  const std::string weights = absl::GetFlag(FLAGS_weights);
  auto source = WeightSourceFromString(weights);
  if (!source) {
    return absl::InvalidArgumentError(
        absl::StrCat("--weights: must be mapped, host or synthetic, got '", weights, "'"));
  }
  options.weights.source = *source;
  const int64_t group_size = absl::GetFlag(FLAGS_weight_group_size);
  if (group_size <= 0 || group_size % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_group_size: must be a positive multiple of 32, got ", group_size));
  }
  if (const std::string wd = absl::GetFlag(FLAGS_weight_dtype); wd == "int8" || wd == "int4") {
    options.weights.quantize =
        WeightQuantization{wd == "int8" ? GgmlType::kQ8_0 : GgmlType::kQ4_1, group_size};
    if (options.weights.source == WeightSource::kMapped) {
      options.weights.source = WeightSource::kHostCopy;
    }
  } else if (!wd.empty()) {
    options.weights.dtype = DTypeFromString(wd);
    if (!options.weights.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("--weight_dtype: must be bf16, f16, f32, int8 or int4, got '", wd, "'"));
    }
    if (options.weights.source == WeightSource::kMapped) {
      return absl::InvalidArgumentError(
          "--weight_dtype: needs --weights=host or --weights=synthetic (mapped weights are read "
          "as stored)");
    }
  }
  options.weights.synthetic_layers = absl::GetFlag(FLAGS_synthetic_layers);
  if (options.weights.synthetic_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--synthetic_layers: must be >= 0, got ", options.weights.synthetic_layers));
  }
  options.weights.synthetic_seed = absl::GetFlag(FLAGS_synthetic_seed);
  options.weights.verify = absl::GetFlag(FLAGS_verify_weights);
  const double host_gb = absl::GetFlag(FLAGS_host_memory_gb);
  if (host_gb < 0 || !std::isfinite(host_gb)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host_memory_gb: must be >= 0, got ", host_gb));
  }
  options.host_memory_bytes = static_cast<int64_t>(host_gb * (int64_t{1} << 30));
  return options;
}

bool DryRunRequested() { return absl::GetFlag(FLAGS_dry_run); }

absl::Status PrintDryRun(const EngineOptions& options) {
  auto plan = Engine::Plan(options);
  if (!plan.ok()) return plan.status();
  std::printf("%s\n", plan->ToString().c_str());
  return absl::OkStatus();
}

}  // namespace moebatch
