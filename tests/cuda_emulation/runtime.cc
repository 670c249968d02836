// The CUDA emulator's runtime: the part of the CUDA runtime API that cuda/ and the GPU tests call,
// and the kernel-side functions of cuda_emulation.h. See cuda_emulation.h for what it is for and
// what it checks.
//
// Devices: one, sm_90 unless MOEBATCH_CUDA_EMULATION_SM says otherwise (75 emulates a T4's f16
// path), with MOEBATCH_CUDA_EMULATION_MEMORY_GIB of memory (default 16).
// Memory: device and page-locked allocations are host mappings the runtime keeps the extent of, so
// copies are checked against their direction and bounds. Streams: one thread each, in order.
// Kernels: kernels.cc.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda_emulation/runtime_internal.h"

// The runtime's opaque handles, defined here.
struct CUstream_st {
  bool blocking = true;  // created without cudaStreamNonBlocking: ordered with the default stream
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool running = false;
  bool stop = false;
  std::thread worker;
};

namespace moebatch::cuda_emulation {
namespace {

// An event's records, numbered 1, 2, ... as issued; each completes when its stream reaches it
// (records on different streams may complete out of order).
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;          // records issued
  uint64_t done_through = 0;      // records 1..done_through completed
  std::set<uint64_t> done_after;  // completed records beyond done_through
  uint64_t when_record = 0;       // the latest completed record, and when
  std::chrono::steady_clock::time_point when;

  bool Done(uint64_t record) const {  // record 0: never recorded, complete
    return record <= done_through || done_after.count(record) != 0;
  }
  void Complete(uint64_t record) {
    done_after.insert(record);
    while (done_after.count(done_through + 1) != 0) done_after.erase(++done_through);
    if (record >= when_record) {
      when_record = record;
      when = std::chrono::steady_clock::now();
    }
  }
};

}  // namespace
}  // namespace moebatch::cuda_emulation

struct CUevent_st {
  unsigned flags = 0;
  std::shared_ptr<moebatch::cuda_emulation::EventState> state =
      std::make_shared<moebatch::cuda_emulation::EventState>();
};

namespace moebatch::cuda_emulation {
namespace {

// --- Settings and errors -------------------------------------------------------------------------

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

int EmulatedSm() { return EnvInt("MOEBATCH_CUDA_EMULATION_SM", 90); }

size_t EmulatedMemoryBytes() {
  return static_cast<size_t>(EnvInt("MOEBATCH_CUDA_EMULATION_MEMORY_GIB", 16)) << 30;
}

thread_local cudaError_t last_error = cudaSuccess;
// A kernel that deadlocked or a copy that faulted: like a GPU's sticky error, every later
// synchronisation reports it.
std::atomic<cudaError_t> sticky_error{cudaSuccess};

cudaError_t Fail(cudaError_t err) {
  last_error = err;
  return err;
}

cudaError_t Sticky() {
  const cudaError_t err = sticky_error.load();
  if (err != cudaSuccess) last_error = err;
  return err;
}

// --- Memory --------------------------------------------------------------------------------------

struct Allocation {
  size_t bytes;
  size_t mapped;
  bool device;
};

std::mutex memory_mu;
std::map<uintptr_t, Allocation>& Allocations() {
  static auto* map = new std::map<uintptr_t, Allocation>();
  return *map;
}
size_t device_bytes_in_use = 0;

void* Map(size_t bytes, size_t* mapped) {
  *mapped = std::max<size_t>((bytes + 4095) / 4096 * 4096, 4096);
  void* p = mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// --- Streams -------------------------------------------------------------------------------------

std::mutex streams_mu;
std::set<CUstream_st*>& Streams() {
  static auto* set = new std::set<CUstream_st*>();
  return *set;
}

// The legacy default stream (nullptr, cudaStreamLegacy; cudaStreamPerThread is treated as it):
// a stream of its own, not in Streams(), created on first use and never destroyed.
bool IsDefaultStream(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

void Worker(CUstream_st* s);

CUstream_st* Legacy() {
  static CUstream_st* legacy = [] {
    auto* s = new CUstream_st();
    s->worker = std::thread(Worker, s);
    s->worker.detach();
    return s;
  }();
  return legacy;
}

void Worker(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [s] { return s->stop || !s->queue.empty(); });
    if (s->queue.empty()) return;
    std::function<void()> work = std::move(s->queue.front());
    s->queue.pop_front();
    s->running = true;
    lock.unlock();
    work();
    lock.lock();
    s->running = false;
    s->cv.notify_all();
  }
}

void Drain(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [s] { return s->queue.empty() && !s->running; });
}

// The legacy default stream's rule, half one: its work starts after all earlier work of the
// blocking streams (the host waits for that work before queueing).
void DrainBlockingStreams() {
  std::vector<CUstream_st*> blocking;
  {
    std::lock_guard<std::mutex> lock(streams_mu);
    for (CUstream_st* s : Streams()) {
      if (s->blocking) blocking.push_back(s);
    }
  }
  for (CUstream_st* s : blocking) Drain(s);
}

}  // namespace

