// Prefill and decode throughput of the cpu backend's forward, and of the whole engine on a batch.
//
//   bench_engine_throughput --model tests/fixtures/tiny-mixtral [--batch 64 --prompt_tokens 128
//       --gen_tokens 64 --compute_dtype f32 --batch_invariant]
//   bench_engine_throughput --model bench/models/qwen3-30b-a3b --synthetic_layers 4 ...
//       (a slice of a real shape: the first N layers with generated weights, no checkpoint)
//   bench_engine_throughput --model FILE.gguf --batch 1 --reps 1 --mem_gbs 25 --json_out r.json
//       (a GGUF file, its weights in their blocks; bench/cpu_vs_llama_cpp.sh runs this beside
//       llama.cpp's llama-batched-bench)
//
// Prints, for the model forward (ModelRunner over CpuDevice, one pass at a time):
//   prefill: --batch prompts of --prompt_tokens tokens in one pass -> tokens/s
//   decode : --batch sequences, one token each per pass, context growing from --prompt_tokens
//            -> tokens/s (averaged over --gen_tokens passes)
// and for the engine (scheduler + sampling + detokenization around the same forward): a greedy
// job of --batch requests -> generated tokens/s over the whole job.
// Next to each figure: achieved GFLOP/s (2 x active parameters per token, plus attention) against
// the host's peak f32 FMA rate measured by cpu_attention/runtime/host_roof.h (same thread count)
// right before and right after the prefill and the decode timings (their mean is the reference: a
// shared host's FMA rate drifts within a run, docs/performance.md);
// for prefill and decode also the weight bytes a pass reads (the experts its tokens touch, counted
// from the routing) and the process's peak RSS (getrusage).
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "absl/flags/flag.h"
#include "cpu_attention/backend/cpu_device.h"
#include "cpu_attention/runtime/host_roof.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/plan/cpu_roofline.h"
#include "engine/tools/program_flags.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "tests/fixtures/tiny-mixtral", "model directory");
ABSL_FLAG(int64_t, batch, 64, "sequences");
ABSL_FLAG(int64_t, prompt_tokens, 128, "prompt length");
ABSL_FLAG(int64_t, gen_tokens, 64, "decode passes / generated tokens per sequence");
ABSL_FLAG(std::string, compute_dtype, "f32", "f32 or bf16");
ABSL_FLAG(bool, batch_invariant, true,
          "the batch-invariant matmuls (cpu_attention/gemm/invariant_linear.h); false: oneDNN");
ABSL_FLAG(std::string, q8_0_activations, "auto",
          "Q8_0 weights: int8 (QuantLinear, llama.cpp's method), f32 (InvariantLinearQ8_0, "
          "widened exactly) or auto (the host's default, DefaultQ8_0F32Activations); as "
          "moebatch-run's flag");
ABSL_FLAG(int64_t, synthetic_layers, 0,
          "> 0: that many layers of generated weights (WeightStore::Synthetic) in the compute "
          "dtype instead of the checkpoint's (--model needs config.json only)");
ABSL_FLAG(double, mem_gbs, 0,
          "host memory bandwidth, GB/s (bench_attention_bandwidth's triad on the same host), for "
          "the memory-bandwidth bound of each phase (0: not printed)");
ABSL_FLAG(int64_t, reps, 3, "timed prefill passes (after one warm-up pass)");
ABSL_FLAG(std::string, json_out, "",
          "also write the figures to this file as one JSON object (bench/cpu_vs_llama_cpp.sh "
          "reads it)");
ABSL_FLAG(std::string, trace_file, "",
          "write the engine job's Chrome trace here (scripts/trace_summary.py reads it)");
ABSL_FLAG(bool, json_object, false,
          "JSON mode for every request (docs/api.md, \"JSON mode\"): the vocabulary mask's cost "
          "per generated token; a request then ends at EOS once its object is closed");
ABSL_FLAG(bool, vslpipe, false,
          "two micro-batches in the VSLPipe pipeline (engine/model_runner.h; the engine's default "
          "on the cpu backend is off)");

