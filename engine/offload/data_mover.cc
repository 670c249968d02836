#include "engine/offload/data_mover.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moebatch {

void HostCopyEngine::FreeAligned::operator()(std::byte* p) const { std::free(p); }

HostCopyEngine::HostCopyEngine(int num_slots, size_t slot_bytes) : slot_bytes_(slot_bytes) {
  for (int i = 0; i < num_slots; ++i) {
    const size_t rounded = (std::max<size_t>(slot_bytes, 1) + 63) / 64 * 64;
    slots_.emplace_back(static_cast<std::byte*>(std::aligned_alloc(64, rounded)));
  }
}

absl::Status HostCopyEngine::CopyPacket(int slot, size_t offset, const std::byte* src,
                                        size_t bytes) {
  std::memcpy(slots_[slot].get() + offset, src, bytes);
  return absl::OkStatus();
}

DataMover::DataMover(CopyEngine* engine, size_t packet_bytes)
    : engine_(engine),
      packet_bytes_(packet_bytes > 0 ? packet_bytes : kDefaultPacketBytes),
      held_(engine->num_slots(), false) {
  thread_ = std::thread([this] { Run(); });
}

DataMover::~DataMover() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

absl::StatusOr<uint64_t> DataMover::Enqueue(int slot, const std::byte* src, size_t bytes,
                                            int64_t tag) {
  if (slot < 0 || slot >= engine_->num_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data mover: slot ", slot, " outside [0, ", engine_->num_slots(), ")"));
  }
  if (bytes > engine_->slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("data mover: layer ", tag, " has ", bytes,
                                                   " bytes, a slot holds ", engine_->slot_bytes()));
  }
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    queue_.push_back(Fill{ticket, slot, src, bytes, tag});
  }
  work_cv_.notify_all();
  return ticket;
}

absl::Status DataMover::Wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  if (ticket == 0 || ticket >= next_ticket_) {
    return absl::InvalidArgumentError(absl::StrCat("data mover: no fill has ticket ", ticket));
  }
  done_cv_.wait(lock, [&] { return done_below_ > ticket; });
  auto failed = failed_.find(ticket);
  return failed == failed_.end() ? absl::OkStatus() : failed->second;
}

void DataMover::Release(int slot) {
  engine_->OnRelease(slot);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot >= 0 && slot < static_cast<int>(held_.size())) held_[slot] = false;
  }
  work_cv_.notify_all();
}

DataMoverStats DataMover::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool DataMover::HeadReady() const {
  return stopping_ || (!queue_.empty() && !held_[queue_.front().slot]);
}

void DataMover::Run() {
  for (;;) {
    Fill fill;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Fills run in FIFO order: wait until the head's slot is free (or the mover stops).
      work_cv_.wait(lock, [this] { return HeadReady(); });
      if (stopping_) {
        for (const Fill& dropped : queue_) {
          failed_.emplace(dropped.ticket,
                          absl::CancelledError(absl::StrCat("data mover: stopped before layer ",
                                                            dropped.tag, " was copied")));
        }
        queue_.clear();
        done_below_ = next_ticket_;
        done_cv_.notify_all();
        return;
      }
      fill = queue_.front();
      queue_.pop_front();
    }
    // Busy time is copying: it starts once the slot's previous content is released.
    absl::Status status = engine_->BeforeFill(fill.slot);
    const auto t0 = std::chrono::steady_clock::now();
    int64_t packets = 0;
    for (size_t offset = 0; status.ok() && offset < fill.bytes; offset += packet_bytes_) {
      const size_t n = std::min(packet_bytes_, fill.bytes - offset);
      status = engine_->CopyPacket(fill.slot, offset, fill.src + offset, n);
      ++packets;
    }
    if (status.ok()) status = engine_->AfterFill(fill.slot);
    if (!status.ok()) {
      status =
          absl::Status(status.code(), absl::StrCat("data mover: layer ", fill.tag, " into slot ",
                                                   fill.slot, ": ", status.message()));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_[fill.slot] = status.ok();
      stats_.fills += 1;
      stats_.packets += packets;
      stats_.bytes += static_cast<int64_t>(status.ok() ? fill.bytes : 0);
      stats_.busy_seconds += seconds;
      if (!status.ok()) failed_.emplace(fill.ticket, std::move(status));
      done_below_ = fill.ticket + 1;
    }
    done_cv_.notify_all();
  }
}

}  // namespace moebatch
