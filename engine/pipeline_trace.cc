#include "engine/pipeline_trace.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moebatch {

PipelineTrace::PipelineTrace(size_t max_events) : origin_(Clock::now()), max_events_(max_events) {}

void PipelineTrace::Add(Row row, std::string name, Clock::time_point start, Clock::time_point end,
                        int64_t layer, int micro_batch, int64_t tokens) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  Event e{row,
          std::move(name),
          duration_cast<microseconds>(start - origin_).count(),
          duration_cast<microseconds>(end - start).count(),
          layer,
          tokens,
          micro_batch,
          {}};
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

void PipelineTrace::AnnotateLast(Row row, std::vector<Arg> args) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = events_.rbegin(); it != events_.rend(); ++it) {
    if (it->row != row) continue;
    for (Arg& a : args) it->args.push_back(std::move(a));
    return;
  }
}

size_t PipelineTrace::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

absl::Status PipelineTrace::WriteChromeTrace(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  const std::pair<Row, const char*> rows[] = {{kDeviceRow, "device: task A / task B"},
                                              {kCpuRow, "CPU: K/V append + attention"},
                                              {kPassRow, "passes"}};
  for (const auto& [row, name] : rows) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", row},
                      {"args", {{"name", name}}}});
  }
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped = dropped_;
    for (const Event& e : events_) {
      nlohmann::json args = nlohmann::json::object();
      if (e.layer >= 0) args["layer"] = e.layer;
      if (e.micro_batch >= 0) args["micro_batch"] = e.micro_batch == 0 ? "alpha" : "beta";
      if (e.tokens >= 0) args["tokens"] = e.tokens;
      for (const Arg& a : e.args) {
        if (a.text.empty()) {
          args[a.key] = a.number;
        } else {
          args[a.key] = a.text;
        }
      }
      events.push_back({{"name", e.name},
                        {"ph", "X"},
                        {"pid", 1},
                        {"tid", static_cast<int>(e.row)},
                        {"ts", e.start_us},
                        {"dur", e.duration_us},
                        {"args", std::move(args)}});
    }
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData", {{"producer", "moebatch"}, {"dropped_events", dropped}}}};
  std::ofstream out(path);
  if (!out) return absl::InternalError(absl::StrCat("trace: cannot write ", path));
  out << doc.dump() << "\n";
  if (!out.good()) return absl::InternalError(absl::StrCat("trace: error writing ", path));
  return absl::OkStatus();
}

}  // namespace moebatch
