// The quantized CPU dense layer (cpu_attention/gemm/quant_linear.h) against the memory bound and
// against the bf16 batch-invariant kernel (cpu_attention/gemm/invariant_linear.h) on the same
// shapes; for MXFP4 and Q8_0 also InvariantLinearMxfp4 / InvariantLinearQ8_0 (the blocks widened
// exactly, f32 activations).
//
//   bench_quant_linear [--types Q4_0,Q4_1,Q8_0,Q4_K,Q5_K,Q6_K,MXFP4 --shapes 5632x2048,2048x5632
//       --m 1,4,64,256 --reps 10 --triad_mib 512 --footprint_mib 0]
//
// Shapes are NxK (out_features x in_features; the defaults are a small Mixtral-shaped expert's
// w1/w3 and w2). Each weight matrix is stored in as many copies as fill --footprint_mib (default:
// four times the last-level cache, at least 1 GiB), and successive calls take successive copies,
// so every call reads its weights from memory, as an MoE layer streams its experts: the weights
// are larger than the LLC (twice the LLC is not enough: an L3 that resists thrashing keeps part of
// a cyclic working set; bf16 then read faster than the triad on the Xeon this was written on). Per
// (type, shape, M), best and median of --reps timed calls (after a warm-up call): ms per call,
// weight GB/s (the matrix's bytes over the best time), that as a fraction of the STREAM triad
// bandwidth (the memory bound: best of 3 arrays of --triad_mib MiB, measured next to each shape's
// runs, the highest reading kept), GFLOP/s (2·M·N·K), and the speed against InvariantLinear with
// bf16 weights at the same M (its weights 2 bytes each, also streamed from copies). The bounds
// quant_linear.h aims at: M 1 at >= 80% of the triad; M 64 at least as fast as bf16.
// On a shared VM run it pinned and spinning, as the engine runs with --pin_cpu_threads:
//   OMP_PROC_BIND=true OMP_PLACES=cores OMP_WAIT_POLICY=active OMP_NUM_THREADS=2 bench_quant_linear
// Unpinned, a busy host's scheduler stacked both threads on one vCPU (every call 4-12 ms, the
// kernels and the bf16 baseline alike).
#include "cpu_attention/gemm/quant_linear.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cpu_attention/gemm/invariant_linear.h"
#include "cpu_attention/runtime/host_roof.h"
#include "engine/model/dtype.h"
#include "engine/tools/program_flags.h"

ABSL_FLAG(std::string, types, "Q4_0,Q4_1,Q8_0,Q4_K,Q5_K,Q6_K,MXFP4", "ggml weight types");
ABSL_FLAG(std::string, shapes, "5632x2048,2048x5632", "comma-separated NxK weight shapes");
ABSL_FLAG(std::string, m, "1,4,64,256", "comma-separated token counts M");
ABSL_FLAG(int64_t, reps, 10, "timed calls per point (after one warm-up call)");
ABSL_FLAG(int64_t, triad_mib, 512, "size of each of the three triad arrays, MiB");
ABSL_FLAG(double, footprint_mib, 0,
          "bytes of weight copies the calls cycle through, MiB (0: four times the LLC, >= 1024)");

namespace moebatch {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Timing {
  double best = 0, median = 0;  // seconds per call
};

// call(i) for i = 0 (warm-up), 1..reps (timed).
template <typename F>
Timing TimeCalls(int64_t reps, F&& call) {
  call(0);
  std::vector<double> t;
  for (int64_t r = 1; r <= reps; ++r) {
    const double t0 = Now();
    call(r);
    t.push_back(Now() - t0);
  }
  std::sort(t.begin(), t.end());
  return Timing{t.front(), t[t.size() / 2]};
}

// An uninitialised array of n bytes in its own anonymous mapping with transparent huge pages asked
// for (as the KV cache and bench_attention_bandwidth's triad).
struct HugeBytes {
  explicit HugeBytes(size_t n) : bytes(n) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "cannot map %zu bytes\n", bytes);
      std::exit(1);
    }
    (void)::madvise(p, bytes, MADV_HUGEPAGE);
    data = static_cast<std::byte*>(p);
  }
  ~HugeBytes() { ::munmap(data, bytes); }
  HugeBytes(const HugeBytes&) = delete;
  HugeBytes& operator=(const HugeBytes&) = delete;
  size_t bytes;
  std::byte* data;
};

// STREAM triad over three f32 arrays of `mib` MiB (cpu_attention/runtime/host_roof.h); GB/s as
// STREAM counts them (3 arrays), best of `reps`.
double MeasureTriadGbs(int64_t mib, int64_t reps) {
  return MeasureTriad(mib, static_cast<int>(reps)).best / 1e9;
}

std::string CpuModel() {
  FILE* p = ::popen("lscpu 2>/dev/null", "r");
  std::string model = "unknown";
  if (p == nullptr) return model;
  char line[512];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    std::string s(line);
    if (s.rfind("Model name:", 0) == 0) {
      s = s.substr(11);
      s.erase(0, s.find_first_not_of(" \t"));
      s.erase(s.find_last_not_of(" \t\n") + 1);
      model = s;
    }
  }
  ::pclose(p);
  return model;
}

