// InvariantLinear for calls of many rows, lane by lane (invariant_linear.h's steps 1-3, same
// bits): step 1's lane j of an output element y[r, c] is a chain of fused multiply-adds over the
// K/16 products x[r, t]·w[c, t] with t ≡ j (mod 16), in increasing t. Block
// (invariant_linear_kernel.h) keeps the 16 lanes of an element in one vector, so every FMA needs a
// fresh weight vector and activation vector: a dot-product kernel, load-bound at about a third of
// the FMA peak on AVX2. Here the 16 lanes become 16 independent GEMMs of depth K/16, each
// vectorised across output columns as a register-blocked outer product (MR rows x NR columns of
// accumulators; one weight vector load and one activation broadcast feed a row or a column of
// FMAs), the BLIS micro-kernel shape (Van Zee and van de Geijn, "BLIS: A Framework for Rapidly
// Instantiating BLAS Functionality", 2015). Each accumulator lane still sees the same FMAs in the
// same order, so the partial sums are the same bits; step 2's tree then adds the 16 lane results
// with the same pairs (vectorised across columns) and step 3 fuses the K % 16 tail in increasing t,
// as Block does.
//
// Packed data (exact copies):
//   xp  [rows / MR][16 lanes][K/16 steps][MR] f32: x's rows, lane-major, zero rows padding the
//       last block; packed once per call by the caller (invariant_linear.cc), shared by all tiles;
//   wp  [16 lanes][K/16 steps][NR] f32: one panel of NR weight rows, widened from bf16/f16 (in the
//       pair order, kBF16Pairs, permuted as xp's rows are) or Q8_0 blocks, zero columns padding
//       it; per tile and panel, thread_local;
//   acc [16 lanes][kChunkBlocks x MR rows][NR] f32: each lane's partial sums for one chunk of row
//       blocks, parked between K slices until the tree; thread_local.
// Lanes are LaneStride(...) floats apart (invariant_linear_internal.h), a little more than their
// size. wp and acc start on 64-byte boundaries (as do their lanes and steps), so no vector load of
// them splits across two cache lines.
// Bytes: xp rows·K·4 (a copy of x), per thread NR·K·4 + kChunkBlocks·MR·NR·64 (NR 16, K 14,336:
// 0.9 MB + 48 KiB).
//
// The including ISA file defines MOEBATCH_INVARIANT_ISA (as for invariant_linear_kernel.h) and a
// column-vector type CV of CV::kWidth f32 lanes with Zero(), Load(const float*), Store(float*, CV),
// Broadcast(const float*), Fma(a, b, acc) (one rounding of a·b + acc per lane), Add(a, b), and the
// packing:
//   template <int MR> PackRows(const float* x, int64_t rows, int64_t k, float* xp): the blocks of
//     xp for rows [0, rows) of x (row stride k), zero rows padding the last;
//   template <WForm WD, int NR> PackWeights(const WElem<WD>* w, int64_t cols, int64_t k,
//     float* wp): wp from weight rows [0, cols) of w (row stride WRowStride<WD>(k), cols <= NR),
//     zero columns after them.
#pragma once

