// Quantized dense layer on the CPU: y = x · Wᵀ (torch.nn.Linear's math, no bias) with W read in
// place in one of ggml's block formats (llama.cpp's GGUF tensor types), never widened to floats.
//
// Method: llama.cpp's (ggml-cpu quants.c, ggml_vec_dot_<type>_q8_0 / _q8_K): every activation row
// is quantized once per call to int8, the weight blocks are unpacked to small integers and the
// products are integer dot products (AVX2: vpmaddubsw + vpmaddwd; AVX-512: VNNI vpdpbusd /
// vpdpwssd), with float scales applied per block. Block layouts: ggml-common.h (block_q4_0 ...
// block_q6_K, block_mxfp4); the value each element stands for: engine/model/ggml_quants.h
// (DequantizeRow). Two schemes, each one fixed sequence of float operations per output element,
// whatever M, the other rows of x, the tiling, the thread count or the ISA level (AVX-512 VNNI,
// AVX2 and portable give the same bits; quant_linear_portable.cc is the lane-exact model the
// vector kernels follow).
//
// Types of 32-blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4), as ggml's q8_0 dot products: x is
// quantized in blocks of 32 (d = amax / 127, q = x · (1 / d) rounded half to even, |q| <= 127, as
// quantize_row_q8_0), and every block is 32 int8 w_i, a float scale, and an optional float c, with
// value_i = scale · w_i + c:
//   Q4_0  w = q - 8, scale d              Q4_1  w = q, scale d, c = m
//   Q5_0  w = q - 16, scale d             Q5_1  w = q, scale d, c = m
//   Q8_0  w = q, scale d                  MXFP4 w = kvalues[q] (E2M1 doubled), scale 2^(e - 128)
//   1. integer lanes: for weight block b and lane l (elements 4l..4l+3), p = Σ w_i · q_i (exact);
//   2. 16 float partial sums a[0..16): a[8·(b mod 2) + l] = fma(scale_b · d_b, float(p), a[..]),
//      the product scale · d rounded to float first, blocks in increasing b;
//   3. types with c: 8 partial sums e[0..8): e[b mod 8] = fma(c_b, s_b, e[b mod 8]) with
//      s_b = d_b · float(Σ_i q_i) (one rounding), blocks in increasing b;
//   4. y = Tree(a) (lane i += lane i+8, then i+4, i+2, i+1), and for types with c
//      y = Tree(a) + Tree(e) (e: lane i += lane i+4, i+2, i+1).
//
// K-quants (Q4_K, Q5_K, Q6_K), as ggml's q8_K dot products: x is quantized per super-block of 256
// as quantize_row_q8_K (max = the element of largest |x|, iscale = -127 / max, q =
// nearest_int(iscale · x), dx = 1 / iscale), and the sub-block scales stay integers:
//   Q4_K, Q5_K  w = q, value = d · sc_j · w - dmin · m_j (sc_j, m_j 6-bit, per 32)
//   Q6_K        w = q - 32, value = d · sc_t · w (sc_t int8, per 16)
//   1. integer lanes per super-block g: L[l] = Σ over its 8 blocks of Σ_{i = 4l..4l+3} sc · w_i ·
//   q_i
//      (exact: |L| < 2^24), l < 8; and, Q4_K / Q5_K, E[j] = m_2j · B_2j + m_2j+1 · B_2j+1 (j < 4)
//      with B_b = Σ of q over block b;
//   2. a[l] = fma(d · dx, float(L[l]), a[l]) (d · dx rounded to float first), super-blocks in
//      increasing g; Q4_K / Q5_K: e[j] = fma(dmin · dx, float(E[j]), e[j]);
//   3. y = Tree(a) (lane i += lane i+4, i+2, i+1), minus Tree(e) (i += i+2, i+1) for Q4_K / Q5_K.
// One float multiply-add per 32 elements instead of one per 4: the 4-bit types at decode-sized M
// are bound by instructions, not bytes, otherwise (bench/quant_linear.cc).
//
// Accuracy: besides float rounding (~1e-6 relative to Σ|x·w|), the int8 activations: each x_i is
// replaced by d_b · q_i, |x_i - d_b · q_i| <= |d_b| / 2 (b the block of 32, or the super-block of
// 256 for the K-quants), so |y - x·Wᵀ| <= Σ_b (|d_b| / 2) Σ_{i in b} |value_i|
// (tests/cpu_attention/test_quant_linear.cc checks that bound, and a relative RMS error near 0.6%
// (blocks of 32) and 0.8% (256) on Gaussian data).
//
// Shapes and types: x [m, k] f32 row-major contiguous; W [n, k] as a GGUF tensor stores a Linear
// weight (or one expert's slice of it): n rows, each k / block_size blocks of type_size bytes (row
// stride k / block_size · type_size bytes, no padding; only the blocks' own bytes are read); y
// [m, n] f32 row-major. m or n may be 0 (nothing written); k 0 writes zeros.
// Work split: m <= 8 (decode) streams each weight row once from memory and unpacks each group of 8
// blocks once for all m rows (AVX2 keeps 4 rows in registers: m 5..8 unpacks a row twice, the
// second time from L1; at m = 1 AVX2 unpacks each block where it is used instead); larger m unpacks
// a tile of weight rows once into a buffer of 3/4 of a core's L2 (at most 384 KiB) and runs 8 rows
// of x at a time (AVX2: 4) over it in K slices of 1024 that stay in L1 (as InvariantLinear), the
// next slice's activations prefetched while one runs; AVX2's types of 32-blocks take
// those rows block by block, each block's unpacked weights loaded once for all of them, and its
// K-quants take 4 rows of x against 2 weight rows at once, then the mins term (Q4_K / Q5_K) in a
// second pass, 8 weight rows per vector, and Q6_K's take x as q + 128 (unsigned) against signed
// weights, the constant this adds subtracted once per super-block (the order of each output's
// operations and its integer sums are unchanged: quant_linear_avx2.cc, TileK). The activations are
// quantized once per call, on the calling thread's pool, into a thread_local buffer of the calling
// thread (~3.3 bytes per element of x). Threading: parallel over tiles of weight rows (and of 64 x
// rows) on the calling thread's OpenMP pool; each output element is computed whole by one thread.
// Reentrant. Rounding of q uses the current rounding mode (the default, to nearest even).
// Ownership: reads x and w, writes y; keeps no pointers. Errors: InvalidArgument, naming the type
// and the reason, for a type QuantLinearSupports refuses, k not a multiple of the type's block
// size, a negative size, a null pointer with m, n, k > 0, or an `isa` SupportedCpuIsas() does not
// list. Nothing aborts. ISA: kAvx512 runs the AVX-512 VNNI kernels where CPUID has avx512vnni, else
// the AVX2 ones (same bits); kAvx2 needs AVX2 + FMA + F16C.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cpu_attention/runtime/cpu_isa.h"
#include "engine/model/ggml_type.h"

namespace moebatch {

// Whether QuantLinear computes with weights of `type`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K and MXFP4.
bool QuantLinearSupports(GgmlType type);

// Whether QuantLinear at `isa` runs the AVX-512 VNNI kernels (kAvx512 where CPUID has avx512vnni:
// vpdpbusd, four int8 products and their sum a lane in one instruction); false: the AVX2 or
// portable ones (AVX2: vpsignb, vpmaddubsw, vpmaddwd, then the add, for the same work).
// Thread-safe (CPUID is read once).
bool QuantLinearUsesVnni(CpuIsa isa);

// y[m, n] = x[m, k] · Wᵀ where W [n, k] is stored as ggml blocks of `type` at w (see above).
absl::Status QuantLinear(CpuIsa isa, const float* x, int64_t m, int64_t k, const std::byte* w,
                         GgmlType type, int64_t n, float* y);

// With SelectedCpuIsa() (MOEBATCH_CPU_ISA forces a level, as for attention).
inline absl::Status QuantLinear(const float* x, int64_t m, int64_t k, const std::byte* w,
                                GgmlType type, int64_t n, float* y) {
  return QuantLinear(SelectedCpuIsa(), x, m, k, w, type, n, y);
}

}  // namespace moebatch
