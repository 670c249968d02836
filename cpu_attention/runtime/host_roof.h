// The host's two ceilings for the CPU roofline (engine/plan/cpu_roofline.h), measured with the
// calling thread's OpenMP pool (cpu_threads.h): memory bandwidth as a STREAM triad
// a[i] = b[i] + s * c[i] over three f32 arrays (bytes as STREAM counts them: 3 per element;
// transparent huge pages asked for, like the KV cache), and the f32 FMA peak of a
// register-resident loop of 16 independent FMA chains per thread at the widest vector ISA the CPU
// has (AVX-512 or AVX2+FMA, from CPUID; MOEBATCH_CPU_ISA does not lower it: this is the hardware's
// ceiling, not a kernel's).
//
// Threading: call from the thread whose pool will run the work; not inside a parallel region.
// It takes about 0.1-0.5 s (more on a busy host) and the host's other work lowers both figures.
#pragma once

#include <cstdint>
#include <string>

namespace moebatch {

struct MeasuredHost {
  double triad_bytes_per_s = 0;  // best of the repetitions, bytes/s
  double fma_flops_per_s = 0;    // FLOP/s (an FMA is 2); 0 without AVX2+FMA or AVX-512
  std::string fma_isa;           // "avx512", "avx2", or "none"
  int threads = 0;               // the pool's threads that ran both
};

// The STREAM triad over three arrays of `mib` MiB each (well beyond the caches: 64 at least),
// `repeats` passes (>= 1): the best and the median pass, bytes/s (3 x 4 bytes per element). 0 when
// the arrays cannot be mapped.
struct TriadBandwidth {
  double best = 0, median = 0;
};
TriadBandwidth MeasureTriad(int64_t mib, int repeats);

// The triad's three f32 arrays of `mib` MiB each (at least 1), each in its own anonymous mapping
// with transparent huge pages asked for, filled (a = 0, b = 1, c = 2) and so first touched by the
// calling thread's OpenMP pool, and kept for repeated passes: MeasureTriad's arrays, for callers
// that time the triad next to other work again and again (bench_attention_bandwidth's paired
// rounds). ok() is false when a mapping failed; the other members then must not be called.
// Threading: as MeasureTriad. Owns the mappings (unmapped on destruction); not copyable.
class TriadArrays {
 public:
  explicit TriadArrays(int64_t mib);
  ~TriadArrays();
  TriadArrays(const TriadArrays&) = delete;
  TriadArrays& operator=(const TriadArrays&) = delete;

  bool ok() const { return a_ != nullptr && b_ != nullptr && c_ != nullptr; }
  // One pass of a[i] = b[i] + s * c[i] over the pool, statically split; seconds.
  double Pass();
  // Bytes one pass moves as STREAM counts them: 3 arrays x elements() x 4.
  double Bytes() const { return 3.0 * static_cast<double>(n_) * sizeof(float); }
  int64_t elements() const { return n_; }
  // Array b (elements() floats, read by every pass), for a read-only pass over the same memory.
  const float* b() const { return b_; }

 private:
  int64_t n_;
  float *a_, *b_, *c_;
};

// The f32 FMA peak: `iterations` steps of the 16 chains per thread, the best of `repeats` runs.
struct FmaPeak {
  double flops_per_s = 0;  // 0 without AVX2+FMA or AVX-512
  std::string isa;         // "avx512", "avx2", or "none"
};
FmaPeak MeasureFmaPeak(int64_t iterations = 1'000'000, int repeats = 3);

// The AMX tile unit's rate where CpuAmxUsable() (runtime/cpu_isa.h): `iterations` rounds of 4
// TDPBF16PS per thread of the pool (four independent accumulators, operands in tile registers,
// random bf16 values), ns per instruction on the pool's slowest thread; 0 elsewhere. About
// iterations x 30 ns. On a shared host it moves with the neighbours' use of the core's tile unit
// (docs/performance.md, "This VM's AMX runs in two phases": 7 ns against 17).
double MeasureAmxTileNs(int64_t iterations = 2000);

// Both, with the defaults above and a triad of `triad_mib` MiB arrays, best of `repeats`.
MeasuredHost MeasureHost(int64_t triad_mib = 128, int repeats = 5);

}  // namespace moebatch