#ifndef MOEBATCH_INVARIANT_ISA
#error "define MOEBATCH_INVARIANT_ISA (the per-ISA namespace) before including this file"
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu_attention/gemm/invariant_linear_kernel.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace MOEBATCH_INVARIANT_ISA {

// The loops of a tile, for each panel of NR weight rows: chunks of kChunkBlocks row blocks; in a
// chunk, K slices of kLaneSliceBytes / (NR x 4) steps; in a slice, lane by lane, the chunk's row
// blocks over the lane's weight slice. The weight slice (16 KiB) stays in L1 while the chunk's
// blocks pass over it, and the chunk's lane sums (16 lanes x kChunkBlocks x MR x NR f32: 48 KiB
// at 6 x 16) stay in L2 until the tree adds them. On Zen 3 (one thread, [14336, 4096] bf16, M 512)
// 256-step slices and chunks of 8 blocks ran at 85-88 GFLOP/s (best of 5-8 alternated runs) against
// 83-85 with 128-step slices over all 43 blocks of a 256-row tile (both with the activations'
// prefetch below); at K 14,336 chunks of 8 read 73-79 against 64-77 for chunks of 4
// (docs/performance.md, "Expert GEMMs at prefill M on Zen 3").
constexpr int64_t kLaneSliceBytes = 16 << 10;
constexpr int64_t kChunkBlocks = 8;

// One step of the micro-kernel: a[r][v] += x[r] * w[v] for step s of xp [steps][MR] and wp
// [steps][NR].
template <class CV, int MR, int NRV>
__attribute__((always_inline)) inline void LaneStep(const float* xp, const float* wp, int64_t s,
                                                    CV (&a)[MR][NRV]) {
  constexpr int W = CV::kWidth, NR = NRV * W;
  CV b[NRV];
  for (int v = 0; v < NRV; ++v) b[v] = CV::Load(wp + s * NR + v * W);
  for (int r = 0; r < MR; ++r) {
    const CV xr = CV::Broadcast(xp + s * MR + r);
    for (int v = 0; v < NRV; ++v) a[r][v] = CV::Fma(xr, b[v], a[r][v]);
  }
}

// acc[r][0:NR] (row stride NR) += the FMAs of steps [0, steps) of one lane, MR rows x NRV vectors:
// xp [steps][MR], wp [steps][NR]. first: the accumulators start at zero instead of acc's values.
// xp_next: the next call's activations (as many), prefetched into L1 a step's worth per step; each
// call's activations are a new stream in a packed copy of x far larger than L2, and without the
// prefetch the loop waited on them (Zen 3, one thread, M 512: 83-85 GFLOP/s with it against 80-82
// without, best of 5-8 alternated runs). Always inlined: GCC 12 keeps the accumulator array in
// registers only then (called out of line, it stores them to the stack at every step, a third of
// the speed).
template <class CV, int MR, int NRV>
__attribute__((always_inline)) inline void LaneMicroKernel(const float* xp, const float* wp,
                                                           int64_t steps, float* acc, bool first,
                                                           const float* xp_next) {
  constexpr int W = CV::kWidth, NR = NRV * W;
  CV a[MR][NRV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NRV; ++v) a[r][v] = first ? CV::Zero() : CV::Load(acc + r * NR + v * W);
  }
  for (int64_t s = 0; s < steps; ++s) {
    __builtin_prefetch(xp_next + s * MR, 0, 3);
    LaneStep<CV, MR, NRV>(xp, wp, s, a);
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NRV; ++v) CV::Store(acc + r * NR + v * W, a[r][v]);
  }
}

