// The x86 vector ISA levels the cpu backend's kernels are compiled for, and the one they run at.
//
// One binary runs everywhere: each ISA's kernels are compiled in their own files with their own
// flags (AVX2 + FMA + F16C; AVX-512 F/BW/VL/DQ), never -march=native, and the best level the CPU
// supports is chosen at run time from CPUID (__builtin_cpu_supports). MOEBATCH_CPU_ISA=portable|
// avx2|avx512 forces a level, clamped to what the CPU has (with a warning). The decode attention
// (attention/decode_attention.h) and the batch-invariant GEMM (gemm/invariant_linear.h) dispatch on
// it.
//
// Threading: every function is thread-safe; SelectedCpuIsa reads the environment once.
#pragma once

#include <string>
#include <vector>

namespace moebatch {

enum class CpuIsa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// "portable", "avx2", "avx512".
const char* CpuIsaName(CpuIsa isa);
// Every level this CPU can run, lowest first (kPortable always).
std::vector<CpuIsa> SupportedCpuIsas();
// The level the kernels use: the highest supported, or MOEBATCH_CPU_ISA's (read once).
CpuIsa SelectedCpuIsa();

// Parses a MOEBATCH_CPU_ISA value (nullptr or "" = unset) and clamps it to `supported` (lowest
// first, never empty). Unset: the highest supported. Unknown names or unsupported levels: the
// highest supported level not above the request, with a message in *warning (else it is cleared).
CpuIsa ResolveCpuIsa(const char* requested, const std::vector<CpuIsa>& supported,
                     std::string* warning);

}  // namespace moebatch
