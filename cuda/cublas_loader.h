// cuBLAS for the cuda backend, loaded when the backend first creates a device rather than linked
// into every program: libcublas pulls in libcublasLt, whose file pages and .bss (62 MB + 84 MB
// resident in a CPU-only run of moebatch-run, docs/performance.md) a program that never runs the
// cuda backend would otherwise carry.
//
// Cublas() returns the entry points the backend calls, resolved once per process (thread-safe:
// a function-local static): from the program itself where cuBLAS is linked in
// (MOEBATCH_CUBLAS_LINKED, the CUDA emulator's stand-in), else from dlopen of libcublas.so.N (N =
// the toolkit's CUBLAS_VER_MAJOR), then of the same file in the toolkit's library directory the
// build found (MOEBATCH_CUDA_LIBRARY_DIR). Unavailable, naming the library and dlerror()'s reason
// or the missing symbol, when neither loads; the same status on every later call.
#pragma once

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace moebatch {
namespace gpu {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  decltype(&cublasSetMathMode) set_math_mode;
  // cublasGemmEx as the library exports it (C++ callers also see an inline overload taking the
  // compute type as a cudaDataType).
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm_ex;
};

absl::StatusOr<const CublasApi*> Cublas();

}  // namespace gpu
}  // namespace moebatch
