#include "cpu_attention/runtime/cpu_isa.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "spdlog/spdlog.h"

namespace moebatch {

CpuIsa ResolveCpuIsa(const char* requested, const std::vector<CpuIsa>& supported,
                     std::string* warning) {
  warning->clear();
  const CpuIsa best = supported.back();
  if (requested == nullptr || *requested == '\0') return best;
  const std::string name(requested);
  CpuIsa want;
  if (name == "portable") {
    want = CpuIsa::kPortable;
  } else if (name == "avx2") {
    want = CpuIsa::kAvx2;
  } else if (name == "avx512") {
    want = CpuIsa::kAvx512;
  } else {
    *warning = "MOEBATCH_CPU_ISA=" + name + " is not one of portable, avx2, avx512; using " +
               CpuIsaName(best);
    return best;
  }
  CpuIsa got = CpuIsa::kPortable;
  for (CpuIsa isa : supported) {
    if (static_cast<int>(isa) <= static_cast<int>(want)) got = isa;
  }
  if (got != want) {
    *warning =
        "MOEBATCH_CPU_ISA=" + name + " is not supported by this CPU; using " + CpuIsaName(got);
  }
  return got;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return "portable";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> isas{CpuIsa::kPortable};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    isas.push_back(CpuIsa::kAvx2);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      isas.push_back(CpuIsa::kAvx512);
    }
  }
#endif
  return isas;
}

CpuIsa SelectedCpuIsa() {
  static const CpuIsa selected = [] {
    std::string warning;
    const CpuIsa isa = ResolveCpuIsa(std::getenv("MOEBATCH_CPU_ISA"), SupportedCpuIsas(), &warning);
    if (!warning.empty()) spdlog::warn("{}", warning);
    return isa;
  }();
  return selected;
}

bool CpuAvx512Bf16Usable() {
  static const bool usable = [] {
#if defined(__x86_64__)
    const std::vector<CpuIsa> isas = SupportedCpuIsas();
    if (isas.back() != CpuIsa::kAvx512) return false;
    if (const char* env = std::getenv("MOEBATCH_CPU_BF16");
        env != nullptr && std::string(env) == "0") {
      return false;
    }
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && ((a >> 5) & 1);
#else
    return false;
#endif
  }();
  return usable;
}

#if defined(__x86_64__)
namespace {

// 12 independent accumulators of one instruction, kept in registers (the empty asm statements
// make every iteration's results live), `iterations` rounds; returns instructions per second.
template <typename Step>
__attribute__((target("avx512f,avx512bf16"))) double IssueRate(Step step, long iterations) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
         a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
    a0 = step(a0), a1 = step(a1), a2 = step(a2), a3 = step(a3), a4 = step(a4), a5 = step(a5);
    a6 = step(a6), a7 = step(a7), a8 = step(a8), a9 = step(a9), a10 = step(a10), a11 = step(a11);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
    __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return seconds > 0 ? 12.0 * static_cast<double>(iterations) / seconds : 0.0;
}

// {vdpbf16ps, vfmadd231ps} instructions per second on the calling thread, best of 3 rounds each.
__attribute__((target("avx512f,avx512bf16"))) std::pair<double, double> Bf16AndFmaRates() {
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // 1.0, 1.0
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33803380));  // 2^-24
  const __m512 f = _mm512_set1_ps(1.0f), g = _mm512_set1_ps(0x1p-24f);
  const auto dp = [&](__m512 a) __attribute__((target("avx512f,avx512bf16"))) {
    return _mm512_dpbf16_ps(a, x, y);
  };
  const auto fma = [&](__m512 a) __attribute__((target("avx512f,avx512bf16"))) {
    return _mm512_fmadd_ps(a, f, g);
  };
  constexpr long kIterations = 20000;
  double dp_rate = 0, fma_rate = 0;
  for (int round = 0; round < 3; ++round) {
    dp_rate = std::max(dp_rate, IssueRate(dp, kIterations));
    fma_rate = std::max(fma_rate, IssueRate(fma, kIterations));
  }
  return {dp_rate, fma_rate};
}

}  // namespace
#endif

bool CpuVdpbf16psPays() {
  static const bool pays = [] {
    if (!CpuAvx512Bf16Usable()) return false;
    if (const char* env = std::getenv("MOEBATCH_CPU_BF16");
        env != nullptr && std::string(env) == "1") {
      return true;
    }
#if defined(__x86_64__)
    const auto [dp_rate, fma_rate] = Bf16AndFmaRates();
    const bool faster = 32 * dp_rate >= 1.2 * 16 * fma_rate;
    spdlog::info(
        "bf16 GEMMs: vdpbf16ps issues {:.2f} G/s, vfmadd231ps {:.2f} G/s on this core ({:.2f}x "
        "the multiply-adds): {}",
        dp_rate / 1e9, fma_rate / 1e9, fma_rate > 0 ? 2 * dp_rate / fma_rate : 0.0,
        faster ? "vdpbf16ps" : "f32 FMAs (same bits)");
    return faster;
#else
    return false;
#endif
  }();
  return pays;
}

bool CpuAmxUsable() {
  static const bool usable = [] {
#if defined(__x86_64__) && defined(__linux__)
    if (SelectedCpuIsa() != CpuIsa::kAvx512) return false;
    if (const char* env = std::getenv("MOEBATCH_CPU_AMX");
        env != nullptr && std::string(env) == "0") {
      return false;
    }
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    const bool avx512_bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) != 0 && ((a1 >> 5) & 1);
    if (!amx_tile || !amx_bf16 || !avx512_bf16) return false;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if (((xcr0_lo >> 17) & 3) != 3) return false;
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtileData = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) != 0) {
      spdlog::warn("the CPU has AMX but Linux refused its use (arch_prctl): AMX kernels off");
      return false;
    }
    return true;
#else
    return false;
#endif
  }();
  return usable;
}

}  // namespace moebatch
