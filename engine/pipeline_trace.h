// A timeline of the forward passes for chrome://tracing / Perfetto (the Chrome trace event JSON
// format): one row for the device tasks (task A / task B of each layer and micro-batch, the
// embedding, lm_head) and one for the CPU task (K/V append + attention), so a user can see how
// VSLPipe overlaps them (MoE-Lens Fig. 9). Each pass is an event of its own on a third row.
//
// Threading: Add may be called from any thread (mutex). Memory: at most `max_events` events are
// kept (later ones are counted and dropped; the file says how many).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moebatch {

class PipelineTrace {
 public:
  enum Row : int { kDeviceRow = 1, kCpuRow = 2, kPassRow = 3 };
  using Clock = std::chrono::steady_clock;

  explicit PipelineTrace(size_t max_events = 1 << 20);

  // A complete event [start, end) on `row`; `layer` / `micro_batch` < 0 are left out of its args.
  void Add(Row row, std::string name, Clock::time_point start, Clock::time_point end,
           int64_t layer = -1, int micro_batch = -1, int64_t tokens = -1);

  // An argument of an event: a number, or text when `text` is not empty.
  struct Arg {
    std::string key;
    double number = 0;
    std::string text;
  };
  // Adds `args` to the last event added on `row` (none yet: nothing). The engine puts each pass's
  // roofline on it (engine/plan/cpu_roofline.h).
  void AnnotateLast(Row row, std::vector<Arg> args);

  // Writes {"traceEvents": [...]} to `path` (times in microseconds since the trace began).
  // Internal with the path when it cannot be written.
  absl::Status WriteChromeTrace(const std::string& path) const;

  size_t size() const;

 private:
  struct Event {
    Row row;
    std::string name;
    int64_t start_us, duration_us, layer, tokens;
    int micro_batch;
    std::vector<Arg> args;
  };
  const Clock::time_point origin_;
  const size_t max_events_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  int64_t dropped_ = 0;
};

}  // namespace moebatch
