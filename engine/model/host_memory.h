// Host memory for the engine's large buffers: who provides it (HostAllocator: anonymous pageable
// memory, or page-locked memory from the cuda backend, which async copies to and from the GPU need
// to run at full PCIe speed without a staging copy), and HostBuffer, a growable array over an
// allocator for buffers refilled every pass (the model runner's q/k/v and attention output,
// MoE-Lens §6.4's small transfers between GPU and CPU).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace moebatch {

// Implementations are thread-safe.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // `bytes` (> 0) of memory aligned to at least 4096 bytes; ResourceExhausted when it cannot.
  virtual absl::StatusOr<std::byte*> Allocate(size_t bytes) = 0;
  virtual void Free(std::byte* data, size_t bytes) = 0;
  virtual const char* name() const = 0;  // "pageable", "pinned"
};

// Anonymous private mmap (pages mapped on first touch). Process-wide instance.
HostAllocator& PageableHostAllocator();

// Bytes of host memory the kernel reports available (/proc/meminfo MemAvailable); 0 if unknown.
int64_t AvailableHostMemoryBytes();

// n elements of a trivially copyable T in memory from an allocator. Resize keeps the first
// elements only while the capacity suffices: growing reallocates (capacity x1.25 at least) and
// leaves the contents unspecified, which is what a buffer rewritten every pass needs; its capacity
// never shrinks, so after the largest pass nothing is allocated again. Not thread-safe; not
// copyable.
template <typename T>
class HostBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  explicit HostBuffer(HostAllocator* allocator = nullptr)
      : allocator_(allocator != nullptr ? allocator : &PageableHostAllocator()) {}
  ~HostBuffer() { Release(); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  // The allocator of later allocations; the memory held now is freed.
  void set_allocator(HostAllocator* allocator) {
    Release();
    allocator_ = allocator != nullptr ? allocator : &PageableHostAllocator();
  }
  // ResourceExhausted (the allocator's) when it cannot grow; the buffer is then empty.
  absl::Status Resize(size_t n) {
    if (n > capacity_) {
      const size_t capacity = std::max(n, capacity_ + capacity_ / 4);
      Release();
      auto data = allocator_->Allocate(capacity * sizeof(T));
      if (!data.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat("host buffer of ", capacity * sizeof(T),
                                                         " bytes: ", data.status().message()));
      }
      data_ = reinterpret_cast<T*>(*data);
      capacity_ = capacity;
    }
    size_ = n;
    return absl::OkStatus();
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  const char* allocator_name() const { return allocator_->name(); }

 private:
  void Release() {
    if (data_ != nullptr)
      allocator_->Free(reinterpret_cast<std::byte*>(data_), capacity_ * sizeof(T));
    data_ = nullptr;
    capacity_ = size_ = 0;
  }
  HostAllocator* allocator_;
  T* data_ = nullptr;
  size_t capacity_ = 0, size_ = 0;
};

}  // namespace moebatch
