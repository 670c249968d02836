// The AVX2 decode attention tile kernel alone, its K/V rows in L1: ns and core cycles per key row
// against the FMA floor, per GQA group. What the kernel computes per key row beyond its FMAs (the
// widening, the loads and broadcasts, the online softmax) is what caps bench_attention_bandwidth on
// an AVX2 host whose triad outruns it (docs/performance.md, "AVX2 decode attention on an AMD
// EPYC"). Cycles come from the measured FMA peak of one thread (16 independent chains: two 8-lane
// FMAs per cycle on every AVX2 core this project runs on), so no clock frequency is assumed.
//
//   bench_attention_tile_cycles [--groups 1,2,3,4,8 --head_dim 128 --calls 2000 --repeats 40]
//
// A key row of G query heads x head_dim d is 2 x G x d FMAs (q . K and p.V), 8 lanes each: its
// floor is G x d / 8 cycles at two FMAs per cycle. The output hash (FNV-1a of the accumulators'
// bits) is the same before and after a change that keeps the kernel's arithmetic.
#include "bench/attention_tile_cycles.h"

#include <omp.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cpu_attention/runtime/host_roof.h"
#include "engine/tools/program_flags.h"

ABSL_FLAG(std::string, groups, "1,2,3,4,8",
          "comma-separated query heads per KV head (Mixtral 4, Qwen3-30B-A3B 8, OLMoE 1)");
ABSL_FLAG(int64_t, head_dim, 128, "head dimension: a multiple of 16, at most 256");
ABSL_FLAG(int64_t, calls, 2000, "tile calls per timed repeat (16 key rows each)");
ABSL_FLAG(int, repeats, 40,
          "rounds over the groups, one timed repeat of --calls calls per group each (the best "
          "round of each group is reported)");

namespace moebatch {
namespace {

int Main() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr, "bench_attention_tile_cycles: this CPU has no AVX2+FMA\n");
    return 2;
  }
  std::vector<int> groups;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_groups), ',')) {
    int g = 0;
    if (!absl::SimpleAtoi(part, &g)) {
      std::fprintf(stderr, "--groups: bad group '%s'\n", std::string(part).c_str());
      return 2;
    }
    groups.push_back(g);
  }
  const int64_t d = absl::GetFlag(FLAGS_head_dim);
  const int64_t calls = absl::GetFlag(FLAGS_calls);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (calls <= 0 || repeats <= 0) {
    std::fprintf(stderr, "--calls and --repeats: at least 1\n");
    return 2;
  }
  // One thread's peak (the kernel runs on this thread alone); the 16-chain loop issues two 8-lane
  // FMAs per cycle (32 FLOP per cycle).
  omp_set_num_threads(1);
  const double peak_before = MeasureFmaPeak(2'000'000, 5).flops_per_s;
  // Round robin over the groups, one timed repeat each per round, so that a neighbour that comes
  // and goes on a shared host slows every group alike; the best round of each is reported.
  std::vector<TileTiming> timings(groups.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < groups.size(); ++i) {
      absl::StatusOr<TileTiming> t = TimeAvx2BF16Tile(groups[i], d, calls, 1);
      if (!t.ok()) {
        std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
        return 2;
      }
      if (r == 0 || t->ns_per_key_row < timings[i].ns_per_key_row) timings[i] = *t;
    }
  }
  const double peak_after = MeasureFmaPeak(2'000'000, 5).flops_per_s;
  const double peak = peak_before > peak_after ? peak_before : peak_after;
  const double ghz = peak / 32.0 / 1e9;  // cycles per ns
  std::printf(
      "| group | head_dim | ns per key row | cycles per key row | FMA floor, cycles | "
      "floor / cycles | acc FNV-1a |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (size_t i = 0; i < groups.size(); ++i) {
    const double cycles = timings[i].ns_per_key_row * ghz;
    const double floor = static_cast<double>(groups[i] * d) / 8.0;
    std::printf("| %d | %lld | %.2f | %.1f | %.0f | %.1f%% | %016llx |\n", groups[i],
                static_cast<long long>(d), timings[i].ns_per_key_row, cycles, floor,
                100.0 * floor / cycles, static_cast<unsigned long long>(timings[i].acc_hash));
  }
  std::printf(
      "one thread's f32 FMA peak %.1f-%.1f GFLOP/s (before, after): %.2f G cycles/s at two "
      "8-lane FMAs per cycle\n",
      peak_before / 1e9, peak_after / 1e9, ghz);
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ParseProgramFlags(
      argc, argv,
      "bench_attention_tile_cycles [--groups 1,2,3,4,8 --head_dim 128 --calls 2000 --repeats 40]\n"
      "The AVX2 decode attention tile kernel on L1-resident rows: cycles per key row.");
  return moebatch::Main();
}
