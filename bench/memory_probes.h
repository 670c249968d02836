// Read-only memory probes of bench_attention_bandwidth: loops that read bytes with no math, the
// memory-side ceilings the decode attention kernels are compared with (MoE-Lens §6.6 puts decode
// attention on the CPU because it is bound by memory bandwidth).
// Threading: each probe runs on the calling thread's OpenMP pool; call it outside a parallel
// region (XorWords itself is single-threaded and reentrant).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_attention/runtime/host_roof.h"

namespace moebatch {

// XOR of the n 64-bit words at w into acc[8] (8 independent lanes), with the widest loads the CPU
// has (compiled for AVX-512, AVX2 and baseline x86-64, picked at load time).
void XorWords(const uint64_t* w, size_t n, uint64_t* acc);

// The XOR of the n words at w, split statically over the pool (as an OpenMP static loop over the
// same memory splits it), each thread's share read once by XorWords.
uint64_t XorRead(const uint64_t* w, int64_t n);

// One read-only pass over the triad's array b (arrays.elements() floats): seconds. The XOR goes
// into *sink so that the reads cannot be dropped.
double ReadPassSeconds(const TriadArrays& arrays, uint64_t* sink);

// Contiguous read bandwidth: the best of `repeats` (>= 1) read-only passes over array b of a
// TriadArrays of `mib` MiB, bytes/s / 1e9 (GB/s). 0 when the arrays cannot be mapped.
double MeasureReadGbs(int64_t mib, int64_t repeats);

}  // namespace moebatch