// --- runtime_internal.h --------------------------------------------------------------------------

bool KnownStream(cudaStream_t s) {
  if (IsDefaultStream(s)) return true;
  std::lock_guard<std::mutex> lock(streams_mu);
  return Streams().count(s) != 0;
}

void SetLastError(cudaError_t err) { Fail(err); }
bool Faulted() { return sticky_error.load() != cudaSuccess; }
void Fault() { sticky_error = cudaErrorLaunchFailure; }

void Report(const std::string& message) {
  std::fprintf(stderr, "cuda emulation: %s\n", message.c_str());
  std::fflush(stderr);
}

Where Locate(const void* p, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  std::lock_guard<std::mutex> lock(memory_mu);
  const auto& map = Allocations();
  auto it = map.upper_bound(begin);
  // The allocation starting at or before `begin`, if any, and the next one (which must not begin
  // inside the range).
  if (it != map.begin()) {
    auto prev = std::prev(it);
    const uintptr_t a_begin = prev->first, a_end = a_begin + prev->second.bytes;
    if (begin < a_end) {
      if (end > a_end) return Where::kStraddles;
      return prev->second.device ? Where::kDevice : Where::kPinned;
    }
    // Between the bytes asked for and the mapping's end is still not the allocation.
    if (begin < a_begin + prev->second.mapped) return Where::kStraddles;
  }
  if (it != map.end() && it->first < end) return Where::kStraddles;
  return Where::kPageable;
}

void RunInStream(cudaStream_t stream, std::function<void()> work) {
  CUstream_st* s = stream;
  if (IsDefaultStream(stream)) {
    DrainBlockingStreams();
    s = Legacy();
  } else if (s->blocking) {
    Drain(Legacy());  // half two: a blocking stream's work starts after the default stream's
  }
  std::lock_guard<std::mutex> lock(s->mu);
  s->queue.push_back(std::move(work));
  s->cv.notify_all();
}

void SynchronizeAll() {
  std::vector<CUstream_st*> all;
  {
    std::lock_guard<std::mutex> lock(streams_mu);
    all.assign(Streams().begin(), Streams().end());
  }
  all.push_back(Legacy());
  for (CUstream_st* s : all) Drain(s);
}

void SynchronizeDefault() {
  DrainBlockingStreams();
  Drain(Legacy());
}

}  // namespace moebatch::cuda_emulation

// --- The CUDA runtime API ------------------------------------------------------------------------

using moebatch::cuda_emulation::Where;
namespace emu = moebatch::cuda_emulation;

