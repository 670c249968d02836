// The CUDA emulator's kernels: a grid's blocks one after another on the launching stream's
// thread, a block's threads as Boost.Context fibers that switch only at __syncthreads and the warp
// intrinsics (cuda_emulation.h's kernel-side functions), and Submit, which checks a launch and
// queues it. See cuda_emulation.h for what this checks and what it cannot.
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <boost/context/fiber.hpp>
#include <climits>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/cuda_emulation/cuda_emulation.h"
#include "tests/cuda_emulation/runtime_internal.h"

namespace moebatch::cuda_emulation {
namespace {

// --- Kernels: a block's threads as fibers --------------------------------------------------------

namespace ctx = boost::context;

constexpr size_t kFiberStackBytes = size_t{256} << 10;
constexpr int kWarpSize = 32;

enum class FiberState { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

// Boost.Context's StackAllocator over a stack the runner keeps from block to block.
struct ReusedStack {
  void* base;
  ctx::stack_context allocate() {
    ctx::stack_context sc;
    sc.size = kFiberStackBytes;
    sc.sp = static_cast<char*>(base) + kFiberStackBytes;
    return sc;
  }
  void deallocate(ctx::stack_context&) noexcept {}
};

struct Fiber {
  ctx::fiber self;       // resumed by the scheduler to run the thread
  ctx::fiber scheduler;  // resumed by the thread to yield
  void* stack = nullptr;
  uint3 thread_idx;
  FiberState state = FiberState::kReady;
  unsigned warp_mask = 0;  // the mask of the warp barrier it waits at
  int exchange = 0;        // warp exchanges done: which of two word buffers the next one uses
};

// The blocks of the running grid, one at a time, on one host thread.
struct BlockRunner {
  std::vector<Fiber> fibers;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  std::vector<std::byte> dynamic_shared;
  const std::function<void()>* body = nullptr;
  Fiber* current = nullptr;
  // Warp exchange words, [buffer][warp][lane]. Two buffers, used in turn, so that one barrier per
  // exchange suffices: a lane writes a buffer again only after two more barriers, and it cannot
  // pass the second before every lane has read the buffer's previous words.
  std::vector<std::array<uint64_t, kWarpSize>> words[2];

