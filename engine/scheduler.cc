#include "engine/scheduler.h"

#include <algorithm>

namespace moebatch {

SchedulerConfig SchedulerConfigFor(int64_t max_tokens_per_pass, int64_t max_num_seqs,
                                   std::optional<int64_t> n_real, int64_t block_size) {
  SchedulerConfig config;
  config.max_tokens_per_pass =
      n_real ? std::min(max_tokens_per_pass, std::max<int64_t>(1, *n_real)) : max_tokens_per_pass;
  config.max_num_seqs = max_num_seqs > 0 ? max_num_seqs : config.max_tokens_per_pass;
  config.block_size = block_size;
  return config;
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockAllocator* allocator)
    : config_(config), allocator_(allocator) {}

void Scheduler::Add(SequenceSlots* seq) { waiting_.push_back(seq); }

void Scheduler::AddRunning(SequenceSlots* seq) {
  auto pos = std::lower_bound(
      running_.begin(), running_.end(), seq,
      [](const SequenceSlots* a, const SequenceSlots* b) { return a->id < b->id; });
  running_.insert(pos, seq);
}

namespace {

// What writing tokens [num_computed, tokens_after) takes for one block table: `need` new blocks
// past the table, and a copy of block `first` when another table shares it.
struct TableNeed {
  int64_t need = 0;
  bool copy = false;
  int64_t first = 0;
  int64_t blocks() const { return need + (copy ? 1 : 0); }
};

TableNeed NeedOf(const std::vector<int32_t>& table, const BlockAllocator& allocator,
                 int64_t num_computed, int64_t tokens_after, int64_t block_size) {
  TableNeed n;
  const int64_t have = static_cast<int64_t>(table.size());
  n.need = std::max<int64_t>(0, BlocksForTokens(tokens_after, block_size) - have);
  // Only the block holding position num_computed can be both shared and written: a forked
  // sequence's later blocks are its own.
  n.first = num_computed / block_size;
  n.copy = tokens_after > num_computed && n.first < have && table[n.first] != kNoBlock &&
           allocator.holders(table[n.first]) > 1;
  return n;
}

void Apply(const TableNeed& n, BlockAllocator* allocator, std::vector<int32_t>* table,
           SchedulerOutput* out) {
  if (n.copy) {
    const int32_t dst = *allocator->Allocate();
    out->copies.push_back(BlockCopy{(*table)[n.first], dst});
    allocator->Free((*table)[n.first]);  // one holder fewer; the others keep it
    (*table)[n.first] = dst;
  }
  for (int64_t i = 0; i < n.need; ++i) table->push_back(*allocator->Allocate());
}

// Frees the entries of `table` wholly before position first_key (a windowed table's released
// entries form a prefix: walk back from the last dead one to the first released).
void ReleaseBefore(int64_t first_key, int64_t block_size, BlockAllocator* allocator,
                   std::vector<int32_t>* table) {
  if (first_key <= 0) return;
  const int64_t dead =
      std::min<int64_t>(first_key / block_size, static_cast<int64_t>(table->size()));
  for (int64_t i = dead - 1; i >= 0 && (*table)[i] != kNoBlock; --i) {
    allocator->Free((*table)[i]);
    (*table)[i] = kNoBlock;
  }
}

}  // namespace

void Scheduler::ReleaseBehindWindow(SequenceSlots* seq) {
  // The next query sits at num_computed and reads keys from num_computed - window + 1 on.
  if (config_.main_window > 0) {
    ReleaseBefore(seq->num_computed - config_.main_window + 1, config_.block_size, allocator_,
                  &seq->block_table);
  }
  if (config_.window > 0) {
    ReleaseBefore(seq->num_computed - config_.window + 1, config_.block_size, allocator_,
                  &seq->window_block_table);
  }
}

bool Scheduler::EnsureBlocks(SequenceSlots* seq, int64_t tokens_after, SchedulerOutput* out) {
  ReleaseBehindWindow(seq);
  const int64_t bs = config_.block_size;
  const TableNeed main = NeedOf(seq->block_table, *allocator_, seq->num_computed, tokens_after, bs);
  TableNeed window;
  if (config_.window > 0) {
    window = NeedOf(seq->window_block_table, *allocator_, seq->num_computed, tokens_after, bs);
  }
  if (main.blocks() + window.blocks() > allocator_->num_free()) return false;
  Apply(main, allocator_, &seq->block_table, out);
  if (config_.window > 0) Apply(window, allocator_, &seq->window_block_table, out);
  return true;
}

int64_t Scheduler::Capacity(const SequenceSlots& seq) const {
  // Both tables are as long as each other (EnsureBlocks grows them together; releasing keeps the
  // length), so each token block past them takes num_tables() free blocks.
  return (static_cast<int64_t>(seq.block_table.size()) + allocator_->num_free() / num_tables()) *
             config_.block_size -
         seq.num_computed;
}

SequenceSlots* Scheduler::PickVictim(const SequenceSlots* requester) {
  // A partially prefilled sequence has produced nothing yet: the cheapest to give up.
  for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
    if (!(*it)->block_table.empty()) return *it;
  }
  return running_.empty() ? nullptr : running_.back();  // the newest decode sequence
}