void PutHalf(std::byte* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// One weight matrix of `type`: random bytes with moderate f16 scales and MXFP4 exponents near 2^0.
void RandomWeights(GgmlType type, int64_t bytes, std::byte* w, std::mt19937_64& rng) {
  const GgmlTypeTraits t = *GgmlTypeInfo(static_cast<uint32_t>(type));
  for (int64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(w + i, &v, 8);
  }
  for (int64_t i = 0; i < bytes / t.type_size; ++i) {
    std::byte* p = w + i * t.type_size;
    switch (type) {
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        PutHalf(p, 1e-3f);
        PutHalf(p + 2, 1e-3f);
        break;
      case GgmlType::kQ6_K:
        PutHalf(p + 208, 1e-3f);
        break;
      case GgmlType::kMXFP4:
        p[0] = static_cast<std::byte>(127);
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        PutHalf(p, 0.01f);
        PutHalf(p + 2, -0.05f);
        break;
      default:
        PutHalf(p, 0.01f);
        break;
    }
  }
}

bool ParseList(const std::string& flag, std::vector<int64_t>* out) {
  for (absl::string_view part : absl::StrSplit(flag, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) return false;
    out->push_back(v);
  }
  return !out->empty();
}

std::optional<GgmlType> TypeByName(absl::string_view name) {
  for (uint32_t i = 0; i < 64; ++i) {
    const std::optional<GgmlTypeTraits> t = GgmlTypeInfo(i);
    if (t && name == t->name) return t->type;
  }
  return std::nullopt;
}

struct Row {
  std::string type, shape;
  int64_t m;
  Timing t;
  double gbs, triad, gflops, vs_bf16;
};

int Main() {
  std::vector<int64_t> ms;
  if (!ParseList(absl::GetFlag(FLAGS_m), &ms)) {
    std::fprintf(stderr, "--m: want positive comma-separated counts\n");
    return 2;
  }
  std::vector<std::array<int64_t, 2>> shapes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(s, 'x');
    int64_t n = 0, k = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &n) || !absl::SimpleAtoi(parts[1], &k) ||
        n <= 0 || k <= 0 || k % 32 != 0) {
      std::fprintf(stderr, "bad shape '%s' (want NxK, K a multiple of 32)\n",
                   std::string(s).c_str());
      return 2;
    }
    shapes.push_back({n, k});
  }
  std::vector<GgmlType> types;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_types), ',', absl::SkipEmpty())) {
    const std::optional<GgmlType> t = TypeByName(s);
    if (!t || !QuantLinearSupports(*t)) {
      std::fprintf(stderr, "--types: '%s' is not a type QuantLinear computes with\n",
                   std::string(s).c_str());
      return 2;
    }
    types.push_back(*t);
  }
  const int64_t reps = std::max<int64_t>(1, absl::GetFlag(FLAGS_reps));
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  int64_t footprint = static_cast<int64_t>(absl::GetFlag(FLAGS_footprint_mib) * 1048576.0);
  if (footprint <= 0) footprint = std::max<int64_t>(int64_t{1} << 30, 4 * int64_t{llc});
  __builtin_cpu_init();
  std::printf(
      "CPU: %s; %d threads (OMP); LLC %.0f MiB (sysconf); ISA %s%s\n", CpuModel().c_str(),
      omp_get_max_threads(), llc / 1048576.0, CpuIsaName(SelectedCpuIsa()),
      SelectedCpuIsa() == CpuIsa::kAvx512
          ? (__builtin_cpu_supports("avx512vnni") ? " (VNNI kernels)" : " (no VNNI: AVX2 kernels)")
          : "");
  std::printf("weights cycled through copies filling %.0f MiB (each call reads from memory)\n",
              footprint / 1048576.0);
  double triad = MeasureTriadGbs(absl::GetFlag(FLAGS_triad_mib), 10);
  std::printf("triad (3 x %lld MiB f32): %.2f GB/s\n",
              static_cast<long long>(absl::GetFlag(FLAGS_triad_mib)), triad);
  std::fflush(stdout);

  std::vector<Row> rows;
  std::mt19937_64 rng(1);
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  for (const auto& [n, k] : shapes) {
    const std::string shape = std::to_string(n) + "x" + std::to_string(k);
    std::vector<float> x(static_cast<size_t>(max_m * k)), y(static_cast<size_t>(max_m * n));
    std::normal_distribution<float> normal;
    for (float& v : x) v = normal(rng);
    const double again = MeasureTriadGbs(absl::GetFlag(FLAGS_triad_mib), 5);
    triad = std::max(triad, again);
    std::printf("\nshape %s: triad next to the runs %.2f GB/s (kept: %.2f)\n", shape.c_str(), again,
                triad);

    // The bf16 baseline: InvariantLinear, weights read in place.
    std::vector<double> bf16_time(ms.size());
    {
      const int64_t bytes = n * k * 2;
      const int64_t copies = std::max<int64_t>(1, footprint / bytes);
      HugeBytes w(static_cast<size_t>(bytes * copies));
      std::vector<float> w32(static_cast<size_t>(n * k));
      for (float& v : w32) v = 0.02f * normal(rng);
      ConvertFromF32(DType::kBF16, w32.data(), w.data, w32.size());
#pragma omp parallel for schedule(static)
      for (int64_t c = 1; c < copies; ++c) std::memcpy(w.data + c * bytes, w.data, bytes);
      for (size_t mi = 0; mi < ms.size(); ++mi) {
        const int64_t m = ms[mi];
        const Timing t = TimeCalls(reps, [&](int64_t r) {
          InvariantLinear(x.data(), m, k, w.data + r % copies * bytes, DType::kBF16, n, y.data());
        });
        bf16_time[mi] = t.best;
        rows.push_back(Row{"bf16 InvariantLinear", shape, m, t, bytes / t.best / 1e9, triad,
                           2.0 * m * n * k / t.best / 1e9, 1.0});
        std::printf("  %-22s M %4lld: %9.3f ms\n", "bf16 InvariantLinear",
                    static_cast<long long>(m), t.best * 1e3);
        std::fflush(stdout);
      }
    }
    for (GgmlType type : types) {
      const GgmlTypeTraits tr = *GgmlTypeInfo(static_cast<uint32_t>(type));
      if (k % tr.block_size != 0) {
        std::printf("  %-22s skipped: K %lld is not a multiple of its block size %lld\n", tr.name,
                    static_cast<long long>(k), static_cast<long long>(tr.block_size));
        continue;
      }
      const int64_t bytes = n * (k / tr.block_size) * tr.type_size;
      const int64_t copies = std::max<int64_t>(1, footprint / bytes);
      HugeBytes w(static_cast<size_t>(bytes * copies));
      RandomWeights(type, bytes, w.data, rng);
#pragma omp parallel for schedule(static)
      for (int64_t c = 1; c < copies; ++c) std::memcpy(w.data + c * bytes, w.data, bytes);
      for (size_t mi = 0; mi < ms.size(); ++mi) {
        const int64_t m = ms[mi];
        // At least one pass over the copies for small M (short calls), so that none is cached.
        const int64_t calls = m <= 8 ? std::max(reps, copies) : reps;
        const Timing t = TimeCalls(calls, [&](int64_t r) {
          const absl::Status st =
              QuantLinear(x.data(), m, k, w.data + r % copies * bytes, type, n, y.data());
          if (!st.ok()) {
            std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
            std::exit(1);
          }
        });
        rows.push_back(Row{tr.name, shape, m, t, bytes / t.best / 1e9, triad,
                           2.0 * m * n * k / t.best / 1e9, bf16_time[mi] / t.best});
        std::printf("  %-22s M %4lld: %9.3f ms\n", tr.name, static_cast<long long>(m),
                    t.best * 1e3);
        std::fflush(stdout);
        if (type != GgmlType::kMXFP4 && type != GgmlType::kQ8_0) continue;
        // The same blocks widened exactly with f32 activations (InvariantLinearMxfp4: a Hugging
        // Face MXFP4 checkpoint's path, transformers' math; InvariantLinearQ8_0:
        // --q8_0_activations=f32).
        const bool mxfp4 = type == GgmlType::kMXFP4;
        const Timing f = TimeCalls(calls, [&](int64_t r) {
          const std::byte* wr = w.data + r % copies * bytes;
          const absl::Status st = mxfp4 ? InvariantLinearMxfp4(x.data(), m, k, wr, n, y.data())
                                        : InvariantLinearQ8_0(x.data(), m, k, wr, n, y.data());
          if (!st.ok()) {
            std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
            std::exit(1);
          }
        });
        const char* label = mxfp4 ? "MXFP4 widened (f32 x)" : "Q8_0 widened (f32 x)";
        rows.push_back(Row{label, shape, m, f, bytes / f.best / 1e9, triad,
                           2.0 * m * n * k / f.best / 1e9, bf16_time[mi] / f.best});
        std::printf("  %-22s M %4lld: %9.3f ms\n", label, static_cast<long long>(m), f.best * 1e3);
        std::fflush(stdout);
      }
    }
  }

  std::printf(
      "\n| weights | NxK | M | ms/call best [median] | weight GB/s | of triad | GFLOP/s | vs bf16 "
      "|\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %lld | %.3f [%.3f] | %.2f | %.0f%% | %.1f | %.2fx |\n", r.type.c_str(),
                r.shape.c_str(), static_cast<long long>(r.m), r.t.best * 1e3, r.t.median * 1e3,
                r.gbs, 100.0 * r.gbs / triad, r.gflops, r.vs_bf16);
  }
  std::printf(
      "(triad: the highest reading, %.2f GB/s; vs bf16: InvariantLinear's best time over "
      "this one's at the same shape and M)\n",
      triad);
  return 0;
}

}  // namespace
}  // namespace moebatch

int main(int argc, char** argv) {
  moebatch::ParseProgramFlags(
      argc, argv,
      "bench_quant_linear [--types Q4_0,Q8_0 --shapes 5632x2048 --m 1,4,64,256 --reps 10]\n"
      "The quantized CPU dense layer against the memory bound and the bf16 kernel.");
  return moebatch::Main();
}