namespace {

thread_local int current_device = 0;

const char* WhereName(Where w) {
  switch (w) {
    case Where::kPageable:
      return "pageable host memory";
    case Where::kPinned:
      return "page-locked host memory";
    case Where::kDevice:
      return "device memory";
    case Where::kStraddles:
      break;
  }
  return "a range that crosses an allocation's end";
}

// Checks a copy's direction against where its ends lie. Answers cudaSuccess or the error.
cudaError_t CheckCopy(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                      Where* dst_where, Where* src_where) {
  *dst_where = emu::Locate(dst, count);
  *src_where = emu::Locate(src, count);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) {
    emu::Report("cudaMemcpy with a null pointer");
    return emu::Fail(cudaErrorInvalidValue);
  }
  const bool dst_device = *dst_where == Where::kDevice, src_device = *src_where == Where::kDevice;
  bool ok = *dst_where != Where::kStraddles && *src_where != Where::kStraddles;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = ok && dst_device && !src_device;
      break;
    case cudaMemcpyDeviceToHost:
      ok = ok && !dst_device && src_device;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = ok && dst_device && src_device;
      break;
    case cudaMemcpyHostToHost:
      ok = ok && !dst_device && !src_device;
      break;
    case cudaMemcpyDefault:
      break;
    default:
      ok = false;
  }
  if (!ok) {
    emu::Report(std::string("cudaMemcpy kind ") + std::to_string(static_cast<int>(kind)) + " of " +
                std::to_string(count) + " bytes from " + WhereName(*src_where) + " to " +
                WhereName(*dst_where));
    return emu::Fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t Allocate(void** ptr, size_t size, bool device) {
  if (ptr == nullptr) return emu::Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(emu::memory_mu);
    if (device && emu::device_bytes_in_use + size > emu::EmulatedMemoryBytes()) {
      return emu::Fail(cudaErrorMemoryAllocation);
    }
  }
  size_t mapped = 0;
  void* p = emu::Map(size, &mapped);
  if (p == nullptr) return emu::Fail(cudaErrorMemoryAllocation);
  if (device) std::memset(p, 0xff, size);  // NaN wherever nothing is written
  std::lock_guard<std::mutex> lock(emu::memory_mu);
  emu::Allocations()[reinterpret_cast<uintptr_t>(p)] = emu::Allocation{size, mapped, device};
  if (device) emu::device_bytes_in_use += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t Release(void* ptr, bool device) {
  if (ptr == nullptr) return cudaSuccess;
  emu::SynchronizeAll();  // cudaFree synchronises the device
  std::lock_guard<std::mutex> lock(emu::memory_mu);
  auto& map = emu::Allocations();
  auto it = map.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == map.end() || it->second.device != device) {
    emu::Report(std::string(device ? "cudaFree" : "cudaFreeHost") +
                " of a pointer it did not allocate");
    return emu::Fail(cudaErrorInvalidValue);
  }
  munmap(ptr, it->second.mapped);
  if (device) emu::device_bytes_in_use -= it->second.bytes;
  map.erase(it);
  return cudaSuccess;
}

bool ValidStream(cudaStream_t s) { return emu::KnownStream(s); }

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return emu::Fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return emu::Fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return emu::Fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDeviceFlags(unsigned int) { return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return emu::Fail(cudaErrorInvalidValue);
  if (device != 0) return emu::Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  const int sm = emu::EmulatedSm();
  std::snprintf(prop->name, sizeof(prop->name), "moebatch CUDA emulator");
  prop->major = sm / 10;
  prop->minor = sm % 10;
  prop->totalGlobalMem = emu::EmulatedMemoryBytes();
  prop->sharedMemPerBlock = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = INT_MAX;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return emu::Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(emu::memory_mu);
  *total = emu::EmulatedMemoryBytes();
  *free = *total - emu::device_bytes_in_use;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  emu::SynchronizeAll();
  return emu::Sticky();
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t sticky = emu::sticky_error.load();
  if (sticky != cudaSuccess) return sticky;
  const cudaError_t err = emu::last_error;
  emu::last_error = cudaSuccess;
  return err;
}

cudaError_t cudaPeekAtLastError(void) {
  const cudaError_t sticky = emu::sticky_error.load();
  return sticky != cudaSuccess ? sticky : emu::last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInsufficientDriver:
      return "cudaErrorInsufficientDriver";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (emulated kernel failed: see the 'cuda emulation:' line)";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    default:
      return "unknown error";
  }
}

