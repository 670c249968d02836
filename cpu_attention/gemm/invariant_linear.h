// Batch-invariant dense layer on the CPU: y = x · Wᵀ (torch.nn.Linear's math, no bias) where every
// output element comes from one fixed sequence of floating-point operations, whatever M, the other
// rows of x, the thread count or the ISA level (AVX-512, AVX2 and portable give the same bits):
//   1. 16 partial sums; lane j accumulates x[t]·w[t] for t ≡ j (mod 16), t < K16 = K - K % 16, in
//      increasing t, each step one fused multiply-add (one rounding);
//   2. a pairwise tree over the lanes: lane i += lane i+8 (i < 8), then i+4, i+2, i+1;
//   3. the K % 16 remaining products, fused into the sum in increasing t.
// Why: oneDNN (like cuBLAS) picks its kernel, and with it the reduction order, by M. A greedy
// request's output then depends in its last bits on what else shares the pass, and at a near-tie
// the argmax flips: a request re-run after a crash or under another --max_num_seqs can come out
// different. "Batch invariance" (H. He, Thinking Machines Lab, "Defeating Nondeterminism in LLM
// Inference", 2025) removes that; the daemon's crash recovery needs it.
//
// Shapes and types: x [m, k] f32 row-major contiguous; w [n, k] row-major (PyTorch's Linear weight
// layout) in f32, bf16 or f16 (read in place, widened exactly in registers); y [m, n] f32. m, n or
// k may be 0 (k 0: y is zeros).
// Paths (same bits): few rows, a dot product per element over the weights in place
// (invariant_linear_kernel.h; over K slices when a block's rows of x pass 32 KiB, 4 rows or
// more); calls of 10 or more rows on AVX2, 32 or more on AVX-512, lane by lane, register-blocked
// over packed copies (invariant_linear_lanes.h).
// Threading: parallel over (row tile, weight-row tile) on the calling thread's OpenMP pool; each
// output element is computed whole by one thread. Reentrant. Memory: the dot-product path, per
// calling thread, a 64-byte aligned copy of x when x is not so aligned (m·k·4 bytes), and per
// thread the parked lane sums of K-sliced tiles (up to 64 KiB); the lane path, per thread, one
// panel of packed weights and its tile's lane sums (at K 14,336 and 256-row tiles: 1.2 MB on
// AVX2, 2.4 MB on AVX-512; invariant_linear_lanes.h), and a lane-major f32 copy of x per calling
// thread (m·k·4 bytes), kept for the next call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cpu_attention/runtime/cpu_isa.h"
#include "engine/model/dtype.h"