// y[m0:m1, n0:n1] (LaneKernel::tile): x rows m0.. (stride k), xp the packed rows of the whole call
// (m0 a multiple of MR), w rows n0.. (stride k), y row stride ldy.
template <class CV, WForm WD, int MR, int NRV>
void LaneTile(const float* x, const float* xp, int64_t m0, int64_t m1, int64_t k,
              const void* w_void, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int NR = NRV * CV::kWidth;
  const int64_t ldw = WRowStride<WD>(k);
  const WElem<WD>* w = static_cast<const WElem<WD>*>(w_void) + n0 * ldw;
  const int64_t rows = m1 - m0, cols = n1 - n0, k16 = k - k % 16, steps = k16 / 16;
  const int64_t blocks = (rows + MR - 1) / MR;
  const int64_t xs = LaneStride(steps * MR), ws = LaneStride(steps * NR);
  const int64_t as = LaneStride(std::min(blocks, kChunkBlocks) * MR * NR);
  const int64_t slice_steps = kLaneSliceBytes / (NR * static_cast<int64_t>(sizeof(float)));
  x += m0 * k;
  xp += m0 / MR * 16 * xs;
  y += m0 * ldy + n0;
  thread_local std::vector<float> wp_buffer, acc_buffer;
  float* const wp = Aligned64(wp_buffer, 16 * ws);
  float* const acc = Aligned64(acc_buffer, 16 * as);
  if (steps == 0) std::fill(acc, acc + 16 * as, 0.0f);
  for (int64_t c0 = 0; c0 < cols; c0 += NR) {
    const int64_t nc = std::min<int64_t>(NR, cols - c0);
    CV::template PackWeights<WD, NR>(w + c0 * ldw, nc, k, wp);
    // The next panel's weight rows (contiguous) are prefetched into L2 while this one computes, a
    // share per lane and slice, so that its packing does not wait on memory.
    const char* next = reinterpret_cast<const char*>(w + std::min(cols, c0 + NR) * ldw);
    const int64_t next_bytes = std::min<int64_t>(NR, std::max<int64_t>(0, cols - c0 - NR)) * ldw *
                               static_cast<int64_t>(sizeof(WElem<WD>));
    const int64_t chunks = (blocks + kChunkBlocks - 1) / kChunkBlocks;
    const int64_t visits = chunks * ((steps + slice_steps - 1) / slice_steps) * 16;  // 0: K < 16
    const int64_t share = visits == 0 ? 0 : (next_bytes / visits + 63) / 64;
    int64_t fetched = 0;
    for (int64_t rb0 = 0; rb0 < blocks; rb0 += kChunkBlocks) {
      const int64_t rb1 = std::min(blocks, rb0 + kChunkBlocks);
      // Step 1: slices of K, lane by lane, the chunk's row blocks over the lane's weight slice.
      for (int64_t s0 = 0; s0 < steps; s0 += slice_steps) {
        const int64_t len = std::min(slice_steps, steps - s0);
        for (int j = 0; j < 16; ++j) {
          for (int64_t i = 0; i < share && fetched < next_bytes; ++i, fetched += 64) {
            __builtin_prefetch(next + fetched, 0, 2);
          }
          const float* wj = wp + j * ws + s0 * NR;
          for (int64_t rb = rb0; rb < rb1; ++rb) {
            // The next call's activations: the next block's, else the next lane's, the next
            // slice's, the next chunk's, or the next panel's first call's.
            const float* xp_next = rb + 1 < rb1       ? xp + ((rb + 1) * 16 + j) * xs + s0 * MR
                                   : j + 1 < 16       ? xp + (rb0 * 16 + j + 1) * xs + s0 * MR
                                   : s0 + len < steps ? xp + rb0 * 16 * xs + (s0 + len) * MR
                                   : rb1 < blocks     ? xp + rb1 * 16 * xs
                                                      : xp;
            LaneMicroKernel<CV, MR, NRV>(xp + (rb * 16 + j) * xs + s0 * MR, wj, len,
                                         acc + j * as + (rb - rb0) * MR * NR, s0 == 0, xp_next);
          }
        }
      }
      // Steps 2 and 3 per row of the chunk: the tree over the 16 lanes, across the panel's
      // columns, then the K % 16 tail (straight into y when there is none and the panel is whole).
      for (int64_t r = rb0 * MR; r < std::min(rows, rb1 * MR); ++r) {
        const int64_t ra = r - rb0 * MR;
        float tree[NR];
        float* out = nc == NR && k16 == k ? y + r * ldy + c0 : tree;
        for (int v = 0; v < NRV; ++v) {
          const int64_t off = v * CV::kWidth;
          CV l[16];
          for (int j = 0; j < 16; ++j) l[j] = CV::Load(acc + j * as + ra * NR + off);
          for (int s = 8; s >= 1; s >>= 1) {
            for (int i = 0; i < s; ++i) l[i] = CV::Add(l[i], l[i + s]);
          }
          CV::Store(out + off, l[0]);
        }
        if (out != tree) continue;
        for (int64_t c = 0; c < nc; ++c) {
          y[r * ldy + c0 + c] = Finish<WD>(tree[c], x + r * k, w + (c0 + c) * ldw, k16, k);
        }
      }
    }
  }
}

// The lane path of weight form w_form with MR x (NRV vectors) micro-kernels, for calls of at
// least min_rows rows.
template <class CV, int MR, int NRV>
LaneKernel LaneKernelFor(WForm w_form, int64_t min_rows) {
  LaneKernel kernel{MR, min_rows, CV::template PackRows<MR>, nullptr};
  switch (w_form) {
    case WForm::kF32:
      kernel.tile = LaneTile<CV, WForm::kF32, MR, NRV>;
      break;
    case WForm::kBF16:
      kernel.tile = LaneTile<CV, WForm::kBF16, MR, NRV>;
      break;
    case WForm::kF16:
      kernel.tile = LaneTile<CV, WForm::kF16, MR, NRV>;
      break;
    case WForm::kBF16Pairs:
      kernel.tile = LaneTile<CV, WForm::kBF16Pairs, MR, NRV>;
      break;
    case WForm::kQ8_0:
      kernel.tile = LaneTile<CV, WForm::kQ8_0, MR, NRV>;
      break;
  }
  return kernel;
}

}  // namespace MOEBATCH_INVARIANT_ISA
}  // namespace invariant_linear_internal
}  // namespace moebatch
