// Which layer's weights sit in which of the device's two weight slots, and when the data mover
// fills them (MoE-Lens §6.5): the cuda backend's streaming protocol, free of CUDA so that it runs,
// and is tested, on the host with HostCopyEngine (tests/offload/test_weight_slots.cc).
//
// Layers 0..r-1 are resident (kept on the device for good, by the caller); the streamed layers
// r..n-1 are visited in order r, r+1, ..., n-1, r, ... over passes, visit i in slot i % 2 (so a
// layer's slot changes between passes when n - r is odd). At most two visits are live: the layer
// computing and the one prefetched.
//   StartPass      (the pass's first Embed) queues the first streamed layer when nothing is live
//                  (the first pass, or after Reset); later passes find it queued by the last one.
//   Acquire(l)     the slot holding streamed layer l, its fill complete (waits for the mover), and
//                  queues the next streamed layer into the other slot: it is copied while l
//                  computes, once that slot is released.
//   TaskBDone(l)   after the pass's last micro-batch ran task B of l (VSLPipe runs task B of a
//   layer
//                  once per micro-batch, with task A of the next layer in between): l's slot is
//                  released (DataMover::Release: the cuda engine records the release on the
//                  compute stream) and the streamed layer after next is queued into it.
// From the second pass on, the resident layers compute while the pass's first two streamed layers
// are copied (queued at the end of the last pass; the first pass, and the first after a Reset,
// queues the first one at StartPass and the second at its Acquire). With
// exactly two streamed layers the slots hold them for good; one (a one-layer model) stays in its
// slot.
//
// Errors: FailedPrecondition when layers come out of order (a third layer while two are live,
// task B of a layer that is not the oldest); a fill's error from the mover. After any error the
// caller abandons the pass and calls Reset before the next.
//
// Threading: one thread at a time (the device's calling thread); the mover has its own.
#pragma once

#include <cstdint>
#include <deque>

#include "absl/status/statusor.h"
#include "engine/offload/data_mover.h"
#include "engine/model/weight_store.h"

namespace moebatch {

class WeightSlots {
 public:
  // `store` holds the layers' host regions; `mover` fills the two slots of its copy engine. Both
  // must outlive this. 0 <= resident < store.num_layers().
  WeightSlots(const WeightStore& store, int64_t resident, DataMover* mover);

  // A pass of `micro_batches` (1 or 2) begins.
  void BeginPass(int micro_batches);
  absl::Status StartPass();
  // The slot (0 or 1) of streamed layer `layer` (resident <= layer < num_layers).
  absl::StatusOr<int> Acquire(int64_t layer);
  // Any layer; resident layers only count the micro-batches.
  absl::Status TaskBDone(int64_t layer);
  // After a failed call: lets the fills in flight finish (their errors are dropped), releases both
  // slots and forgets what they hold, so the next pass starts as the first did.
  void Reset();

  int64_t num_resident() const { return resident_; }
  int64_t num_streamed() const { return num_layers_ - resident_; }
  // The layer last filled into `slot` (-1: none, or unknown after a failed fill).
  int64_t content(int slot) const { return content_[slot]; }

 private:
  struct Visit {
    int64_t layer;
    int slot;
    uint64_t ticket;  // 0: the slot already held the layer, nothing copied
    bool waited;
  };
  // The live visit of `layer`, queuing its fill when it has none.
  absl::StatusOr<Visit*> Queue(int64_t layer);
  // The streamed layer `step` places after `layer` in the order r, ..., n-1, r, ....
  int64_t StreamedAfter(int64_t layer, int64_t step) const {
    return resident_ + (layer - resident_ + step) % num_streamed();
  }

  const WeightStore& store_;
  const int64_t num_layers_, resident_;
  DataMover* const mover_;
  int64_t content_[2] = {-1, -1};
  std::deque<Visit> visits_;
  int next_slot_ = 0;
  int micro_batches_ = 1;
  int task_b_calls_ = 0;  // for the oldest live layer, this pass
};

}  // namespace moebatch