cudaError_t cudaMalloc(void** devPtr, size_t size) { return Allocate(devPtr, size, true); }
cudaError_t cudaFree(void* devPtr) { return Release(devPtr, true); }
cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int) {
  return Allocate(pHost, size, false);
}
cudaError_t cudaMallocHost(void** ptr, size_t size) { return Allocate(ptr, size, false); }
cudaError_t cudaFreeHost(void* ptr) { return Release(ptr, false); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  Where dst_where, src_where;
  if (cudaError_t err = CheckCopy(dst, src, count, kind, &dst_where, &src_where);
      err != cudaSuccess) {
    return err;
  }
  if (count == 0) return emu::Sticky();
  // The runtime's rules for cudaMemcpy: from pageable memory to the device, the call returns
  // once the source is staged, the device written later in the default stream's order; device to
  // device, no host synchronisation; otherwise done when the call returns.
  if (dst_where == Where::kDevice && src_where == Where::kPageable) {
    auto staged = std::make_shared<std::vector<std::byte>>(
        static_cast<const std::byte*>(src), static_cast<const std::byte*>(src) + count);
    emu::RunInStream(nullptr, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return emu::Sticky();
  }
  emu::RunInStream(nullptr, [dst, src, count] { std::memmove(dst, src, count); });
  if (!(dst_where == Where::kDevice && src_where == Where::kDevice)) emu::SynchronizeDefault();
  return emu::Sticky();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!ValidStream(stream)) return emu::Fail(cudaErrorInvalidResourceHandle);
  Where dst_where, src_where;
  if (cudaError_t err = CheckCopy(dst, src, count, kind, &dst_where, &src_where);
      err != cudaSuccess) {
    return err;
  }
  if (count == 0) return cudaSuccess;
  // Pageable host memory, as the CUDA runtime documents it: the stream's earlier work first; to
  // the device, the source is staged before the call returns and the device written later, in
  // stream order; to the host, the call returns when the copy is done.
  if (dst_where == Where::kPageable || src_where == Where::kPageable) {
    if (emu::IsDefaultStream(stream)) {
      emu::SynchronizeDefault();
    } else {
      emu::Drain(stream);
    }
    if (dst_where == Where::kDevice) {
      auto staged = std::make_shared<std::vector<std::byte>>(
          static_cast<const std::byte*>(src), static_cast<const std::byte*>(src) + count);
      emu::RunInStream(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
      return cudaSuccess;
    }
    std::memmove(dst, src, count);
    return emu::Sticky();
  }
  emu::RunInStream(stream, [dst, src, count] { std::memmove(dst, src, count); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (pStream == nullptr) return emu::Fail(cudaErrorInvalidValue);
  auto* s = new CUstream_st();
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  s->worker = std::thread(emu::Worker, s);
  {
    std::lock_guard<std::mutex> lock(emu::streams_mu);
    emu::Streams().insert(s);
  }
  *pStream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (emu::IsDefaultStream(stream) || !ValidStream(stream)) {
    return emu::Fail(cudaErrorInvalidResourceHandle);
  }
  {
    std::lock_guard<std::mutex> lock(emu::streams_mu);
    emu::Streams().erase(stream);
  }
  emu::Drain(stream);
  {
    std::lock_guard<std::mutex> lock(stream->mu);
    stream->stop = true;
    stream->cv.notify_all();
  }
  stream->worker.join();
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!ValidStream(stream)) return emu::Fail(cudaErrorInvalidResourceHandle);
  if (emu::IsDefaultStream(stream)) stream = emu::Legacy();
  std::lock_guard<std::mutex> lock(stream->mu);
  return stream->queue.empty() && !stream->running ? emu::Sticky() : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!ValidStream(stream)) return emu::Fail(cudaErrorInvalidResourceHandle);
  if (emu::IsDefaultStream(stream)) {
    emu::SynchronizeDefault();
  } else {
    emu::Drain(stream);
  }
  return emu::Sticky();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return emu::Fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st();
  e->flags = flags;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return emu::Fail(cudaErrorInvalidResourceHandle);
  delete event;  // records still in flight hold the state
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr || !ValidStream(stream)) return emu::Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<emu::EventState> state = event->state;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    seq = ++state->recorded;
  }
  emu::RunInStream(stream, [state, seq] {
    std::lock_guard<std::mutex> lock(state->mu);
    state->Complete(seq);
    state->cv.notify_all();
  });
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return emu::Fail(cudaErrorInvalidResourceHandle);
  emu::EventState& state = *event->state;
  std::unique_lock<std::mutex> lock(state.mu);
  const uint64_t target = state.recorded;  // an event never recorded is complete
  state.cv.wait(lock, [&] { return state.Done(target); });
  return emu::Sticky();
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return emu::Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(event->state->mu);
  return event->state->Done(event->state->recorded) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == nullptr || !ValidStream(stream)) return emu::Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<emu::EventState> state = event->state;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    target = state->recorded;  // the event's latest record at the time of the call
  }
  emu::RunInStream(stream, [state, target] {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->Done(target); });
  });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return emu::Fail(cudaErrorInvalidValue);
  if (start == nullptr || end == nullptr || (start->flags & cudaEventDisableTiming) ||
      (end->flags & cudaEventDisableTiming)) {
    return emu::Fail(cudaErrorInvalidResourceHandle);
  }
  std::chrono::steady_clock::time_point a, b;
  for (auto [e, t] : {std::pair{start, &a}, std::pair{end, &b}}) {
    std::lock_guard<std::mutex> lock(e->state->mu);
    if (e->state->recorded == 0) return emu::Fail(cudaErrorInvalidResourceHandle);
    if (!e->state->Done(e->state->recorded)) return emu::Fail(cudaErrorNotReady);
    *t = e->state->when;
  }
  *ms = std::chrono::duration<float, std::milli>(b - a).count();
  return cudaSuccess;
}

}  // extern "C"
