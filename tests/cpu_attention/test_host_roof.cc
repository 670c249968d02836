// The host's ceilings (cpu_attention/runtime/host_roof.h): the FMA peak and the AMX tile probe run
// where the CPU has their instructions and give figures in a plausible range; the triad moves
// bytes. Not timings of our code: these probes are what benchmarks judge kernels against.
#include <catch2/catch.hpp>

#include "cpu_attention/runtime/cpu_isa.h"
#include "cpu_attention/runtime/host_roof.h"

using namespace moebatch;

TEST_CASE("host roof: the FMA peak and the triad are measured", "[host_roof]") {
  const FmaPeak peak = MeasureFmaPeak(100'000, 1);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  CHECK(peak.isa == (avx512 ? "avx512" : avx2 ? "avx2" : "none"));
  if (avx512 || avx2) {
    // At least a few GFLOP/s, below 100 TFLOP/s: a chain of 16 FMAs per thread at any clock.
    CHECK(peak.flops_per_s > 1e9);
    CHECK(peak.flops_per_s < 1e14);
  } else {
    CHECK(peak.flops_per_s == 0);
  }
  const TriadBandwidth triad = MeasureTriad(64, 2);
  CHECK(triad.best > 1e8);
  CHECK(triad.best >= triad.median);
}

TEST_CASE("host roof: the AMX tile probe runs where AMX is usable, else returns 0", "[host_roof]") {
  const double ns = MeasureAmxTileNs(500);
  if (CpuAmxUsable()) {
    // TDPBF16PS issues every 16 cycles at best: more than 1 ns, and well under a microsecond.
    CHECK(ns > 1.0);
    CHECK(ns < 1000.0);
    CHECK(MeasureAmxTileNs(0) == 0);
  } else {
    CHECK(ns == 0);
  }
}
