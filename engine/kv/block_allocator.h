// The KV block allocator of the paged KV cache (kv_cache.h): which of the cache's num_blocks block
// ids are free. A sequence's block table lists the ids it holds, in position order; the scheduler
// (engine/scheduler.h) allocates a block when a sequence's last one is full and frees its table
// when it finishes or is preempted (MoE-Lens §6.2).
//
// Sharing: a block may sit in several block tables (the n choices of one request share their
// prompt's blocks, vLLM's fork). Each block counts its holders: Allocate gives a block one holder,
// Share adds one, Free drops one and returns the block to the free list with the last.
//
// Threading: used by one thread (the scheduler's); not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace moebatch {

// A block table entry that holds no block: one behind a sliding window, freed (a table kept to a
// window, engine/kv/kv_cache.h's layer groups; engine/scheduler.h frees them).
inline constexpr int32_t kNoBlock = -1;

// A LIFO free list of block ids [0, num_blocks), with a holder count per block.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);
  // A free block with one holder; nullopt when no block is free.
  std::optional<int32_t> Allocate();
  // One more holder of an allocated block (another block table lists it).
  void Share(int32_t block);
  // Drops one holder; the last one returns the block to the free list. Freeing a free block or an
  // id out of range is a programming error (checked in debug builds).
  void Free(int32_t block);
  // Frees every block of the table (kNoBlock entries hold none) and clears it.
  void FreeAll(std::vector<int32_t>* block_table);
  // Holders of `block` (0 when free).
  int32_t holders(int32_t block) const { return holders_[block]; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_blocks() const { return num_blocks_; }

 private:
  int64_t num_blocks_;
  std::vector<int32_t> free_;
  std::vector<int32_t> holders_;  // [num_blocks]
};

// Blocks needed to hold `tokens` token slots.
inline int64_t BlocksForTokens(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

}  // namespace moebatch
