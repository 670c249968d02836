// The CPU dense layer y = x · Wᵀ (cpu_attention/gemm/matmul.h) in its four forms, at Mixtral-8x7B
// expert shapes: oneDNN f32 (bf16 weights widened once and cached), oneDNN bf16 (AMX / AVX512-BF16,
// where the CPU has it), and the batch-invariant kernels (cpu_attention/gemm/invariant_linear.h,
// bf16 weights read in place) in f32 compute and in bf16 compute (InvariantLinearBf16: vdpbf16ps
// where the CPU has AVX512-BF16 and MOEBATCH_CPU_BF16 is not 0, else f32 FMAs with the same bits).
// For each M (tokens): seconds per call, GFLOP/s, and GB/s of weight bytes read (the bound at small
// M, when the layer streams its weights once).
//
//   bench_linear [--k 4096 --n 14336 --m 1,8,32,128,512 --reps 5]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cpu_attention/gemm/invariant_linear.h"
#include "cpu_attention/gemm/matmul.h"
#include "cpu_attention/runtime/host_roof.h"
#include "engine/tools/program_flags.h"

ABSL_FLAG(int64_t, k, 4096, "in_features (Mixtral-8x7B w1/w3: hidden 4096)");
ABSL_FLAG(int64_t, n, 14336, "out_features (Mixtral-8x7B w1/w3: intermediate 14336)");
ABSL_FLAG(std::string, m, "1,8,32,128,512", "comma-separated token counts");
ABSL_FLAG(int, reps, 5, "timed calls per point (after one warm-up call); the best is reported");
ABSL_FLAG(std::string, forms, "onednn_f32,onednn_bf16,invariant_f32,invariant_bf16",
          "comma-separated forms to time, of onednn_f32, onednn_bf16, invariant_f32 and "
          "invariant_bf16");

namespace moebatch {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Main() {
  const int64_t k = absl::GetFlag(FLAGS_k), n = absl::GetFlag(FLAGS_n);
  std::vector<int64_t> ms;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_m), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      std::fprintf(stderr, "--m: bad token count '%s'\n", std::string(part).c_str());
      return 2;
    }
    ms.push_back(v);
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w32(static_cast<size_t>(n * k));
  for (float& v : w32) v = normal(rng);
  std::vector<uint16_t> w(w32.size());
  ConvertFromF32(DType::kBF16, w32.data(), w.data(), w.size());
  w32 = {};
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  std::vector<float> x(static_cast<size_t>(max_m * k)), y(static_cast<size_t>(max_m * n));
  for (float& v : x) v = normal(rng);

  struct Form {
    const char* flag;
    const char* name;
    DType compute;
    bool invariant;
  };
  const Form all_forms[] = {{"onednn_f32", "oneDNN f32 (widened weights)", DType::kF32, false},
                            {"onednn_bf16", "oneDNN bf16", DType::kBF16, false},
                            {"invariant_f32", "batch-invariant f32", DType::kF32, true},
                            {"invariant_bf16", "batch-invariant bf16", DType::kBF16, true}};
  std::vector<Form> forms;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_forms), ',')) {
    const Form* found = nullptr;
    for (const Form& f : all_forms) {
      if (part == f.flag) found = &f;
    }
    if (found == nullptr) {
      std::fprintf(stderr, "--forms: unknown form '%s'\n", std::string(part).c_str());
      return 2;
    }
    forms.push_back(*found);
  }
  std::printf(
      "weights [%ld, %ld] bf16 (%.1f MB), %d threads, ISA %s, batch-invariant bf16 on %s\n",
      static_cast<long>(n), static_cast<long>(k), n * k * 2 / 1e6, omp_get_max_threads(),
      CpuIsaName(SelectedCpuIsa()),
      Bf16OnVdpbf16ps(SelectedCpuIsa()) ? "vdpbf16ps" : "f32 FMAs (a pair = two, odd first)");
  // Each timed call is paired with the f32 FMA peak of the pool's threads (host_roof.h) measured
  // right before it; "of peak" is the median of the pairs' ratios: on a VM whose speed moves
  // within minutes, a peak measured once would judge later calls against another machine.
  std::printf("%-30s %6s %12s %10s %12s %8s  %s\n", "form", "M", "ms/call", "GFLOP/s",
              "weight GB/s", "of peak",
              "(paired: median ratio of each call to the FMA peak measured before it; range)");
  double peak_lo = 1e30, peak_hi = 0;
  std::string peak_isa;
  for (const Form& f : forms) {
    auto mm = Matmul::Create(f.compute, int64_t{4} << 30, f.invariant);
    if (!mm.ok()) {
      std::printf("%-30s unavailable: %s\n", f.name, std::string(mm.status().message()).c_str());
      continue;
    }
    for (int64_t m : ms) {
      double best = 1e30;
      std::vector<double> ratios;
      for (int r = 0; r <= absl::GetFlag(FLAGS_reps); ++r) {
        const FmaPeak peak = r > 0 ? MeasureFmaPeak() : FmaPeak{};
        const double t0 = Now();
        auto st = (*mm)->Linear(x.data(), m, k, w.data(), DType::kBF16, n, y.data());
        const double dt = Now() - t0;
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
          return 1;
        }
        if (r == 0) continue;  // warm-up (and oneDNN's widening)
        best = std::min(best, dt);
        if (peak.flops_per_s > 0) {
          ratios.push_back(2.0 * m * n * k / dt / peak.flops_per_s);
          peak_lo = std::min(peak_lo, peak.flops_per_s);
          peak_hi = std::max(peak_hi, peak.flops_per_s);
          peak_isa = peak.isa;
        }
      }
      std::sort(ratios.begin(), ratios.end());
      // Weight bytes the form reads: f32 copies for oneDNN f32, bf16 in place otherwise.
      const double wbytes = double(n) * k * (f.compute == DType::kF32 && !f.invariant ? 4 : 2);
      const double flops = 2.0 * m * n * k / best;
      std::printf("%-30s %6ld %12.3f %10.1f %12.1f", f.name, static_cast<long>(m), best * 1e3,
                  flops / 1e9, wbytes / best / 1e9);
      if (ratios.empty()) {
        std::printf(" %8s\n", "-");
      } else {
        std::printf(" %7.0f%%  (%.0f-%.0f%%)\n", 100.0 * ratios[ratios.size() / 2],
                    100.0 * ratios.front(), 100.0 * ratios.back());
      }
    }
  }
  if (peak_hi > 0) {
    std::printf("f32 FMA peak of these threads (%s), paired measurements: %.1f-%.1f GFLOP/s\n",
                peak_isa.c_str(), peak_lo / 1e9, peak_hi / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ParseProgramFlags(
      argc, argv,
      "bench_linear [--k 4096 --n 14336 --m 1,8,32,128,512 --reps 5 --forms ...]\n"
      "The CPU dense layer in its four forms.");
  return moebatch::Main();
}