void Scheduler::Preempt(SequenceSlots* seq, SchedulerOutput* out) {
  // A copy into one of its blocks is not needed any more (the block may go to another sequence).
  for (const std::vector<int32_t>* table : {&seq->block_table, &seq->window_block_table}) {
    for (int32_t block : *table) {
      out->copies.erase(std::remove_if(out->copies.begin(), out->copies.end(),
                                       [&](const BlockCopy& c) { return c.dst == block; }),
                        out->copies.end());
    }
  }
  allocator_->FreeAll(&seq->block_table);
  allocator_->FreeAll(&seq->window_block_table);
  seq->num_computed = 0;
  ++seq->num_preemptions;
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) {
    running_.erase(it);
    // Victims go newest first, so pushing each to the front keeps the queue in arrival order.
    waiting_.push_front(seq);
  }
  out->preempted.push_back(seq);
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  // 1. Decode: every running sequence, oldest first.
  for (size_t i = 0; i < running_.size(); ++i) {
    SequenceSlots* seq = running_[i];
    bool self_preempted = false;
    while (!EnsureBlocks(seq, seq->num_computed + 1, &out)) {
      SequenceSlots* victim = PickVictim(seq);
      if (victim == nullptr) break;  // unreachable: seq itself is running
      Preempt(victim, &out);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // it was the newest: nothing after it is left
    out.chunks.push_back(ScheduledChunk{seq, 1, true});
    ++out.num_decode_tokens;
  }
  if (!out.preempted.empty()) return out;  // preemption mode: no new prefill

  // 2. Prefill from the head of the queue within the token budget, while blocks last.
  int64_t budget = config_.max_tokens_per_pass - out.num_decode_tokens;
  int64_t holding = static_cast<int64_t>(running_.size());
  for (SequenceSlots* seq : waiting_) holding += seq->block_table.empty() ? 0 : seq->width;
  for (SequenceSlots* seq : waiting_) {
    if (budget <= 0) break;
    // A sequence of width > 1 also keeps the decode set within the token budget once it forks
    // (a width-1 one joins through a prefill token of this pass's budget).
    if (seq->block_table.empty() &&
        (holding + seq->width > config_.max_num_seqs ||
         (seq->width > 1 && holding + seq->width > config_.max_tokens_per_pass))) {
      break;
    }
    ReleaseBehindWindow(seq);
    const int64_t capacity = Capacity(*seq);
    const int64_t chunk = std::min({seq->num_pending(), budget, capacity});
    if (chunk <= 0) break;
    if (seq->block_table.empty()) holding += seq->width;
    EnsureBlocks(seq, seq->num_computed + chunk, &out);  // cannot fail: chunk <= capacity
    out.chunks.push_back(ScheduledChunk{seq, chunk, false});
    out.num_prefill_tokens += chunk;
    budget -= chunk;
    if (chunk < seq->num_pending()) break;  // FIFO: the rest waits behind the split prompt
  }
  return out;
}

void Scheduler::Commit(const SchedulerOutput& output) {
  for (const ScheduledChunk& chunk : output.chunks) {
    SequenceSlots* seq = chunk.seq;
    seq->num_computed += chunk.num_tokens;
    if (!chunk.is_decode && seq->num_pending() == 0) {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
      auto pos = std::lower_bound(
          running_.begin(), running_.end(), seq,
          [](const SequenceSlots* a, const SequenceSlots* b) { return a->id < b->id; });
      running_.insert(pos, seq);
    }
  }
}

void Scheduler::Remove(SequenceSlots* seq) {
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) {
    waiting_.erase(it);
  }
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) {
    running_.erase(it);
  }
  allocator_->FreeAll(&seq->block_table);
  allocator_->FreeAll(&seq->window_block_table);
}

}  // namespace moebatch
