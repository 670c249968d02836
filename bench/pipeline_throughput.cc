// A whole batch job through the engine (scheduler, VSLPipe, data mover) on a
// Mixtral-shaped model, its measured generation throughput next to the MoE-Lens Stage 2
// prediction and Stage 1 bound (engine/plan/perf_model.h), with a per-pass CSV for the Fig.
// 13-style plot (scripts/plot_throughput.py).
//
//   bench_pipeline_throughput --model bench/models/mixtral-8x7b --weights synthetic
//       --synthetic_layers 8 --backend cuda --gpu_memory_gb 16 --kv_cache_gb 64
//       --requests 2000 --prompt_tokens 98 --gen_tokens 32,64,128,256
//       --pcie_gbs 25 --gpu_tflops 65 --cpu_mem_gbs 80 --csv /tmp/passes.csv
//
// The engine flags are engine/tools/engine_flags.h's (--backend, --weights, --gpu_memory_gb, ...).
// The prediction's delta is the bytes the engine moved per pass in the run (its streamed layers)
// over
// --pcie_gbs (default: the data mover's measured rate in this run); it uses --gpu_tflops
// (the GEMM rate, e.g. from bench_cuda_backend's task B timing) and --cpu_mem_gbs
// (bench_attention_bandwidth's all-thread figure); with the cpu backend the prediction does not
// apply (no weight transfer) and is skipped. Prompts are random token ids of --prompt_tokens +- 25%
// (MT-Bench's average is ~98), greedy, ignore_eos so every request generates exactly g tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "engine/plan/perf_model.h"
#include "engine/tools/engine_flags.h"
#include "engine/tools/program_flags.h"

ABSL_FLAG(std::string, model, "tests/fixtures/tiny-mixtral", "model directory (config.json)");
ABSL_FLAG(int64_t, requests, 256, "requests in the job (K)");
ABSL_FLAG(int64_t, prompt_tokens, 98, "average prompt length (p)");
ABSL_FLAG(std::string, gen_tokens, "32,64,128,256",
          "generated tokens per request (g), one job each");
ABSL_FLAG(double, pcie_gbs, 0, "B_IO for the prediction, GB/s (0: the data mover's measured rate)");
ABSL_FLAG(double, gpu_tflops, 0, "C_GPU for the prediction, TFLOP/s (0: skip the prediction)");
ABSL_FLAG(double, cpu_mem_gbs, 80, "CPU memory bandwidth for the prediction, GB/s");
ABSL_FLAG(std::string, csv, "",
          "per-pass CSV (job, pass, seconds since start, prefill and decode "
          "tokens, pass seconds, device / CPU / transfer busy seconds)");
ABSL_FLAG(uint64_t, seed, 1, "prompt seed");

namespace moebatch {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Run() {
  auto options = EngineOptionsFromFlags(absl::GetFlag(FLAGS_model));
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  std::vector<int64_t> gens;
  for (absl::string_view g :
       absl::StrSplit(absl::GetFlag(FLAGS_gen_tokens), ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(g, &v) || v <= 0) {
      std::fprintf(stderr, "bad --gen_tokens\n");
      return 2;
    }
    gens.push_back(v);
  }
  const int64_t k = absl::GetFlag(FLAGS_requests), p = absl::GetFlag(FLAGS_prompt_tokens);
  std::ofstream csv;
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    csv.open(absl::GetFlag(FLAGS_csv));
    csv << "gen_tokens,pass,t_seconds,prefill_tokens,decode_tokens,pass_seconds,device_seconds,"
           "cpu_attention_seconds,weight_transfer_seconds\n";
  }
  std::printf(
      "| g | requests | generated tokens/s | passes | preemptions | device busy | CPU "
      "busy | transfer busy | Stage 2 prediction | ratio | Stage 1 bound | ratio | bound |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int64_t g : gens) {
    auto engine = Engine::Create(*options);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
      return 1;
    }
    Engine& e = **engine;
    std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
    std::uniform_int_distribution<int64_t> len(std::max<int64_t>(1, p * 3 / 4), p * 5 / 4);
    std::uniform_int_distribution<int32_t> token(3,
                                                 static_cast<int32_t>(e.config().vocab_size) - 1);
    for (int64_t r = 0; r < k; ++r) {
      GenerationRequest request;
      request.prompt_token_ids.push_back(e.config().bos_token_id);
      for (int64_t i = len(rng); i > 1; --i) request.prompt_token_ids.push_back(token(rng));
      request.sampling.temperature = 0.0f;
      request.sampling.max_tokens = static_cast<int32_t>(g);
      request.sampling.ignore_eos = true;
      if (auto id = e.AddRequest(request); !id.ok()) {
        std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
        return 1;
      }
    }
    const double t0 = Now();
    int64_t prefill_before = 0, decode_before = 0;
    std::vector<GenerationOutput> outputs;
    while (e.HasUnfinished()) {
      outputs.clear();
      if (auto st = e.Step(&outputs); !st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        return 1;
      }
      const EngineStats s = e.stats();
      if (csv.is_open()) {
        const ForwardStats& f = s.last_pass;
        csv << g << "," << s.passes << "," << Now() - t0 << "," << s.prefill_tokens - prefill_before
            << "," << s.decode_tokens - decode_before << "," << f.pass_seconds << ","
            << f.device_seconds << "," << f.cpu_attention_seconds << ","
            << f.weight_transfer_seconds << "\n";
      }
      prefill_before = s.prefill_tokens;
      decode_before = s.decode_tokens;
    }
    const double seconds = Now() - t0;
    const EngineStats s = e.stats();
    const double measured = static_cast<double>(s.generated_tokens) / seconds;
    const double fwd = std::max(s.forward_seconds, 1e-12);

