// Dense layers on the CPU: y = x · Wᵀ, torch.nn.Linear's math (no bias), through oneDNN matmul or,
// batch-invariant, through cpu_attention/gemm/invariant_linear.h.
//
// Weights stay where they are (e.g. in the memory-mapped checkpoint, [out_features, in_features]
// row-major, as PyTorch stores them); oneDNN reads them as a transposed [K, N] operand.
// Compute modes:
//   f32  : activations f32; f32 weights used in place; bf16/f16 weights widened to f32 (exact):
//          kept after the first use while their total stays within the widened-weight budget
//          (small models), else converted into a scratch buffer on every call. This is the
//          reference mode the golden tests use.
//   bf16 : activations rounded to bf16, bf16 weights used in place (AMX / AVX512-BF16 through
//          oneDNN), f32 accumulation and output; non-bf16 weights go through the f32 path.
//   f16  : activations rounded to f16 (nearest even), f16 weights as in f32 mode, f32
//          accumulation: the arithmetic of an f16 GEMM with f32 accumulation (cuBLAS on sm_75, the
//          cuda backend's T4 path), which it is the reference for. Not offered to users (a CPU
//          has no f16 speed to gain); non-f16 weights go through the f32 path.
// Batch-invariant (the default the engine uses, cpu_attention/gemm/invariant_linear.h): every row's result is
// bitwise the same whatever else shares the call; f32 compute reads the weights in place with our
// kernels instead of oneDNN; bf16 compute with bf16 weights rounds the activations to bf16 first
// (as oneDNN's bf16 mode does) and accumulates bf16·bf16 products, exact in f32, in the same fixed
// order. Otherwise oneDNN matmul, whose kernel (and so reduction order) depends on M; one primitive
// per (N, K, dtypes) is created on first use and reused: M (tokens) is a run-time dimension. Not
// thread-safe: one Matmul per forward thread; both paths parallelise inside each call with OpenMP.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/dtype.h"

namespace moebatch {

class Matmul {
 public:
  // InvalidArgument for a compute dtype other than f32/bf16/f16; FailedPrecondition when oneDNN has
  // no bf16 matmul for this CPU (it needs AVX-512). `widened_weight_budget_bytes`: host memory for
  // f32 copies of bf16/f16 weights (f32 mode). Weights are keyed by address: they must stay where
  // they are (a mapped checkpoint does). `batch_invariant`: our fixed-order kernels instead of
  // oneDNN (see above).
  static absl::StatusOr<std::unique_ptr<Matmul>> Create(DType compute_dtype,
                                                        int64_t widened_weight_budget_bytes = 0,
                                                        bool batch_invariant = false);
  ~Matmul();

  // y[M, N] = x[M, K] · w[N, K]ᵀ; x and y f32 row-major, contiguous. M may be 0 (no-op).
  // Internal errors from oneDNN come back as Internal.
  absl::Status Linear(const float* x, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n,
                      float* y);

  DType compute_dtype() const { return compute_dtype_; }
  bool batch_invariant() const { return batch_invariant_; }

 private:
  struct Impl;
  explicit Matmul(DType compute_dtype);
  DType compute_dtype_;
  bool batch_invariant_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch
