#include "cpu_attention/runtime/host_roof.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cpu_attention/runtime/cpu_isa.h"

namespace moebatch {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iterations) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  float out[16], sum = 0;
  for (int i = 0; i < 16; ++i) {
    _mm512_storeu_ps(out, acc[i]);
    for (float x : out) sum += x;
  }
  return sum;
}

// 12 independent chains: they cover the FMA latency (4-5 cycles) at two FMAs a cycle and, with a
// and b, fit AVX2's 16 registers (16 chains would spill and measure half the rate: on Zen 3 3.1
// instead of 6.2 G FMAs/s per core).
constexpr int kAvx2Chains = 12;

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iterations) {
  __m256 acc[kAvx2Chains];
  for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float out[8], sum = 0;
  for (int i = 0; i < kAvx2Chains; ++i) {
    _mm256_storeu_ps(out, acc[i]);
    for (float x : out) sum += x;
  }
  return sum;
}

// An array of n floats in its own anonymous mapping, transparent huge pages asked for; its pages
// are first touched by the threads that use them. null when the mapping fails.
float* MapFloats(int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)::madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<float*>(p);
}

}  // namespace

TriadArrays::TriadArrays(int64_t mib)
    : n_(std::max<int64_t>(mib, 1) * (int64_t{1} << 20) / int64_t{sizeof(float)}),
      a_(MapFloats(n_)),
      b_(MapFloats(n_)),
      c_(MapFloats(n_)) {
  if (!ok()) return;
  float *a = a_, *b = b_, *c = c_;
  const int64_t n = n_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
}

TriadArrays::~TriadArrays() {
  for (float* p : {a_, b_, c_}) {
    if (p != nullptr) ::munmap(p, static_cast<size_t>(n_) * sizeof(float));
  }
}

double TriadArrays::Pass() {
  float* a = a_;
  const float *b = b_, *c = c_;
  const int64_t n = n_;
  const float s = 3.0f;
  const double t0 = Now();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
  return Now() - t0;
}

TriadBandwidth MeasureTriad(int64_t mib, int repeats) {
  TriadArrays arrays(mib);
  TriadBandwidth out;
  if (!arrays.ok()) return out;
  std::vector<double> seconds;
  for (int r = 0; r < std::max(repeats, 1); ++r) seconds.push_back(arrays.Pass());
  std::sort(seconds.begin(), seconds.end());
  if (seconds.front() > 0) out.best = arrays.Bytes() / seconds.front();
  if (seconds[seconds.size() / 2] > 0) out.median = arrays.Bytes() / seconds[seconds.size() / 2];
  return out;
}

namespace {

// TDPBF16PS on one thread: `iterations` x 4 into four accumulators; seconds. Leaves the tiles
// released.
__attribute__((target("amx-tile,amx-bf16"))) double AmxLoopSeconds(int64_t iterations) {
  struct alignas(64) {
    uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  alignas(64) uint16_t operand[512];
  uint32_t x = 12345;
  for (uint16_t& v : operand) {  // bf16 in [0.5, 2), either sign
    x = x * 1103515245u + 12345u;
    v = static_cast<uint16_t>(0x3f00u + ((x >> 16) & 0xffu) + ((x >> 8) & 1u) * 0x8000u);
  }
  alignas(64) float out[256];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  const double t0 = Now();
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);  // waits for the products
  const double dt = Now() - t0;
  _tile_release();
  return out[0] == 42.0f ? dt + 0.0 : dt;  // the products' result is used
}

}  // namespace

double MeasureAmxTileNs(int64_t iterations) {
  if (!CpuAmxUsable() || iterations <= 0) return 0;
  double worst = 0;
#pragma omp parallel reduction(max : worst)
  worst = AmxLoopSeconds(iterations);
  return worst / (4.0 * static_cast<double>(iterations)) * 1e9;
}

FmaPeak MeasureFmaPeak(int64_t iterations, int repeats) {
  FmaPeak peak;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  peak.isa = avx512 ? "avx512" : avx2 ? "avx2" : "none";
  if (!avx512 && !avx2) return peak;
  const int lanes = avx512 ? 16 : 8, chains = avx512 ? 16 : kAvx2Chains;
  const int threads = omp_get_max_threads();
  for (int r = 0; r < std::max(repeats, 1); ++r) {  // the best: a busy host's slices fall out
    float total = 0;
    const double t0 = Now();
#pragma omp parallel reduction(+ : total)
    total += avx512 ? FmaLoopAvx512(iterations) : FmaLoopAvx2(iterations);
    const double dt = Now() - t0;
    if (total == 42.0f) peak.flops_per_s += 0;  // the loops' result is used
    if (dt > 0) {
      peak.flops_per_s = std::max(
          peak.flops_per_s, 2.0 * static_cast<double>(iterations) * chains * lanes * threads / dt);
    }
  }
  return peak;
}

MeasuredHost MeasureHost(int64_t triad_mib, int repeats) {
  MeasuredHost host;
  host.threads = omp_get_max_threads();
  host.triad_bytes_per_s = MeasureTriad(triad_mib, repeats).best;
  const FmaPeak peak = MeasureFmaPeak();
  host.fma_flops_per_s = peak.flops_per_s;
  host.fma_isa = peak.isa;
  return host;
}

}  // namespace moebatch
