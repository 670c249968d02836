// JobClock: the clock of one batch job, for progress lines and the final summary. It starts when
// it is constructed (the job's start), reads a monotonic clock (std::chrono::steady_clock, or an
// injected one in tests) with sub-second resolution, and counts progress in requests and in
// tokens. Rates are averages since the start (not windowed), so they are steady and the final
// one is the job's throughput.
//
//   JobClock clock(/*requests_total=*/100, /*tokens_total=*/100 * 256);
//   clock.AddTokens(generated_this_pass);
//   clock.AddRequests(finished_this_pass);
//   JobClock::Reading r = clock.Read();   // r.tokens_per_second, r.eta_seconds, ...
//
// Threading: not thread-safe; one thread updates and reads it (or the caller guards it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

namespace moebatch {

class JobClock {
 public:
  using Clock = std::chrono::steady_clock;
  using NowFn = std::function<Clock::time_point()>;

  struct Reading {
    double elapsed_seconds = 0;  // since the start
    int64_t requests_done = 0;
    int64_t requests_total = 0;
    int64_t tokens_done = 0;         // generated tokens
    int64_t tokens_total = 0;        // the sum of the requests' max_tokens: an upper bound
    double requests_per_second = 0;  // done / elapsed; 0 before any time has passed
    double tokens_per_second = 0;
    // elapsed * (1 - f) / f, where f is the larger of the request fraction and the token
    // fraction done (requests ending early make the token fraction lag; requests running side by
    // side make the request fraction lag); 0 once everything is done; nullopt while f is 0.
    std::optional<double> eta_seconds;
  };

  // Starts the clock. Totals of 0 are unknown (they then play no part in the ETA).
  explicit JobClock(int64_t requests_total = 0, int64_t tokens_total = 0, NowFn now = Clock::now);

  void SetTotals(int64_t requests_total, int64_t tokens_total);
  void AddRequests(int64_t done) { requests_done_ += done; }
  void AddTokens(int64_t generated) { tokens_done_ += generated; }

  double ElapsedSeconds() const;
  Reading Read() const;

 private:
  NowFn now_;
  Clock::time_point start_;
  int64_t requests_total_ = 0;
  int64_t tokens_total_ = 0;
  int64_t requests_done_ = 0;
  int64_t tokens_done_ = 0;
};

}  // namespace moebatch
