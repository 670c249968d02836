// The CUDA emulator's prelude: force-included (-include) before every CUDA source file the
// emulator builds, after translate_cu.py has rewritten the two pieces of syntax C++ lacks
// (kernel<<<...>>>(...) launches and extern __shared__ arrays).
//
// What it is for. No GPU is lent to most of this project's sessions and CI has none, so without
// it the CUDA backend (cuda/) would only ever be compiled. Built against the emulator, the same
// sources and the same GPU tests (tests/test_cuda_*.cc) run on the host: every kernel thread as a
// fiber of its block, every stream as a worker thread, device memory as host memory that the
// runtime knows the extent of, cuBLAS's GEMM as a loop that follows cuBLAS's documented
// column-major contract. That checks what does not depend on the hardware: indexing, launch
// shapes, barriers, warp exchanges, the order of streams and events, copy directions, cuBLAS
// leading dimensions and transposes, and the numbers that come out. It says nothing about speed,
// nor about what only the hardware has (the memory model between blocks, __fmul_rn's exact
// device rounding of transcendental functions, the real driver's errors).
//
// Semantics (tests/cuda_emulation/kernels.cc, runtime.cc):
//  - A block's threads run as fibers on one host thread, switching only at __syncthreads and the
//    warp intrinsics; a barrier that not every live thread reaches is reported as a deadlock.
//  - __shared__ variables are per host thread (static thread_local): blocks run one at a time.
//  - Fresh device memory, and dynamic shared memory in every block, are 0xff bytes (NaN in
//    f32/bf16/f16), so a read of memory nothing wrote shows as NaN, as garbage would on a GPU.
//  - Streams, the legacy default stream included, run their work in order on their own thread;
//    events, cudaStreamWaitEvent and the default stream's ordering follow the CUDA runtime's
//    documented rules; copies from or to pageable host memory are as synchronous as CUDA makes
//    them and no more (to the device: staged at the call, written later in stream order).
// Threading: kernels run on stream threads; everything in this header is for kernel code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace moebatch::cuda_emulation {

// --- Kernel-side state of the running thread (valid inside a kernel only) ------------------------
const uint3& ThreadIdx();
const uint3& BlockIdx();
const dim3& BlockDim();
const dim3& GridDim();
void* DynamicSharedBytes();  // the launch's dynamic shared memory, shmem bytes

template <typename T>
T* DynamicShared() {
  return static_cast<T*>(DynamicSharedBytes());
}

// __syncthreads: every live thread of the block waits here.
void SyncThreads();
// The warp exchanges. `mask` names the lanes taking part; all of them must call (else the
// emulator reports the deadlock). Values travel as 8-byte words.
uint64_t ShuffleXor(unsigned mask, uint64_t bits, int lane_mask, int width);
unsigned MatchAny(unsigned mask, uint64_t bits);

template <typename T>
T ShflXorSync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ShuffleXor(mask, bits, lane_mask, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

template <typename T>
unsigned MatchAnySync(unsigned mask, T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return MatchAny(mask, bits);
}

template <typename T>
T AtomicAdd(T* address, T value) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
  } else {
    T old = *address;
    T desired;
    do {
      desired = old + value;
    } while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    return old;
  }
}

// IEEE f32 operations in round-to-nearest, never contracted (the host build has no FMA flags).
inline float FAddRn(float a, float b) { return a + b; }
inline float FSubRn(float a, float b) { return a - b; }
inline float FMulRn(float a, float b) { return a * b; }
inline float FDivRn(float a, float b) { return a / b; }

// --- Launches -----------------------------------------------------------------------------------
struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
};

// Checks the configuration (else the launch fails and cudaGetLastError reports it, as CUDA's
// does) and runs `thread_body` for every thread of every block, in stream order.
// `kernel_name` is the launch expression's text (translate_cu.py passes it), for messages.
void Submit(const char* kernel_name, const LaunchConfig& config, std::function<void()> thread_body);

template <typename... Params>
class Launcher {
 public:
  Launcher(void (*kernel)(Params...), const char* name, const LaunchConfig& config)
      : kernel_(kernel), name_(name), config_(config) {}

  // The arguments are converted to the kernel's parameter types and copied now, as CUDA does.
  template <typename... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "kernel argument count");
    auto bound = std::make_shared<std::tuple<std::decay_t<Params>...>>(
        static_cast<std::decay_t<Params>>(std::forward<Args>(args))...);
    void (*kernel)(Params...) = kernel_;
    Submit(name_, config_, [kernel, bound] { std::apply(kernel, *bound); });
  }

 private:
  void (*kernel_)(Params...);
  const char* name_;
  LaunchConfig config_;
};

template <typename... Params>
Launcher<Params...> Launch(void (*kernel)(Params...), const char* name, dim3 grid, dim3 block,
                           size_t shared_bytes = 0, cudaStream_t stream = nullptr) {
  return Launcher<Params...>(kernel, name, LaunchConfig{grid, block, shared_bytes, stream});
}

}  // namespace moebatch::cuda_emulation

// --- CUDA C++'s keywords and built-ins, for host C++ ---------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define threadIdx (::moebatch::cuda_emulation::ThreadIdx())
#define blockIdx (::moebatch::cuda_emulation::BlockIdx())
#define blockDim (::moebatch::cuda_emulation::BlockDim())
#define gridDim (::moebatch::cuda_emulation::GridDim())
#define __syncthreads() ::moebatch::cuda_emulation::SyncThreads()
#define __shfl_xor_sync ::moebatch::cuda_emulation::ShflXorSync
#define __match_any_sync ::moebatch::cuda_emulation::MatchAnySync
#define __popc(x) __builtin_popcount(static_cast<unsigned>(x))
#define atomicAdd ::moebatch::cuda_emulation::AtomicAdd
#define __fadd_rn ::moebatch::cuda_emulation::FAddRn
#define __fsub_rn ::moebatch::cuda_emulation::FSubRn
#define __fmul_rn ::moebatch::cuda_emulation::FMulRn
#define __fdiv_rn ::moebatch::cuda_emulation::FDivRn
// CUDA's device math functions that the host's <cmath> has in std:: only.
using std::isfinite;
using std::isinf;
using std::isnan;