namespace moebatch {

// `isa` must be one SupportedCpuIsas() lists.
void InvariantLinear(CpuIsa isa, const float* x, int64_t m, int64_t k, const void* w, DType w_dtype,
                     int64_t n, float* y);

// With SelectedCpuIsa() (MOEBATCH_CPU_ISA forces a level, as for attention).
inline void InvariantLinear(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype,
                            int64_t n, float* y) {
  InvariantLinear(SelectedCpuIsa(), x, m, k, w, w_dtype, n, y);
}

// bf16 compute (Matmul's bf16 mode): y = x · Wᵀ with x [m, k] and W [n, k] both bf16 (the
// activations already rounded), y [m, n] f32, every element by one fixed sequence in the "pair
// order", the order of AVX512-BF16's vdpbf16ps:
//   1. 16 partial sums; for each whole 32-element chunk c of K (t < K32 = K - K % 32), lane j takes
//      x[t]·w[t] for t = 32c + 2j + 1, then t = 32c + 2j, each product exact (8-bit by 8-bit
//      significands fit f32's 24) and each addition rounded to nearest even; then, when
//      K % 32 >= 16, lane j takes t = K32 + j by one fused multiply-add;
//   2. InvariantLinear's lane tree;
//   3. the K % 16 remaining products, fused into the sum in increasing t;
//   all with denormal inputs read as zero and denormal results flushed to zero (MXCSR DAZ and FTZ,
//   which vdpbf16ps always applies; set on each working thread for the call and restored).
// Same bits at every ISA level and with or without AVX512-BF16. `vdpbf16ps` true: run on that
// instruction where `isa` is kAvx512 and CpuAvx512Bf16Usable() (4 x 4 blocks, operands read in
// place: twice the f32 FMA's multiply-adds per instruction); false, or elsewhere: the activations
// are widened and permuted per 32-element chunk (odd elements, then even) into a buffer of the
// calling thread (m·k·4 bytes, 64-byte aligned, kept for the next call) and InvariantLinear's tiles
// run on them with the weights read in the same permuted order (a pair = two f32 FMAs, odd first).
// Threading and tiles as InvariantLinear.
void InvariantLinearBf16(CpuIsa isa, const uint16_t* x, int64_t m, int64_t k, const uint16_t* w,
                         int64_t n, float* y, bool vdpbf16ps);

// Whether InvariantLinearBf16 at `isa` runs on vdpbf16ps by default: kAvx512 and the instruction
// is the faster path on this CPU (runtime/cpu_isa.h, CpuVdpbf16psPays()).
inline bool Bf16OnVdpbf16ps(CpuIsa isa) { return isa == CpuIsa::kAvx512 && CpuVdpbf16psPays(); }

// The same, on the default path (Bf16OnVdpbf16ps).
inline void InvariantLinearBf16(CpuIsa isa, const uint16_t* x, int64_t m, int64_t k,
                                const uint16_t* w, int64_t n, float* y) {
  InvariantLinearBf16(isa, x, m, k, w, n, y, Bf16OnVdpbf16ps(isa));
}

// The same product with W [n, k] in ggml's Q8_0 blocks (n rows of k / 32 blocks of 34 bytes: an
// f16 scale d, then 32 int8 values q; element d·q, ggml's dequantize_row_q8_0), each weight
// widened exactly to f32 (8 by 11 significant bits) in registers or into the lane path's packed
// panels: bit for bit InvariantLinear over gguf.quants.dequantize's f32 weights, at every ISA level
// and M. The weights stay 8-bit in memory. Against QuantLinear's Q8_0 (llama.cpp's method: x
// rounded to int8 per block of 32, integer dot products) the activations keep their f32 values.
// Paths, threading and memory as InvariantLinear's (the lane path from 21 rows on AVX2, 32 on
// AVX-512).
// InvalidArgument for k not a multiple of 32, a negative size, or a null pointer with m, n, k > 0.
absl::Status InvariantLinearQ8_0(CpuIsa isa, const float* x, int64_t m, int64_t k,
                                 const std::byte* w, int64_t n, float* y);
inline absl::Status InvariantLinearQ8_0(const float* x, int64_t m, int64_t k, const std::byte* w,
                                        int64_t n, float* y) {
  return InvariantLinearQ8_0(SelectedCpuIsa(), x, m, k, w, n, y);
}

// The same product with W [n, k] in ggml's MXFP4 blocks (n rows of k / 32 blocks of 17 bytes:
// an E8M0 exponent e, then 16 bytes of 4-bit codes q; element value kvalues_mxfp4[q] · 2^(e - 128),
// engine/model/ggml_quants.h), each weight widened exactly to f32 (those values are floats):
// bit for bit InvariantLinear over the widened weights, so with f32 activations what transformers
// computes over the dequantized checkpoint (gpt-oss's convert_moe_packed_tensors) up to the sum's
// order. The weights stay 4-bit in memory. Paths (same bits): fewer than 10 rows of x (AVX2 code,
// also on AVX-512 hosts), each block widened in registers where it is used; more, or the portable
// level, a tile of weight rows (~256 KiB as f32) widened once per call into a per-thread buffer
// and run against every row of x by InvariantLinear's f32 tiles (on AVX2 lane by lane, x packed
// once into a buffer of the calling thread, as InvariantLinear's). Threading as InvariantLinear
// (parallel over weight rows). InvalidArgument for k not a multiple of 32, a negative size, or a
// null pointer with m, n, k > 0.
absl::Status InvariantLinearMxfp4(CpuIsa isa, const float* x, int64_t m, int64_t k,
                                  const std::byte* w, int64_t n, float* y);
inline absl::Status InvariantLinearMxfp4(const float* x, int64_t m, int64_t k, const std::byte* w,
                                         int64_t n, float* y) {
  return InvariantLinearMxfp4(SelectedCpuIsa(), x, m, k, w, n, y);
}

}  // namespace moebatch
