// Forms each pass: which sequences run and how many of their tokens (MoE-Lens §6.2), within the
// token budget (on the cuda backend lowered to the pipeline profiler's n_real, §6.3).
//
// Policy, every pass:
//   1. Decode first: every running sequence (oldest first) gets its one token, and a new KV block
//      when its last block is full. When no block is free, the newest sequence holding blocks is
//      preempted (a partially prefilled one first, then the newest running one): its blocks are
//      freed and it goes back to the head of the prefill queue, to be re-prefilled with its prompt
//      plus the tokens generated so far (recompute). Preemption mode: no new prefill this pass.
//   2. Prefill: sequences from the head of the FIFO queue, up to `max_tokens_per_pass` tokens in
//   the
//      pass and `max_num_seqs` sequences holding KV, while KV blocks last. A prompt longer than
//      what is left is split across passes (chunked prefill).
// A sequence whose context can never fit the whole cache is not admitted (the engine checks).
//
// Shared blocks (a request's n choices, forked by the engine after the prompt's prefill): a
// sequence about to write into a block that another sequence also holds first gets its own copy
// (copy-on-write, vLLM's): a new block is allocated, the pair goes to SchedulerOutput::copies, and
// the engine copies the K/V before the pass runs. A sequence of width n (a request whose choices
// have not forked yet) counts n against max_num_seqs and the token budget when it is admitted, so
// that its choices, once forked, still decode in one pass.
//
// Sliding windows (engine/kv/kv_cache.h's layer groups): with window layers beside full-context
// ones, each sequence also holds a window block table, which draws blocks from the same allocator;
// with every layer in one window, the main table is the one kept to it. Before a sequence's blocks
// are ensured, the blocks of such a table wholly before position num_computed - window + 1 (the
// first key its next query reads) are freed and their entries become kNoBlock.
//
// Plain class, no device code; the scheduler thread owns it and the BlockAllocator.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "engine/kv/kv_cache.h"

namespace moebatch {

// What the scheduler needs to know of a sequence; the engine keeps the rest beside it.
struct SequenceSlots {
  int64_t id = 0;                    // request id, increasing in arrival order
  std::vector<int32_t> tokens;       // prompt followed by the generated tokens
  int64_t num_computed = 0;          // leading tokens whose K/V is in the cache
  std::vector<int32_t> block_table;  // covers at least num_computed tokens
  // The window group's table (SchedulerConfig::window > 0): as long as block_table, kNoBlock for
  // the blocks behind the window (a prefix), block ids for the rest.
  std::vector<int32_t> window_block_table;
  int64_t num_preemptions = 0;
  int64_t width = 1;  // sequences it stands for at admission: n before its choices fork, else 1

  int64_t num_pending() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
};

struct SchedulerConfig {
  int64_t max_num_seqs = 256;          // sequences holding KV at once
  int64_t max_tokens_per_pass = 2048;  // prefill + decode tokens per pass (n_real, §6.3)
  int64_t block_size = 16;
  // KvCacheConfig::group_window of each group, in tokens: what a table is kept to (0: the whole
  // context). window 0: sequences hold no window table.
  int64_t main_window = 0;
  int64_t window = 0;
};

// The configuration for a token ceiling and the engine's options (MoE-Lens §6.2-6.3), in tokens
// and sequences:
//   max_tokens_per_pass  the ceiling, lowered to the profiler's n_real when there is one (past
//                        n_real the GPU is saturated: more tokens per pass only lengthen a pass)
//   max_num_seqs         `max_num_seqs` when positive; 0 (automatic): that token budget, i.e. no
//                        limit of its own. A sequence joins the running set through at least one
//                        prefill token of a pass, so running sequences never outnumber the budget
//                        and a pass (decode first) never exceeds it: a device sized for the budget
//                        holds every pass. A smaller max_num_seqs leaves decode passes short of
//                        n_real (§5: throughput grows with the sequences decoded per pass).
// Preconditions: max_tokens_per_pass >= 1, max_num_seqs >= 0.
SchedulerConfig SchedulerConfigFor(int64_t max_tokens_per_pass, int64_t max_num_seqs,
                                   std::optional<int64_t> n_real, int64_t block_size);

struct ScheduledChunk {
  SequenceSlots* seq = nullptr;
  int64_t num_tokens = 0;  // tokens[num_computed, num_computed + num_tokens) run this pass
  bool is_decode = false;
};

struct BlockCopy {
  int32_t src = 0, dst = 0;  // KV block ids: dst gets src's contents before the pass runs
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;  // decode chunks first, then prefill chunks
  std::vector<SequenceSlots*> preempted;
  std::vector<BlockCopy> copies;  // copy-on-write of shared blocks, to do before the pass
  int64_t num_decode_tokens = 0;
  int64_t num_prefill_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockAllocator* allocator);

  // Queues a new sequence for prefill (tail of the FIFO). The scheduler does not own it.
  void Add(SequenceSlots* seq);
  // Adds a sequence straight to the running (decode) set: a choice forked from a sequence whose
  // prompt is prefilled; its block table shares that sequence's blocks (BlockAllocator::Share)
  // and num_computed covers the prompt; likewise its window block table. Its id orders it among
  // the running ones.
  void AddRunning(SequenceSlots* seq);
  // Forms the next pass. Blocks for every chunk are allocated before it returns.
  SchedulerOutput Schedule();
  // After the pass ran: advances num_computed of every chunk; sequences whose prompt is now fully
  // prefilled join the running (decode) set.
  void Commit(const SchedulerOutput& output);
  // Removes a sequence wherever it is and frees its blocks (finished, cancelled or failed).
  void Remove(SequenceSlots* seq);

  const SchedulerConfig& config() const { return config_; }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }

 private:
  // Blocks for writing tokens [num_computed, tokens_after) in each table: new ones past it, and a
  // copy of the shared block the first of them goes to (recorded in out->copies). false (nothing
  // changed but the release of blocks behind a window) when too few are free.
  bool EnsureBlocks(SequenceSlots* seq, int64_t tokens_after, SchedulerOutput* out);
  // Frees the blocks of windowed tables that no query at position >= num_computed reads.
  void ReleaseBehindWindow(SequenceSlots* seq);
  // Tokens past num_computed that the blocks held and free can take.
  int64_t Capacity(const SequenceSlots& seq) const;
  int num_tables() const { return config_.window > 0 ? 2 : 1; }
  SequenceSlots* PickVictim(const SequenceSlots* requester);
  void Preempt(SequenceSlots* seq, SchedulerOutput* out);

  SchedulerConfig config_;
  BlockAllocator* allocator_;
  std::deque<SequenceSlots*> waiting_;   // FIFO; the head may be partially prefilled
  std::vector<SequenceSlots*> running_;  // decode set, in arrival order
};

}  // namespace moebatch