  ~BlockRunner() {
    for (Fiber& f : fibers) {
      f.self = ctx::fiber();  // unwinds a thread left suspended by a deadlock
      if (f.stack != nullptr) munmap(f.stack, kFiberStackBytes);
    }
  }
};

thread_local BlockRunner* running_block = nullptr;

BlockRunner& Runner() {
  thread_local BlockRunner runner;
  return runner;
}

void Yield(FiberState state) {
  Fiber* self = running_block->current;
  self->state = state;
  self->scheduler = std::move(self->scheduler).resume();
}

int LinearIndex(const BlockRunner& r) {
  const Fiber& f = *r.current;
  return static_cast<int>(f.thread_idx.x + f.thread_idx.y * r.block_dim.x +
                          f.thread_idx.z * r.block_dim.x * r.block_dim.y);
}

// Runs one block to the end. Answers an empty string, or what went wrong (a deadlock).
std::string RunBlock(BlockRunner& r) {
  const int n = static_cast<int>(r.block_dim.x * r.block_dim.y * r.block_dim.z);
  for (Fiber& f : r.fibers) f.self = ctx::fiber();  // unwinds threads a deadlock left suspended
  if (static_cast<int>(r.fibers.size()) < n) r.fibers.resize(n);
  for (int i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    if (f.stack == nullptr) {
      f.stack = mmap(nullptr, kFiberStackBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
      if (f.stack == MAP_FAILED) {
        f.stack = nullptr;
        return "cannot map a fiber stack";
      }
    }
    f.thread_idx = uint3{static_cast<unsigned>(i) % r.block_dim.x,
                         static_cast<unsigned>(i) / r.block_dim.x % r.block_dim.y,
                         static_cast<unsigned>(i) / (r.block_dim.x * r.block_dim.y)};
    f.state = FiberState::kReady;
    f.exchange = 0;
    f.self = ctx::fiber(std::allocator_arg, ReusedStack{f.stack}, [&f, &r](ctx::fiber&& caller) {
      f.scheduler = std::move(caller);
      (*r.body)();
      f.state = FiberState::kDone;
      return std::move(f.scheduler);
    });
  }
  const int warps = (n + kWarpSize - 1) / kWarpSize;
  for (auto& buffer : r.words) {
    if (static_cast<int>(buffer.size()) < warps) buffer.resize(warps);
  }

  for (;;) {
    for (int i = 0; i < n; ++i) {
      Fiber& f = r.fibers[i];
      if (f.state != FiberState::kReady) continue;
      r.current = &f;
      f.self = std::move(f.self).resume();
    }
    // Every fiber now waits at a barrier or is done. Release the warps whose named lanes have all
    // arrived, else the block if every live thread is at __syncthreads.
    bool released = false, live = false, all_at_block_barrier = true;
    for (int w = 0; w < warps; ++w) {
      const int first = w * kWarpSize, lanes = std::min(kWarpSize, n - first);
      unsigned waiting = 0, mask = 0;
      for (int l = 0; l < lanes; ++l) {
        const Fiber& f = r.fibers[first + l];
        if (f.state == FiberState::kAtWarpBarrier) {
          waiting |= 1u << l;
          mask = f.warp_mask;
        }
      }
      if (waiting == 0) continue;
      if (waiting == mask) {
        for (int l = 0; l < lanes; ++l) {
          if (waiting >> l & 1u) r.fibers[first + l].state = FiberState::kReady;
        }
        released = true;
      } else if ((mask >> lanes) != 0) {
        return "a warp intrinsic's mask names lanes the block does not have (warp " +
               std::to_string(w) + ", mask " + std::to_string(mask) + ")";
      }
    }
    for (int i = 0; i < n; ++i) {
      const FiberState s = r.fibers[i].state;
      if (s == FiberState::kDone) continue;
      live = true;
      if (s != FiberState::kAtBlockBarrier) all_at_block_barrier = false;
    }
    if (!live) return "";
    if (released) continue;
    if (all_at_block_barrier) {
      // CUDA allows __syncthreads in conditional code only where the condition is the same for
      // the whole block: threads that returned while others wait is such a divergence.
      for (int i = 0; i < n; ++i) {
        if (r.fibers[i].state == FiberState::kDone) {
          return "__syncthreads in divergent code: thread " + std::to_string(i) +
                 " returned while others wait at the barrier";
        }
      }
      for (int i = 0; i < n; ++i) {
        if (r.fibers[i].state == FiberState::kAtBlockBarrier) {
          r.fibers[i].state = FiberState::kReady;
        }
      }
      continue;
    }
    int at_block = 0, at_warp = 0, done = 0;
    for (int i = 0; i < n; ++i) {
      const FiberState s = r.fibers[i].state;
      at_block += s == FiberState::kAtBlockBarrier;
      at_warp += s == FiberState::kAtWarpBarrier;
      done += s == FiberState::kDone;
    }
    return "deadlock: " + std::to_string(at_block) + " threads at __syncthreads, " +
           std::to_string(at_warp) + " at a warp intrinsic whose other lanes never come, " +
           std::to_string(done) + " finished";
  }
}

void RunGrid(const char* name, const LaunchConfig& c, const std::function<void()>& body) {
  if (Faulted()) return;  // a faulted context runs nothing more
  BlockRunner& r = Runner();
  r.block_dim = c.block;
  r.grid_dim = c.grid;
  r.body = &body;
  r.dynamic_shared.resize(c.shared_bytes);
  BlockRunner* outer = running_block;
  running_block = &r;
  for (unsigned z = 0; z < c.grid.z; ++z) {
    for (unsigned y = 0; y < c.grid.y; ++y) {
      for (unsigned x = 0; x < c.grid.x; ++x) {
        r.block_idx = uint3{x, y, z};
        // Shared memory starts undefined in every block: NaN bytes, not the last block's values.
        std::fill(r.dynamic_shared.begin(), r.dynamic_shared.end(), std::byte{0xff});
        const std::string failure = RunBlock(r);
        if (!failure.empty()) {
          Report(std::string("kernel ") + name + ", block (" + std::to_string(x) + "," +
                 std::to_string(y) + "," + std::to_string(z) + "): " + failure);
          Fault();
          running_block = outer;
          return;
        }
      }
    }
  }
  running_block = outer;
}

}  // namespace

// --- cuda_emulation.h's kernel-side functions ----------------------------------------------------

const uint3& ThreadIdx() { return running_block->current->thread_idx; }
const uint3& BlockIdx() { return running_block->block_idx; }
const dim3& BlockDim() { return running_block->block_dim; }
const dim3& GridDim() { return running_block->grid_dim; }
void* DynamicSharedBytes() { return running_block->dynamic_shared.data(); }

void SyncThreads() { Yield(FiberState::kAtBlockBarrier); }

namespace {
void WarpBarrier(unsigned mask) {
  running_block->current->warp_mask = mask;
  Yield(FiberState::kAtWarpBarrier);
}
}  // namespace

uint64_t ShuffleXor(unsigned mask, uint64_t bits, int lane_mask, int width) {
  BlockRunner& r = *running_block;
  const int linear = LinearIndex(r), lane = linear % kWarpSize;
  auto& words = r.words[r.current->exchange++ & 1][linear / kWarpSize];
  words[lane] = bits;
  WarpBarrier(mask);
  // CUDA: a source lane in a later width-wide group than the caller's yields the caller's own
  // value (an earlier group's lane is read).
  const int src = lane ^ lane_mask;
  return src / width <= lane / width ? words[src] : bits;
}

unsigned MatchAny(unsigned mask, uint64_t bits) {
  BlockRunner& r = *running_block;
  const int linear = LinearIndex(r), lane = linear % kWarpSize;
  auto& words = r.words[r.current->exchange++ & 1][linear / kWarpSize];
  words[lane] = bits;
  WarpBarrier(mask);
  unsigned same = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    if ((mask >> l & 1u) && words[l] == bits) same |= 1u << l;
  }
  return same;
}

void Submit(const char* kernel_name, const LaunchConfig& c, std::function<void()> thread_body) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  if (threads == 0 || threads > 1024 || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64 ||
      c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || c.grid.x > INT_MAX || c.grid.y > 65535 ||
      c.grid.z > 65535) {
    Report(std::string("kernel ") + kernel_name + ": invalid launch configuration: grid (" +
           std::to_string(c.grid.x) + "," + std::to_string(c.grid.y) + "," +
           std::to_string(c.grid.z) + "), block (" + std::to_string(c.block.x) + "," +
           std::to_string(c.block.y) + "," + std::to_string(c.block.z) + ")");
    SetLastError(cudaErrorInvalidConfiguration);
    return;
  }
  if (c.shared_bytes > 48 * 1024) {
    Report(std::string("kernel ") + kernel_name + ": " + std::to_string(c.shared_bytes) +
           " bytes of dynamic shared memory (48 KiB without an opt-in)");
    SetLastError(cudaErrorInvalidValue);
    return;
  }
  if (!KnownStream(c.stream)) {
    SetLastError(cudaErrorInvalidResourceHandle);
    return;
  }
  auto body = std::make_shared<std::function<void()>>(std::move(thread_body));
  const LaunchConfig config = c;
  RunInStream(c.stream, [kernel_name, config, body] { RunGrid(kernel_name, config, *body); });
}

}  // namespace moebatch::cuda_emulation
