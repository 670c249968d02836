// The CUDA emulator's own tests: that it runs CUDA code as CUDA defines it (barriers, warp
// exchanges, dynamic shared memory, stream and event order, copy rules, cuBLAS's column-major
// GEMM) and that it reports what a GPU would fault on (divergent __syncthreads, copies in the
// wrong direction or past an allocation, a GEMM outside device memory). Built only for the
// emulator (translate_cu.py, like cuda/'s .cu files); Catch2 main: tests/support/catch_main.cc.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

namespace {

// Each thread adds itself to a shared sum through a shared array and a barrier, then sums its
// warp with a butterfly of __shfl_xor_sync: out[i] = (block sum, warp sum).
__global__ void SumsKernel(int2* out) {
  __shared__ int values[256];
  const int t = threadIdx.x;
  values[t] = t + 1;
  __syncthreads();
  int block = 0;
  for (int i = 0; i < static_cast<int>(blockDim.x); ++i) block += values[i];
  int warp = t + 1;
  for (int offset = 16; offset > 0; offset >>= 1)
    warp += __shfl_xor_sync(0xffffffffu, warp, offset);
  out[blockIdx.x * blockDim.x + t] = int2{block, warp};
}

// Lanes with the same key (t % 3) find each other.
__global__ void MatchKernel(unsigned* out) {
  out[threadIdx.x] = __match_any_sync(0xffffffffu, static_cast<int>(threadIdx.x % 3));
}

// The launch's dynamic shared memory, reversed through it.
__global__ void ReverseKernel(const float* in, float* out, int n) {
  extern __shared__ float staged[];
  const int t = threadIdx.x;
  if (t < n) staged[t] = in[t];
  __syncthreads();
  if (t < n) out[t] = staged[n - 1 - t];
}

// __syncthreads reached by only half the block: undefined in CUDA, reported by the emulator.
__global__ void DivergentBarrierKernel(int* out) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Waits until the host opens `gate`, then fills `out`: work that is still running, for as long as
// the stream-order test needs (a host atomic: the emulator's device memory is host memory).
__global__ void GatedFillKernel(const std::atomic<bool>* gate, int* out, int n, int value) {
  while (!gate->load()) std::this_thread::yield();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
}

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return static_cast<T*>(p);
}