    std::string stage2 = "n/a", ratio2 = "", stage1 = "n/a", ratio1 = "", bound = "";
    const double pcie =
        absl::GetFlag(FLAGS_pcie_gbs) > 0
            ? absl::GetFlag(FLAGS_pcie_gbs) * 1e9
            : (s.weight_transfer_seconds > 0 ? s.weight_bytes / s.weight_transfer_seconds : 0.0);
    if (pcie > 0 && absl::GetFlag(FLAGS_gpu_tflops) > 0) {
      const DType kv_dtype = options->kv.dtype.value_or(options->cpu.compute_dtype);
      auto shape =
          ModelShapeFromConfig(e.config(), options->weights.dtype.value_or(DType::kBF16), kv_dtype);
      // delta from the bytes this engine moves per pass (the streamed layers: the embedding stays
      // on the host, lm_head and any resident layers on the GPU), not the whole Model Size.
      if (shape.ok() && s.passes > 0 && s.weight_bytes > 0) {
        shape->transferred_weight_bytes =
            static_cast<double>(s.weight_bytes) / static_cast<double>(s.passes);
        std::fprintf(stderr,
                     "g=%lld prediction inputs: B_IO %.2f GB/s, %.3f GB moved per pass (Model "
                     "Size %.3f GB), GEMM %.1f TFLOP/s, CPU memory %.1f GB/s\n",
                     static_cast<long long>(g), pcie / 1e9, shape->transferred_weight_bytes / 1e9,
                     ModelWeightBytes(*shape) / 1e9, absl::GetFlag(FLAGS_gpu_tflops),
                     absl::GetFlag(FLAGS_cpu_mem_gbs));
      }
      HardwareSpec hw;
      hw.pcie_bytes_per_s = pcie;
      hw.gpu_flops = absl::GetFlag(FLAGS_gpu_tflops) * 1e12;
      hw.cpu_mem_bytes_per_s = absl::GetFlag(FLAGS_cpu_mem_gbs) * 1e9;
      hw.kv_memory_bytes = static_cast<double>(options->kv.bytes);
      Workload w;
      w.prompt_tokens = p;
      w.gen_tokens = g;
      w.batch_size = k;
      w.block_size = options->kv.block_size;
      w.kv_budget_bytes = static_cast<double>(options->kv.bytes);
      if (shape.ok()) {
        auto s1 = PredictStage1(*shape, hw, w);
        auto s2 = PredictStage2(*shape, hw, w);
        if (s1.ok() && s2.ok()) {
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%.1f", s2->tokens_per_s);
          stage2 = buf;
          std::snprintf(buf, sizeof(buf), "%.3f", measured / s2->tokens_per_s);
          ratio2 = buf;
          std::snprintf(buf, sizeof(buf), "%.1f", s1->max_generated_tokens_per_s);
          stage1 = buf;
          std::snprintf(buf, sizeof(buf), "%.3f", measured / s1->max_generated_tokens_per_s);
          ratio1 = buf;
          bound = std::string(LimitingBoundName(s2->bound));
        } else {
          stage2 = std::string(s1.ok() ? s2.status().message() : s1.status().message());
        }
      }
    }
    std::printf(
        "| %lld | %lld | %.1f | %lld | %lld | %.1f%% | %.1f%% | %.1f%% | %s | %s | %s | %s "
        "| %s |\n",
        static_cast<long long>(g), static_cast<long long>(k), measured,
        static_cast<long long>(s.passes), static_cast<long long>(s.preemptions),
        100 * s.device_seconds / fwd, 100 * s.cpu_attention_seconds / fwd,
        100 * s.weight_transfer_seconds / fwd, stage2.c_str(), ratio2.c_str(), stage1.c_str(),
        ratio1.c_str(), bound.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ShowEngineFlagsInHelp();
  moebatch::ParseProgramFlags(
      argc, argv,
      "bench_pipeline_throughput --model DIR [engine flags] [--requests N --gen_tokens 32,64 ...]\n"
      "A batch job against the MoE-Lens prediction.");
  return moebatch::Run();
}
