// Dense layers on the CPU: y = x · Wᵀ, torch.nn.Linear's math (no bias), through oneDNN matmul or,
// batch-invariant, through cpu_attention/gemm/invariant_linear.h.
//
// Weights stay where they are (e.g. in the memory-mapped checkpoint, [out_features, in_features]
// row-major, as PyTorch stores them); oneDNN reads them as a transposed [K, N] operand.
// Compute modes:
//   f32  : activations f32; f32 weights used in place; bf16/f16 weights read in place by the
//          batch-invariant kernels, or, on the oneDNN path, widened to f32 (exact) into a scratch
//          buffer on every call, or kept after the first use while their total stays within the
//          widened-weight budget (0 by default: at the sizes that take oneDNN the conversion is a
//          few percent of the GEMM). This is the reference mode the golden tests use.
//   bf16 : activations rounded to bf16, bf16 weights used in place (AMX / AVX512-BF16 through
//          oneDNN), f32 accumulation and output; non-bf16 weights go through the f32 path.
//   f16  : activations rounded to f16 (nearest even), f16 weights as in f32 mode, f32
//          accumulation: the arithmetic of an f16 GEMM with f32 accumulation (cuBLAS on sm_75, the
//          cuda backend's T4 path), which it is the reference for. Not offered to users (a CPU
//          has no f16 speed to gain); non-f16 weights go through the f32 path.
// Batch-invariant (the default the engine uses, cpu_attention/gemm/invariant_linear.h): every row's
// result is bitwise the same whatever else shares the call; f32 compute reads the weights in place
// with our kernels; bf16 compute with bf16 weights rounds the activations to bf16 first (as
// oneDNN's bf16 mode does) and accumulates bf16·bf16 products, exact in f32, in vdpbf16ps's pair
// order (InvariantLinearBf16): on vdpbf16ps where the CPU has AVX512-BF16 and it is the faster
// path (CpuVdpbf16psPays(): on Zen 4 about twice the f32 kernels' GFLOP/s from 8 rows; on Sapphire
// Rapids VMs slower than them, docs/performance.md), on f32 FMAs with the same bits elsewhere.
// Otherwise (batch_invariant false) each call takes the faster path for its size (PathFor), so no
// setting is slower than the default: decode-sized calls stay on the batch-invariant kernels, which
// stream bf16 weights in place (1.5-3x faster than oneDNN f32 on a widened copy at M <= 32,
// docs/performance.md "The batch-invariant CPU matmul"), and larger ones go to oneDNN matmul
// (its kernel, and so its reduction order, depends on M): from kOneDnnF32MinRows rows in f32
// compute, from kOneDnnBf16MinRows in bf16 compute with bf16 weights where oneDNN has a bf16
// matmul (AVX512-BF16 / AMX); a CPU without one (AVX2-only) keeps bf16 compute on the
// batch-invariant kernels. One oneDNN primitive per (N, K, dtypes) is created on first use and
// reused: M (tokens) is a run-time dimension. Not thread-safe: one Matmul per forward thread; both
// paths parallelise inside each call with OpenMP.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/dtype.h"

namespace moebatch {

class Matmul {
 public:
  // The rows (M) from which a call that is not batch-invariant goes to oneDNN: f32 compute (or
  // weights that are not bf16), and bf16 compute with bf16 weights and a oneDNN bf16 matmul.
  // From docs/performance.md's bench_linear table (Mixtral-8x7B w1, 2 threads): f32, the
  // batch-invariant kernel is faster to M = 32 and even at 128, oneDNN f32 1.4x faster at 512;
  // bf16, AMX is slower at M = 8 and 2.2x faster at 32.
  static constexpr int64_t kOneDnnF32MinRows = 256;
  static constexpr int64_t kOneDnnBf16MinRows = 16;

  enum class Path { kInvariant, kOneDnnF32, kOneDnnBf16 };

  // InvalidArgument for a compute dtype other than f32/bf16/f16. `widened_weight_budget_bytes`:
  // host memory for f32 copies of bf16/f16 weights on the oneDNN f32 path (0: widened per call).
  // Weights are keyed by address: they must stay where they are (a mapped checkpoint does).
  // `batch_invariant`: our fixed-order kernels for every call; false: each call's faster path
  // (see above). A CPU without a oneDNN bf16 matmul is not an error: bf16 stays on our kernels.
  static absl::StatusOr<std::unique_ptr<Matmul>> Create(DType compute_dtype,
                                                        int64_t widened_weight_budget_bytes = 0,
                                                        bool batch_invariant = false);
  ~Matmul();

  // y[M, N] = x[M, K] · w[N, K]ᵀ; x and y f32 row-major, contiguous. M may be 0 (no-op).
  // Internal errors from oneDNN come back as Internal.
  absl::Status Linear(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n,
                      float* y);

  // The path Linear takes for `m` rows of `w_dtype` weights.
  Path PathFor(int64_t m, DType w_dtype) const;
  // The paths in words, for the engine's log: "batch-invariant kernels", "batch-invariant kernels
  // (bf16 weights in the pair order, on vdpbf16ps)", "batch-invariant kernels below 16 rows,
  // oneDNN bf16 (AVX512-BF16 / AMX) from 16", ...
  std::string Describe() const;

  DType compute_dtype() const { return compute_dtype_; }
  bool batch_invariant() const { return batch_invariant_; }
  // Whether oneDNN has a bf16 matmul on this CPU (probed when bf16 compute may use it).
  bool onednn_bf16() const { return onednn_bf16_; }

 private:
  struct Impl;
  explicit Matmul(DType compute_dtype);
  DType compute_dtype_;
  bool batch_invariant_ = false;
  bool onednn_bf16_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch
