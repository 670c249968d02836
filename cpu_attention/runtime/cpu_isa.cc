#include "cpu_attention/runtime/cpu_isa.h"

#include <cstdlib>
#include <string>

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

}  // namespace moebatch
