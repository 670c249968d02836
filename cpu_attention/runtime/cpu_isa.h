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

// Whether the AVX512-BF16 kernels may run: the CPU has AVX-512 (kAvx512 supported) and
// AVX512-BF16 (CPUID 7.1 EAX bit 5), and MOEBATCH_CPU_BF16=0 does not turn them off. The AVX-512
// level's bf16 GEMM (gemm/invariant_linear.h, InvariantLinearBf16) can run on vdpbf16ps where it
// is true (by default where CpuVdpbf16psPays() also holds), on f32 FMAs with the same bits
// elsewhere. Read once.
bool CpuAvx512Bf16Usable();

// Whether InvariantLinearBf16 runs on vdpbf16ps by default: CpuAvx512Bf16Usable() and the
// instruction does more multiply-adds per second than the f32 FMA path it replaces, measured once
// per process (about 1 ms, on the first call's thread): 12 independent accumulators of each
// instruction in registers, best of 3 interleaved rounds, and vdpbf16ps taken when its 32
// multiply-adds per instruction run at >= 1.2x vfmadd231ps's 16. Both paths give the same bits, so
// only speed depends on it. Why: on AMD Zen 4 vdpbf16ps issues as fast as an FMA (2x the
// multiply-adds); on the Sapphire Rapids VMs of this project at a quarter of the FMA's rate (1.16
// against 4.63 G/s: 0.50x the multiply-adds), where the f32 path is 1.3-1.8x faster
// (docs/performance.md). MOEBATCH_CPU_BF16=1 takes vdpbf16ps wherever it is usable, =0 never. Logs
// the rates and the choice (spdlog info). Thread-safe (a function-local static).
bool CpuVdpbf16psPays();

// Whether the AMX kernels may run: the CPU has AMX-TILE and AMX-BF16 (CPUID 7.0 EDX bits 24, 22)
// beside AVX512-BF16, the OS saves the tile state (XCR0 bits 17, 18) and grants this process its
// use (Linux arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once), and neither
// MOEBATCH_CPU_ISA selects a level below avx512 nor MOEBATCH_CPU_AMX=0 turns them off. The AVX-512
// level's kernels use AMX where it pays (attention/decode_attention.h says where). Read once.
bool CpuAmxUsable();

// Parses a MOEBATCH_CPU_ISA value (nullptr or "" = unset) and clamps it to `supported` (lowest
// first, never empty). Unset: the highest supported. Unknown names or unsupported levels: the
// highest supported level not above the request, with a message in *warning (else it is cleared).
CpuIsa ResolveCpuIsa(const char* requested, const std::vector<CpuIsa>& supported,
                     std::string* warning);

}  // namespace moebatch
