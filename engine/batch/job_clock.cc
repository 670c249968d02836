#include "engine/batch/job_clock.h"

#include <algorithm>
#include <utility>

namespace moebatch {

JobClock::JobClock(int64_t requests_total, int64_t tokens_total, NowFn now)
    : now_(std::move(now)),
      start_(now_()),
      requests_total_(requests_total),
      tokens_total_(tokens_total) {}

void JobClock::SetTotals(int64_t requests_total, int64_t tokens_total) {
  requests_total_ = requests_total;
  tokens_total_ = tokens_total;
}

double JobClock::ElapsedSeconds() const {
  return std::max(0.0, std::chrono::duration<double>(now_() - start_).count());
}

JobClock::Reading JobClock::Read() const {
  Reading r;
  r.elapsed_seconds = ElapsedSeconds();
  r.requests_done = requests_done_;
  r.requests_total = requests_total_;
  r.tokens_done = tokens_done_;
  r.tokens_total = tokens_total_;
  if (r.elapsed_seconds > 0) {
    r.requests_per_second = static_cast<double>(requests_done_) / r.elapsed_seconds;
    r.tokens_per_second = static_cast<double>(tokens_done_) / r.elapsed_seconds;
  }
  double fraction = 0;
  if (requests_total_ > 0) {
    fraction = std::max(fraction, static_cast<double>(requests_done_) / requests_total_);
  }
  if (tokens_total_ > 0) {
    fraction = std::max(fraction, static_cast<double>(tokens_done_) / tokens_total_);
  }
  const bool all_done = requests_total_ > 0 && requests_done_ >= requests_total_;
  if (all_done || fraction >= 1) {
    r.eta_seconds = 0.0;
  } else if (fraction > 0) {
    r.eta_seconds = r.elapsed_seconds * (1 - fraction) / fraction;
  }
  return r;
}

}  // namespace moebatch