namespace moebatch {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// FLOPs of one token through the model at context length `ctx`: 2 x (attention projections,
// router, top-k experts, lm_head when `logits`) + attention 4 x ctx x q_size.
double TokenFlops(const ModelConfig& c, double ctx, bool logits) {
  const double h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  const double per_layer = 2 * (h * q + 2 * h * kv + q * h + h * c.num_local_experts +
                                c.num_experts_per_tok * 3 * h * inter) +
                           4 * ctx * q;
  return per_layer * c.num_hidden_layers + (logits ? 2 * h * c.vocab_size : 0);
}

// Bytes one pass reads from memory (engine/plan/cpu_roofline.h PassWorkOf: the layers' tensors
// once, the experts its tokens touched at the mean size of an expert over all layers (formats may
// differ between layers, as Q4_K_M's do), the embedding rows, the lm_head when logits are asked
// for, and the K/V of every sequence's context in every layer, in the cache's dtype). The bound of
// a phase is these bytes over the host's bandwidth. Stored bytes: the f32 reference mode reads
// widened f32 copies of bf16 weights, its bound still counts the stored bytes.
double PassBytes(const ModelConfig& c, const ModelWeights& weights, const ForwardStats& stats,
                 DType kv_dtype, bool logits) {
  const double kv_per_token_layer = 2.0 * static_cast<double>(c.kv_size() * DTypeSize(kv_dtype));
  const PassCounts counts{stats.tokens, stats.experts_touched, stats.expert_token_pairs,
                          stats.kv_tokens_read};
  return PassWorkOf(c, weights, counts, kv_per_token_layer, logits ? stats.tokens : 0).bytes();
}

double PeakRssGiB() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1048576.0;  // KiB on Linux
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int64_t prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int64_t gen = absl::GetFlag(FLAGS_gen_tokens);
  const auto dtype = DTypeFromString(absl::GetFlag(FLAGS_compute_dtype)).value_or(DType::kF32);
  const std::string q8_0_activations = absl::GetFlag(FLAGS_q8_0_activations);
  if (q8_0_activations != "auto" && q8_0_activations != "int8" && q8_0_activations != "f32") {
    std::fprintf(stderr, "--q8_0_activations: must be auto, int8 or f32, got '%s'\n",
                 q8_0_activations.c_str());
    return 2;
  }
  const int64_t synthetic_layers = absl::GetFlag(FLAGS_synthetic_layers);
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<WeightStore> store;
  if (synthetic_layers > 0) {
    auto config = LoadModelConfig(dir);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      return 1;
    }
    WeightStoreOptions store_options;
    store_options.dtype = dtype;
    auto synthetic = WeightStore::Synthetic(*config, synthetic_layers, 7, store_options);
    if (!synthetic.ok()) {
      std::fprintf(stderr, "%s\n", synthetic.status().ToString().c_str());
      return 1;
    }
    store = *std::move(synthetic);
  } else {
    auto loaded = Checkpoint::Load(dir);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
      return 1;
    }
    checkpoint = *std::move(loaded);
  }
  const ModelConfig& c = store ? store->config() : checkpoint->config();
  const ModelWeights& weights = store ? store->weights() : checkpoint->weights();
  CpuDeviceOptions device_options;  // the engine's defaults (widened-weight cache off)
  device_options.compute_dtype = dtype;
  device_options.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  device_options.q8_0_f32_activations =
      q8_0_activations == "auto" ? DefaultQ8_0F32Activations() : q8_0_activations == "f32";
  auto device = CpuDevice::Create(c, weights, device_options);
  if (!device.ok()) {
    std::fprintf(stderr, "%s\n", device.status().ToString().c_str());
    return 1;
  }
  auto model = std::make_unique<ModelRunner>(*std::move(device),
                                             ModelRunnerOptions{absl::GetFlag(FLAGS_vslpipe)});
  const int64_t bs = 16;
  const int64_t blocks_per_seq = BlocksForTokens(prompt + gen, bs);
  KvCacheConfig kc{
      c.num_hidden_layers, c.num_key_value_heads, c.head_dim, bs, batch * blocks_per_seq, dtype};
  auto cache = PagedKvCache::Create(kc);
  if (!cache.ok()) return 1;
  std::vector<std::vector<int32_t>> tables(batch);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t b = 0; b < blocks_per_seq; ++b) tables[s].push_back(s * blocks_per_seq + b);
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(c.vocab_size) - 1);
  // The host's f32 FMA peak in GFLOP/s, measured now (a short probe, same threads).
  const auto fma_peak = [] { return MeasureFmaPeak(6'250'000, 1).flops_per_s / 1e9; };
  const FmaPeak fma = MeasureFmaPeak(6'250'000, 1);
  const char* isa = fma.isa.c_str();
  const double peak = fma.flops_per_s / 1e9;
  std::printf("model %s: %lld layers, hidden %lld, %lld experts top-%lld; compute %s; %d threads\n",
              dir.c_str(), (long long)c.num_hidden_layers, (long long)c.hidden_size,
              (long long)c.num_local_experts, (long long)c.num_experts_per_tok,
              std::string(DTypeName(dtype)).c_str(), omp_get_max_threads());
  std::printf("host peak f32 FMA rate (measured at the start, %s, %d threads): %.1f GFLOP/s\n", isa,
              omp_get_max_threads(), peak);
  nlohmann::json result = {
      {"model", dir},
      {"batch", batch},
      {"prompt_tokens", prompt},
      {"gen_tokens", gen},
      {"compute_dtype", std::string(DTypeName(dtype))},
      {"q8_0_activations", device_options.q8_0_f32_activations ? "f32" : "int8"},
      {"threads", omp_get_max_threads()}};
  const auto write_result = [&result]() {
    const std::string path = absl::GetFlag(FLAGS_json_out);
    if (path.empty()) return 0;
    std::ofstream out(path);
    out << result.dump() << "\n";
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    return 0;
  };

  // Prefill: all prompts in one pass (logits for each last token, as the engine asks).
  ForwardBatch prefill;
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t t = 0; t < prompt; ++t) prefill.token_ids.push_back(token(rng));
    prefill.seqs.push_back(ForwardSequence{&tables[s], s * prompt, prompt, prompt, true});
  }
  std::vector<float> logits;
  (void)model->Forward(prefill, **cache, &logits);  // warm-up (primitive creation)
  const int64_t reps = std::max<int64_t>(1, absl::GetFlag(FLAGS_reps));
  const double mem_gbs = absl::GetFlag(FLAGS_mem_gbs);
  ForwardStats prefill_stats;
  const double prefill_peak_before = fma_peak();
  double t0 = Now();
  for (int64_t r = 0; r < reps; ++r) {
    prefill_stats = ForwardStats{};
    if (!model->Forward(prefill, **cache, &logits, &prefill_stats).ok()) return 1;
  }
  const double prefill_s = (Now() - t0) / reps;
  const double prefill_peak_after = fma_peak();
  const double prefill_peak = (prefill_peak_before + prefill_peak_after) / 2;
  const double prefill_tokens = double(batch) * prompt;
  const double prefill_flops = prefill_tokens * TokenFlops(c, prompt / 2.0, false) +
                               batch * 2.0 * c.hidden_size * c.vocab_size;
  std::printf(
      "prefill: %lld x %lld tokens in %.4f s: %.0f tokens/s, %.1f GFLOP/s (%.1f%% of the FMA peak "
      "measured before and after it, %.1f / %.1f GFLOP/s)\n",
      (long long)batch, (long long)prompt, prefill_s, prefill_tokens / prefill_s,
      prefill_flops / prefill_s / 1e9, 100.0 * prefill_flops / prefill_s / 1e9 / prefill_peak,
      prefill_peak_before, prefill_peak_after);
  result["prefill_gflops"] = prefill_flops / prefill_s / 1e9;
  result["prefill_fma_peak_gflops"] = prefill_peak;
  const double prefill_bytes = PassBytes(c, weights, prefill_stats, dtype, true);
  result["prefill_tokens_per_s"] = prefill_tokens / prefill_s;
  result["prefill_bytes_per_pass"] = prefill_bytes;
  std::printf("prefill: %.3f GB read per pass (%lld expert-layer visits)", prefill_bytes / 1e9,
              (long long)prefill_stats.experts_touched);
  if (mem_gbs > 0) {
    const double bound = prefill_tokens / (prefill_bytes / (mem_gbs * 1e9));
    std::printf("; memory bound at %.1f GB/s: %.0f tokens/s, measured = %.3f of it", mem_gbs, bound,
                prefill_tokens / prefill_s / bound);
  }
  std::printf("; peak RSS %.2f GiB\n", PeakRssGiB());

  // Decode: one token per sequence per pass.
  double decode_s = 0, decode_flops = 0, decode_bytes = 0;
  const double decode_peak_before = fma_peak();
  for (int64_t step = 0; step < gen; ++step) {
    ForwardBatch d;
    for (int64_t s = 0; s < batch; ++s) {
      d.token_ids.push_back(token(rng));
      d.seqs.push_back(ForwardSequence{&tables[s], s, 1, prompt + step + 1, true});
    }
    ForwardStats stats;
    t0 = Now();
    if (!model->Forward(d, **cache, &logits, &stats).ok()) return 1;
    decode_s += Now() - t0;
    decode_bytes += PassBytes(c, weights, stats, dtype, true);
    decode_flops += batch * TokenFlops(c, prompt + step + 1, true);
  }
  const double decode_peak_after = fma_peak();
  const double decode_peak = (decode_peak_before + decode_peak_after) / 2;
  std::printf(
      "decode : %lld sequences x %lld passes in %.4f s: %.0f tokens/s, %.1f GFLOP/s (%.1f%% of "
      "the FMA peak measured before and after them, %.1f / %.1f GFLOP/s)\n",
      (long long)batch, (long long)gen, decode_s, batch * gen / decode_s,
      decode_flops / decode_s / 1e9, 100.0 * decode_flops / decode_s / 1e9 / decode_peak,
      decode_peak_before, decode_peak_after);
  result["decode_gflops"] = decode_flops / decode_s / 1e9;
  result["decode_fma_peak_gflops"] = decode_peak;
  std::printf("decode : %.3f GB read per pass on average", decode_bytes / gen / 1e9);
  result["decode_tokens_per_s"] = batch * gen / decode_s;
  result["decode_bytes_per_pass"] = decode_bytes / gen;
  result["forward_peak_rss_bytes"] = PeakRssGiB() * 1073741824.0;
  if (mem_gbs > 0) {
    result["mem_gbs"] = mem_gbs;
    result["decode_bound_tokens_per_s"] = batch * gen / (decode_bytes / (mem_gbs * 1e9));
  }
  if (mem_gbs > 0) {
    const double bound = batch * gen / (decode_bytes / (mem_gbs * 1e9));
    std::printf("; memory bound at %.1f GB/s: %.0f tokens/s, measured = %.3f of it", mem_gbs, bound,
                batch * gen / decode_s / bound);
  }
  std::printf("; peak RSS %.2f GiB\n", PeakRssGiB());

  // The whole engine on a greedy job (it needs the checkpoint's tokenizer).
  if (synthetic_layers > 0) return write_result();
  EngineOptions o;
  o.model_dir = dir;
  o.cpu.compute_dtype = dtype;
  o.cpu.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  o.cpu.q8_0_f32_activations = device_options.q8_0_f32_activations;
  o.kv.bytes = kc.bytes_per_block() * kc.num_blocks;
  o.schedule.vslpipe = absl::GetFlag(FLAGS_vslpipe);
  o.metrics.trace_file = absl::GetFlag(FLAGS_trace_file);
  auto engine = Engine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  for (int64_t s = 0; s < batch; ++s) {
    GenerationRequest r;
    for (int64_t t = 0; t < prompt; ++t) r.prompt_token_ids.push_back(token(rng));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = static_cast<int32_t>(gen);
    r.sampling.json_object = absl::GetFlag(FLAGS_json_object);
    r.sampling.ignore_eos = !r.sampling.json_object;
    if (!(*engine)->AddRequest(std::move(r)).ok()) return 1;
  }
  std::vector<GenerationOutput> outs;
  t0 = Now();
  while ((*engine)->HasUnfinished()) {
    outs.clear();
    if (!(*engine)->Step(&outs).ok()) return 1;
  }
  const double job_s = Now() - t0;
  if (!o.metrics.trace_file.empty()) {
    if (const absl::Status s = (*engine)->WriteTrace(); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  const EngineStats st = (*engine)->stats();
  std::printf(
      "engine : %lld requests, %lld prompt + %lld generated tokens in %.3f s: %.0f generated "
      "tokens/s, %.0f total tokens/s, %lld passes; the forward passes %.3f s of it (the rest: "
      "scheduling, sampling, detokenization)\n",
      (long long)batch, (long long)st.prefill_tokens, (long long)st.generated_tokens, job_s,
      st.generated_tokens / job_s, (st.prefill_tokens + st.generated_tokens) / job_s,
      (long long)st.passes, st.forward_seconds);
  result["engine_forward_seconds"] = st.forward_seconds;
  result["engine_seconds"] = job_s;
  result["engine_generated_tokens_per_s"] = st.generated_tokens / job_s;
  result["engine_total_tokens_per_s"] = (st.prefill_tokens + st.generated_tokens) / job_s;
  result["engine_passes"] = st.passes;
  result["peak_rss_bytes"] = PeakRssGiB() * 1073741824.0;
  return write_result();
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ParseProgramFlags(argc, argv,
                              "bench_engine_throughput --model DIR [flags]\n"
                              "A batch job through the engine on the cpu backend: throughput.");
  spdlog::set_level(spdlog::level::warn);
  return moebatch::Run();
}
