#include "engine/offload/weight_slots.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace moebatch {

WeightSlots::WeightSlots(const WeightStore& store, int64_t resident, DataMover* mover)
    : store_(store), num_layers_(store.num_layers()), resident_(resident), mover_(mover) {}

void WeightSlots::BeginPass(int micro_batches) {
  micro_batches_ = std::max(1, micro_batches);
  task_b_calls_ = 0;
}

absl::Status WeightSlots::StartPass() {
  if (!visits_.empty()) return absl::OkStatus();
  return Queue(resident_).status();
}

absl::StatusOr<WeightSlots::Visit*> WeightSlots::Queue(int64_t layer) {
  for (Visit& v : visits_) {
    if (v.layer == layer) return &v;
  }
  if (visits_.size() >= 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weight slots: layer ", layer, " asked for while layers ", visits_[0].layer, " and ",
        visits_[1].layer, " hold both slots (layers must be visited in order)"));
  }
  const int slot = next_slot_;
  Visit v{layer, slot, 0, true};
  if (content_[slot] != layer) {
    const WeightRegion& region = store_.layer(layer);
    auto ticket = mover_->Enqueue(slot, region.data, region.bytes, layer);
    if (!ticket.ok()) return ticket.status();
    v.ticket = *ticket;
    v.waited = false;
    content_[slot] = layer;
  }
  next_slot_ ^= 1;
  visits_.push_back(v);
  return &visits_.back();
}

absl::StatusOr<int> WeightSlots::Acquire(int64_t layer) {
  if (layer < resident_ || layer >= num_layers_) {
    return absl::InvalidArgumentError(absl::StrCat("weight slots: layer ", layer,
                                                   " is not streamed (streamed: [", resident_, ", ",
                                                   num_layers_, "))"));
  }
  auto visit = Queue(layer);
  if (!visit.ok()) return visit.status();
  Visit& v = **visit;
  if (!v.waited) {
    if (absl::Status st = mover_->Wait(v.ticket); !st.ok()) {
      content_[v.slot] = -1;  // unknown content: refill on the next visit
      return st;
    }
    v.waited = true;
  }
  const int slot = v.slot;
  if (num_streamed() > 1 && visits_.size() < 2) {
    if (auto next = Queue(StreamedAfter(layer, 1)); !next.ok()) return next.status();
  }
  return slot;
}

absl::Status WeightSlots::TaskBDone(int64_t layer) {
  if (++task_b_calls_ < micro_batches_) return absl::OkStatus();
  task_b_calls_ = 0;
  if (layer < resident_) return absl::OkStatus();
  if (num_streamed() == 1) return absl::OkStatus();  // the one streamed layer stays in its slot
  if (visits_.empty() || visits_.front().layer != layer) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight slots: layer ", layer, " finished out of order"));
  }
  const int slot = visits_.front().slot;
  visits_.pop_front();
  mover_->Release(slot);
  // MoE-Lens §6.5: the weights after next are copied while the next layer computes.
  return Queue(StreamedAfter(layer, 2)).status();
}

void WeightSlots::Reset() {
  // Slots the consumer holds first: a queued fill may be waiting for one of them.
  for (const Visit& v : visits_) {
    if (v.waited) mover_->Release(v.slot);
  }
  for (const Visit& v : visits_) {
    if (v.waited) continue;
    if (absl::Status st = mover_->Wait(v.ticket); !st.ok()) {
      spdlog::warn("weight slots: resetting after a failed pass: {}", st.ToString());
    }
    mover_->Release(v.slot);
  }
  visits_.clear();
  content_[0] = content_[1] = -1;
  next_slot_ = 0;
  task_b_calls_ = 0;
}

}  // namespace moebatch
