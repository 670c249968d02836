// The CUDA emulator's cuBLAS: the handle functions and cublasGemmEx, which is all cuda/ calls.
// cublasGemmEx follows cuBLAS's documented contract (cuBLAS library guide, "cublasGemmEx"):
// column-major C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C, op(X) = X or Xᵀ; A stored lda x
// (transa == N ? k : m), B ldb x (transb == N ? n : k), C ldc x n; lda >= max(1, transa == N ? m :
// k), ldb >= max(1, transb == N ? k : n), ldc >= max(1, m), else CUBLAS_STATUS_INVALID_VALUE; with
// beta == 0, C is not read. Scale and accumulation in f32 (CUBLAS_COMPUTE_32F with f32, f16 or
// bf16 inputs); output rounded to nearest. On top of cuBLAS's own checks, every matrix must lie
// inside one device allocation (a GPU would fault: here the call fails with
// CUBLAS_STATUS_EXECUTION_FAILED and a "cuda emulation:" line saying which).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/cuda_emulation/runtime_internal.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
};

namespace {

namespace emu = moebatch::cuda_emulation;

size_t ElementBytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 0;
  }
}

float Load(const void* base, int64_t index, cudaDataType t) {
  switch (t) {
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[index]);
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

void Store(void* base, int64_t index, cudaDataType t, float v) {
  switch (t) {
    case CUDA_R_16F:
      static_cast<__half*>(base)[index] = __float2half_rn(v);
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float*>(base)[index] = v;
  }
}

// The bytes a column-major rows x cols matrix with leading dimension ld spans (rows, cols > 0).
size_t MatrixBytes(int64_t rows, int64_t cols, int64_t ld, cudaDataType t) {
  return static_cast<size_t>((cols - 1) * ld + rows) * ElementBytes(t);
}

// Whether a column-major rows x cols matrix with leading dimension ld lies in device memory.
bool InDeviceMemory(const char* what, const void* p, int64_t rows, int64_t cols, int64_t ld,
                    cudaDataType t) {
  if (rows == 0 || cols == 0) return true;
  const size_t bytes = MatrixBytes(rows, cols, ld, t);
  if (p != nullptr && emu::Locate(p, bytes) == emu::Where::kDevice) return true;
  emu::Report(std::string("cublasGemmEx: matrix ") + what + " (" + std::to_string(rows) + " x " +
              std::to_string(cols) + ", ld " + std::to_string(ld) + ", " + std::to_string(bytes) +
              " bytes) is not inside one device allocation");
  return false;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  emu::SynchronizeAll();  // cublasDestroy synchronises the device
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  // cuBLAS: the workspace is device memory aligned to 256 bytes.
  if (bytes > 0 && (reinterpret_cast<uintptr_t>(workspace) % 256 != 0 ||
                    emu::Locate(workspace, bytes) != emu::Where::kDevice)) {
    emu::Report("cublasSetWorkspace: the workspace is not 256-byte aligned device memory");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto valid_op = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  const bool a_n = transa == CUBLAS_OP_N, b_n = transb == CUBLAS_OP_N;
  if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 ||
      lda < std::max(1, a_n ? m : k) || ldb < std::max(1, b_n ? k : n) || ldc < std::max(1, m) ||
      alpha == nullptr || beta == nullptr) {
    emu::Report("cublasGemmEx: invalid value (m " + std::to_string(m) + ", n " + std::to_string(n) +
                ", k " + std::to_string(k) + ", lda " + std::to_string(lda) + ", ldb " +
                std::to_string(ldb) + ", ldc " + std::to_string(ldc) + ")");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // CUBLAS_COMPUTE_32F's type combinations among f32/f16/bf16: A and B alike, C the same or f32.
  const bool types_ok =
      (computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC) &&
      Atype == Btype && ElementBytes(Atype) != 0 && (Ctype == Atype || Ctype == CUDA_R_32F);
  if (!types_ok) {
    emu::Report("cublasGemmEx: type combination not supported by the emulator (or cuBLAS)");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if (!InDeviceMemory("A", A, a_n ? m : k, a_n ? k : m, lda, Atype) ||
      !InDeviceMemory("B", B, b_n ? k : n, b_n ? n : k, ldb, Btype) ||
      !InDeviceMemory("C", C, m, n, ldc, Ctype)) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  // cuBLAS leaves C overlapping A or B undefined (it may write C before it has read them all);
  // the emulator reads both first, so it refuses the overlap instead of hiding it.
  auto extent = [](const void* p, int64_t rows, int64_t cols, int64_t ld, cudaDataType t) {
    const auto begin = reinterpret_cast<uintptr_t>(p);
    return std::pair{begin, begin + MatrixBytes(rows, cols, ld, t)};
  };
  const auto c_range = extent(C, m, n, ldc, Ctype);
  for (const auto& [name, range] :
       {std::pair{"A", extent(A, a_n ? m : k, a_n ? k : m, lda, Atype)},
        std::pair{"B", extent(B, b_n ? k : n, b_n ? n : k, ldb, Btype)}}) {
    if (k > 0 && range.first < c_range.second && c_range.first < range.second) {
      emu::Report(std::string("cublasGemmEx: C overlaps ") + name + " (undefined in cuBLAS)");
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  }
  const float a_scale = *static_cast<const float*>(alpha);
  const float b_scale = *static_cast<const float*>(beta);
  emu::RunInStream(handle->stream, [=] {
    // op(A) rows and op(B) columns in f32, then one dot product per element of C.
    std::vector<float> a_rows(static_cast<size_t>(m) * k), b_cols(static_cast<size_t>(n) * k);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p < k; ++p) {
        a_rows[i * k + p] = Load(A, a_n ? i + p * int64_t{lda} : p + i * int64_t{lda}, Atype);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        b_cols[j * k + p] = Load(B, b_n ? p + j * int64_t{ldb} : j + p * int64_t{ldb}, Btype);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        const float* a = &a_rows[i * k];
        const float* b = &b_cols[j * k];
        for (int64_t p = 0; p < k; ++p) acc += a[p] * b[p];
        const int64_t c = i + j * int64_t{ldc};
        float v = a_scale * acc;
        if (b_scale != 0.0f) v += b_scale * Load(C, c, Ctype);
        Store(C, c, Ctype, v);
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
