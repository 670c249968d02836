// ggml's block formats, decoded to f32: the reference the quantized kernels are checked against
// and what a tensor is widened with when a path needs f32 (norms, small tensors). The math is
// ggml-quants.c's dequantize_row_<type> (llama.cpp), element for element and in the same float
// operations, so the results equal gguf-py's gguf.quants.dequantize (tests/model/test_gguf.cc
// checks every type against it, on random blocks and on the real SmolLM2 file).
//
// Block layouts (ggml-common.h), `block_size` elements in `type_size` bytes (GgmlTypeInfo); in
// Q4_0 .. Q5_1 the low nibbles hold elements [0, 16), the high ones [16, 32):
//   Q4_0   {f16 d; u8 qs[16]}                           x = (q - 8) d
//   Q4_1   {f16 d, m; u8 qs[16]}                        x = q d + m
//   Q5_0   {f16 d; u8 qh[4]; u8 qs[16]}                 x = ((q | h << 4) - 16) d
//   Q5_1   {f16 d, m; u8 qh[4]; u8 qs[16]}              x = (q | h << 4) d + m
//   Q8_0   {f16 d; i8 qs[32]}                           x = q d
//   Q4_K   {f16 d, dmin; u8 scales[12]; u8 qs[128]}     256 = 8 sub-blocks of 32, a 6-bit scale
//                                                       and min each: x = d sc q - dmin m
//   Q5_K   {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}   as Q4_K with a fifth bit
//   Q6_K   {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}         16 sub-blocks of 16:
//                                                                x = d sc (q - 32)
//   MXFP4  {u8 e; u8 qs[16]}                            x = kvalues[q] 2^(e - 128) (E8M0 scale,
//                                                       FP4 E2M1 values doubled)
// plus F32, F16 and BF16 (one element per block).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/gguf.h"

namespace moebatch {

// Whether DequantizeRow decodes `type`.
bool CanDequantize(GgmlType type);

// dst [n] f32 = the n elements of `type` stored at src (n / block_size blocks). n a multiple of
// the type's block size. InvalidArgument for a type it does not decode or a bad n. Thread-safe.
absl::Status DequantizeRow(GgmlType type, const std::byte* src, int64_t n, float* dst);

// Quantizes the n elements of src (one row) into dst, n / 32 blocks of `type`: kQ8_0 (symmetric
// int8) or kQ4_1 (asymmetric 4-bit), round to nearest, with one scale (and min) per group of
// `group_size` elements (the last group of the row may be shorter), written into each block of the
// group. group_size 32 gives exactly ggml's quantize_row_q8_0_ref / quantize_row_q4_1_ref
// (ggml-quants.c): d = max|x| / 127 and q = round(x / d); d = (max - min) / 15, m = min and
// q = min(15, trunc((x - m) / d + 0.5)). InvalidArgument for another type, n not a multiple of 32
// or group_size not a positive multiple of 32. Thread-safe.
absl::Status QuantizeRow(GgmlType type, const float* src, int64_t n, int64_t group_size,
                         std::byte* dst);

}  // namespace moebatch