TEST_CASE("emulator: barriers, warp shuffles and dynamic shared memory", "[cuda_emulation]") {
  const int blocks = 2, threads = 256;
  int2* sums = DeviceAlloc<int2>(blocks * threads);
  SumsKernel<<<blocks, threads>>>(sums);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  std::vector<int2> host(blocks * threads);
  REQUIRE(cudaMemcpy(host.data(), sums, host.size() * sizeof(int2), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  for (int i = 0; i < blocks * threads; ++i) {
    const int t = i % threads, first = t / 32 * 32 + 1;
    REQUIRE(host[i].x == threads * (threads + 1) / 2);
    REQUIRE(host[i].y == 32 * first + 31 * 32 / 2);
  }

  unsigned* match = DeviceAlloc<unsigned>(32);
  MatchKernel<<<1, 32>>>(match);
  std::vector<unsigned> masks(32);
  REQUIRE(cudaMemcpy(masks.data(), match, 32 * sizeof(unsigned), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  for (int lane = 0; lane < 32; ++lane) {
    unsigned want = 0;
    for (int l = 0; l < 32; ++l) want |= (l % 3 == lane % 3 ? 1u : 0u) << l;
    REQUIRE(masks[lane] == want);
  }

  const int n = 100;
  std::vector<float> in(n);
  std::iota(in.begin(), in.end(), 0.0f);
  float* in_d = DeviceAlloc<float>(n);
  float* out_d = DeviceAlloc<float>(n);
  REQUIRE(cudaMemcpy(in_d, in.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  ReverseKernel<<<1, 128, n * sizeof(float)>>>(in_d, out_d, n);
  std::vector<float> out(n);
  REQUIRE(cudaMemcpy(out.data(), out_d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int i = 0; i < n; ++i) REQUIRE(out[i] == in[n - 1 - i]);
  for (void* p : {static_cast<void*>(sums), static_cast<void*>(match), static_cast<void*>(in_d),
                  static_cast<void*>(out_d)}) {
    REQUIRE(cudaFree(p) == cudaSuccess);
  }
}

TEST_CASE("emulator: launch configurations CUDA refuses are refused", "[cuda_emulation]") {
  int* out = DeviceAlloc<int>(1);
  SumsKernel<<<1, 2048>>>(reinterpret_cast<int2*>(out));
  REQUIRE(cudaGetLastError() == cudaErrorInvalidConfiguration);
  REQUIRE(cudaGetLastError() == cudaSuccess);  // not sticky
  ReverseKernel<<<1, 32, 64 * 1024>>>(nullptr, nullptr, 0);
  REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("emulator: copies are checked against their direction and the allocation's end",
          "[cuda_emulation]") {
  float* d = DeviceAlloc<float>(16);
  std::vector<float> host(32, 1.0f);
  REQUIRE(cudaMemcpy(d, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  // The wrong direction, past the end, a host pointer given as the device side.
  REQUIRE(cudaMemcpy(d, host.data(), 16 * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaErrorInvalidValue);
  REQUIRE(cudaMemcpy(d, host.data(), 17 * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaErrorInvalidValue);
  REQUIRE(cudaMemcpy(host.data(), host.data() + 16, 16 * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaErrorInvalidValue);
  // Fresh device memory reads as NaN.
  float* fresh = DeviceAlloc<float>(4);
  std::vector<float> back(4, 0.0f);
  REQUIRE(cudaMemcpy(back.data(), fresh, 4 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (float v : back) REQUIRE(std::isnan(v));
  REQUIRE(cudaFree(d) == cudaSuccess);
  REQUIRE(cudaFree(fresh) == cudaSuccess);
  REQUIRE(cudaFree(host.data()) == cudaErrorInvalidValue);
}

TEST_CASE("emulator: streams run in order, events order streams", "[cuda_emulation]") {
  const int n = 1024;
  int* d = DeviceAlloc<int>(n);
  int* pinned = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), n * sizeof(int), 0) == cudaSuccess);
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t filled;
  REQUIRE(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming) == cudaSuccess);

  // Without the event, stream b's copy overtakes stream a's kernel: it sees the fresh bytes.
  std::atomic<bool> gate{false};
  GatedFillKernel<<<1, 64, 0, a>>>(&gate, d, n, 7);
  REQUIRE(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, b) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  REQUIRE(pinned[0] == -1);
  gate = true;
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);

  // With it, b waits for a.
  gate = false;
  GatedFillKernel<<<1, 64, 0, a>>>(&gate, d, n, 9);
  REQUIRE(cudaEventRecord(filled, a) == cudaSuccess);
  REQUIRE(cudaEventQuery(filled) == cudaErrorNotReady);
  REQUIRE(cudaStreamWaitEvent(b, filled, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, b) == cudaSuccess);
  REQUIRE(cudaStreamQuery(b) == cudaErrorNotReady);
  gate = true;
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  for (int i = 0; i < n; ++i) REQUIRE(pinned[i] == 9);
  REQUIRE(cudaEventQuery(filled) == cudaSuccess);

  // A cudaMemcpy from pageable memory returns once the source is staged; the device is written
  // later, in the legacy default stream's order, which a non-blocking stream does not follow.
  gate = false;
  GatedFillKernel<<<1, 64>>>(&gate, d, n, 5);  // holds the default stream
  const std::vector<int> ones(n, 1);
  REQUIRE(cudaMemcpy(d, ones.data(), n * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, b) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  REQUIRE(pinned[0] == 9);  // neither the kernel's 5 nor the copy's 1 yet
  gate = true;
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, b) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  REQUIRE(pinned[0] == 1);

  REQUIRE(cudaEventDestroy(filled) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
  REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("emulator: cublasGemmEx is column-major C = alpha op(A) op(B) + beta C",
          "[cuda_emulation]") {
  // A [m=2, k=3] stored transposed (op T, lda 3), B [k=3, n=2] (op N, ldb 4: one padding row).
  const std::vector<float> a_t = {1, 2, 3, 4, 5, 6};  // columns of Aᵀ: A = [[1,2,3],[4,5,6]]
  const std::vector<float> b = {1, 0, -1, 99, 2, 1, 0, 99};  // B = [[1,2],[0,1],[-1,0]]
  const std::vector<float> c0 = {10, 20, 30, 40};            // C [2, 2], ldc 2
  float* a_d = DeviceAlloc<float>(a_t.size());
  float* b_d = DeviceAlloc<float>(b.size());
  float* c_d = DeviceAlloc<float>(c0.size());
  REQUIRE(cudaMemcpy(a_d, a_t.data(), a_t.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(b_d, b.data(), b.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(c_d, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  cublasHandle_t handle;
  REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 2.0f, beta = 1.0f;
  REQUIRE(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &alpha, a_d, CUDA_R_32F, 3, b_d,
                       CUDA_R_32F, 4, &beta, c_d, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  std::vector<float> c(4);
  REQUIRE(cudaMemcpy(c.data(), c_d, 16, cudaMemcpyDeviceToHost) == cudaSuccess);
  // A B = [[1-3, 2+2], [4-6, 8+5]] = [[-2, 4], [-2, 13]]; column-major C = 2 AB + C0.
  REQUIRE(c == std::vector<float>{-4 + 10, -4 + 20, 8 + 30, 26 + 40});
  // lda below op(A)'s rows, and a B that runs past its allocation.
  REQUIRE(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &alpha, a_d, CUDA_R_32F, 2, b_d,
                       CUDA_R_32F, 4, &beta, c_d, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &alpha, a_d, CUDA_R_32F, 3, b_d,
                       CUDA_R_32F, 6, &beta, c_d, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED);  // 9 floats of 8
  // C over B: undefined in cuBLAS, refused here.
  REQUIRE(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &alpha, a_d, CUDA_R_32F, 3, b_d,
                       CUDA_R_32F, 4, &beta, b_d + 4, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED);
  REQUIRE(cublasDestroy(handle) == CUBLAS_STATUS_SUCCESS);
  for (float* p : {a_d, b_d, c_d}) REQUIRE(cudaFree(p) == cudaSuccess);
}

// Last: the divergent barrier leaves the emulated device faulted for the rest of the process, as a
// GPU's sticky error would (ctest runs each case in its own process).
TEST_CASE("emulator: __syncthreads in divergent code faults the device", "[cuda_emulation]") {
  int* out = DeviceAlloc<int>(32);
  DivergentBarrierKernel<<<1, 32>>>(out);
  REQUIRE(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  REQUIRE(cudaGetLastError() == cudaErrorLaunchFailure);
}

}  // namespace
