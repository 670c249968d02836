#include "cpu_attention/runtime/cpu_isa.h"

#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
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
