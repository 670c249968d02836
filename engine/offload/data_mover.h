// The contiguous data mover (MoE-Lens §6.5): a dedicated thread that copies whole layers of
// weights from host memory into the slots of the device's weight buffer (two slots: the layer in
// use and the one being loaded), in packets issued one at a time, so that the small,
// latency-critical transfers of the pipeline (q/k/v to the CPU, attention outputs back) never
// wait behind a whole layer in the copy engine's queue.
//
// Protocol, per slot:
//   Enqueue(slot, src, bytes, tag)   the producer (the pipeline) asks for a fill; FIFO order
//   ... the mover waits until the slot's previous content has been Released (and, in
//       CopyEngine::BeforeFill, until the device is past its last use: the cuda engine waits for
//       the release event), then copies the bytes packet by packet (each packet complete before
//       the next is issued) and marks the slot ready (CopyEngine::AfterFill)
//   Wait(ticket)                     blocks the caller until that fill is complete
//   Release(slot)                    the consumer is done with the content (cuda: records the
//                                    release event on the compute stream; the next fill of the
//                                    slot starts after the last kernel that read it)
// A fill of a slot that has never been filled does not wait for a Release.
//
// What a "copy" is belongs to the CopyEngine: HostCopyEngine (host slots, memcpy) serves the cpu
// backend's pipeline and the tests; the cuda backend's engine (cuda/) copies pinned host memory to
// device slots with cudaMemcpyAsync on the mover's own stream.
//
// Threading: Enqueue, Wait, Release and stats may be called from any thread (guarded by mu_). The
// CopyEngine's BeforeFill/CopyPacket/AfterFill run on the mover thread only; OnRelease on Release's
// caller.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace moebatch {

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual int num_slots() const = 0;
  virtual size_t slot_bytes() const = 0;
  // Mover thread, before the first packet of a fill of `slot` (its previous content released).
  virtual absl::Status BeforeFill(int slot) = 0;
  // Mover thread: copies src[0, bytes) to the slot at `offset`; returns when the copy is complete.
  virtual absl::Status CopyPacket(int slot, size_t offset, const std::byte* src, size_t bytes) = 0;
  // Mover thread, after the last packet of a fill: publishes the slot's new content.
  virtual absl::Status AfterFill(int slot) = 0;
  // Consumer thread, from DataMover::Release.
  virtual void OnRelease(int slot) = 0;
};

// Slots in host memory (64-byte aligned), filled with memcpy.
class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine(int num_slots, size_t slot_bytes);
  int num_slots() const override { return static_cast<int>(slots_.size()); }
  size_t slot_bytes() const override { return slot_bytes_; }
  std::byte* slot(int i) const { return slots_[i].get(); }
  absl::Status BeforeFill(int slot) override { return absl::OkStatus(); }
  absl::Status CopyPacket(int slot, size_t offset, const std::byte* src, size_t bytes) override;
  absl::Status AfterFill(int slot) override { return absl::OkStatus(); }
  void OnRelease(int slot) override {}

 private:
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  size_t slot_bytes_;
  std::vector<std::unique_ptr<std::byte, FreeAligned>> slots_;
};

struct DataMoverStats {
  int64_t fills = 0;
  int64_t packets = 0;
  int64_t bytes = 0;
  double busy_seconds = 0;  // wall time spent copying packets (not waiting for releases)
};

class DataMover {
 public:
  static constexpr size_t kDefaultPacketBytes = size_t{64} << 20;

  // `engine` must outlive the mover. Starts the mover thread. packet_bytes > 0.
  DataMover(CopyEngine* engine, size_t packet_bytes = kDefaultPacketBytes);
  // Finishes the fill in progress, drops the queued ones (Cancelled), joins the thread.
  ~DataMover();
  DataMover(const DataMover&) = delete;
  DataMover& operator=(const DataMover&) = delete;

  // Queues a fill of `slot` with src[0, bytes) (`src` must stay valid until the fill completes);
  // `tag` names the content (the layer) in stats and errors. Returns the ticket to Wait on.
  // InvalidArgument for a slot out of range or more bytes than a slot holds.
  absl::StatusOr<uint64_t> Enqueue(int slot, const std::byte* src, size_t bytes, int64_t tag);

  // Blocks until fill `ticket` is complete; its status (the CopyEngine's error, naming the tag).
  // InvalidArgument for a ticket never issued.
  absl::Status Wait(uint64_t ticket);

  // The consumer is done with the slot's current content; a queued fill of it may proceed.
  void Release(int slot);

  DataMoverStats stats() const;
  size_t packet_bytes() const { return packet_bytes_; }

 private:
  struct Fill {
    uint64_t ticket;
    int slot;
    const std::byte* src;
    size_t bytes;
    int64_t tag;
  };
  void Run();
  bool HeadReady() const;  // mu_ held

  CopyEngine* const engine_;
  const size_t packet_bytes_;
  // std::mutex rather than absl::Mutex: ThreadSanitizer understands it without an instrumented
  // Abseil (scripts/sanitize.sh tsan runs the data mover under TSan).
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the mover thread waits: queue, releases, stop
  std::condition_variable done_cv_;  // waiters of fills
  std::deque<Fill> queue_;
  // Per slot: filled and not yet released.
  std::vector<bool> held_;
  uint64_t next_ticket_ = 1;
  uint64_t done_below_ = 1;                  // fills are completed in ticket order
  std::map<uint64_t, absl::Status> failed_;  // fills that failed, by ticket
  bool stopping_ = false;
  DataMoverStats stats_;
  std::thread thread_;
};

}  // namespace moebatch
