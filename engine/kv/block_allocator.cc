#include "engine/kv/block_allocator.h"

#include <cassert>

namespace moebatch {

BlockAllocator::BlockAllocator(int64_t num_blocks)
    : num_blocks_(num_blocks), holders_(num_blocks, 0) {
  free_.reserve(num_blocks);
  // Highest id at the bottom so that the first allocations are 0, 1, 2, ...
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<int32_t> BlockAllocator::Allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t b = free_.back();
  free_.pop_back();
  holders_[b] = 1;
  return b;
}

void BlockAllocator::Share(int32_t block) {
  assert(block >= 0 && block < num_blocks_);
  assert(holders_[block] > 0 && "sharing a free KV block");
  ++holders_[block];
}

void BlockAllocator::Free(int32_t block) {
  assert(block >= 0 && block < num_blocks_);
  assert(holders_[block] > 0 && "KV block freed twice");
  if (--holders_[block] == 0) free_.push_back(block);
}

void BlockAllocator::FreeAll(std::vector<int32_t>* block_table) {
  // Reverse order keeps the free list's LIFO order close to allocation order.
  for (auto it = block_table->rbegin(); it != block_table->rend(); ++it) {
    if (*it != kNoBlock) Free(*it);
  }
  block_table->clear();
}

}  // namespace moebatch
