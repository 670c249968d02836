#include "bench/memory_probes.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace moebatch {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void XorWords(const uint64_t* w,
                                                                           size_t n,
                                                                           uint64_t* acc) {
  uint64_t a[8] = {acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] ^= w[i + j];
  }
  for (; i < n; ++i) a[0] ^= w[i];
  for (int j = 0; j < 8; ++j) acc[j] = a[j];
}

uint64_t XorRead(const uint64_t* w, int64_t n) {
  uint64_t x = 0;
#pragma omp parallel reduction(^ : x)
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t per = (n / threads + 7) / 8 * 8;
    const int64_t begin = std::min(n, per * omp_get_thread_num());
    const int64_t end = std::min(n, begin + per);
    uint64_t acc[8] = {};
    XorWords(w + begin, static_cast<size_t>(end - begin), acc);
    for (int j = 0; j < 8; ++j) x ^= acc[j];
  }
  return x;
}

double ReadPassSeconds(const TriadArrays& arrays, uint64_t* sink) {
  const double t0 = Now();
  *sink ^= XorRead(reinterpret_cast<const uint64_t*>(arrays.b()),
                   arrays.elements() * int64_t{sizeof(float)} / int64_t{sizeof(uint64_t)});
  return Now() - t0;
}

double MeasureReadGbs(int64_t mib, int64_t repeats) {
  const TriadArrays arrays(mib);
  if (!arrays.ok()) return 0;
  uint64_t sink = 0;
  (void)ReadPassSeconds(arrays, &sink);  // warm-up
  double best = 1e30;
  for (int64_t r = 0; r < std::max<int64_t>(repeats, 1); ++r) {
    best = std::min(best, ReadPassSeconds(arrays, &sink));
  }
  if (sink == 0x5eed) std::printf(" ");  // keeps the reads
  return static_cast<double>(arrays.elements()) * sizeof(float) / best / 1e9;
}

}  // namespace moebatch
