// The daemon's engine thread and feeder (design.md, data flow steps 3-6).
//
// One thread owns the Engine. Each loop it (1) finishes cancellations: aborts the in-flight
// sequences of cancelling jobs and marks those jobs CANCELLED; (2) tops up the engine from the job
// store's pending requests, in job order, keeping at most `max_in_flight` requests inside the
// engine (its admission limit); (3) runs one engine pass; (4) commits every finished request's
// result (an OpenAI batch output line) to the store at once. On start, whatever the store lists as
// pending is simply queued again: committed results are never recomputed or duplicated.
//
// Other threads (gRPC handlers) call Wake, Cancel, SetMaxTokens, Live and WaitForChange.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "engine/batch/job_clock.h"
#include "engine/batch/openai_batch.h"
#include "engine/engine.h"
#include "server/job_store.h"

namespace moebatch {

class DaemonMetrics;

struct WorkerOptions {
  int64_t max_in_flight = 512;       // requests handed to the engine and not finished
  DaemonMetrics* metrics = nullptr;  // borrowed; passes and results are observed when set
};

// A job's live figures: the store's counters plus tokens of requests still running, and the
// reading of its job clock.
struct JobLive {
  int64_t generated_tokens = 0;  // in-flight requests' tokens so far
  int64_t prompt_tokens = 0;     // in-flight requests' prompts (prefilled or queued)
  // The sum of max_tokens of the job's runnable requests: the most it can generate. 0 = unknown
  // (the job was created before this daemon started, or has no runnable request).
  int64_t max_tokens_total = 0;
  // The job's clock (engine/batch/job_clock.h: steady clock, sub-second) from the first request
  // this daemon fed (after a restart: from the restart), counting the requests and tokens it ran;
  // frozen when the job ended. Unset when this daemon has run none of the job's requests (queued,
  // or finished before it started) or has forgotten the job (it keeps the last kEndedJobsKept).
  // Its requests_total is what remained to run when the clock started; its tokens_total is
  // max_tokens_total when known.
  std::optional<JobClock::Reading> clock;
};

class EngineWorker {
 public:
  // Borrows both; they must outlive the worker.
  EngineWorker(Engine* engine, JobStore* store, const WorkerOptions& options);
  ~EngineWorker();  // stops the thread

  void Start();
  void Stop();

  // Graceful stop (SIGTERM): takes no new requests from the store from now on and waits until
  // every in-flight request has finished and committed its result, or `timeout` passes. Returns
  // the number of requests still in flight (0 = drained); those stay pending in the store and run
  // again on the next start. The engine thread keeps running; call Stop after.
  int64_t Drain(absl::Duration timeout);

  // A new job was stored: look for pending requests.
  void Wake();
  // Abort the job's in-flight sequences, then mark it `final_state`: CANCELLED (the job is
  // CANCELLING in the store) or EXPIRED (its completion window passed).
  void Cancel(const std::string& job_id, JobState final_state = JobState::kCancelled);

  // CreateJob stored a job whose runnable requests may generate `max_tokens_total` tokens (the
  // sum of their max_tokens); kept in memory (JobLive::max_tokens_total, the job clock's total).
  void SetMaxTokens(const std::string& job_id, int64_t max_tokens_total);
  // The job's live figures (any thread).
  JobLive Live(const std::string& job_id);
  // Ended jobs whose final clock reading Live still returns, the newest ones.
  static constexpr size_t kEndedJobsKept = 4096;
  // Changes (a result committed, a state changed) bump a counter; blocks until it differs from
  // `seen` or `timeout` passes, and returns the current value.
  int64_t WaitForChange(int64_t seen, absl::Duration timeout);
  int64_t version();
  // The last error of the engine thread, if it stopped on one.
  absl::Status health();
  // The engine's statistics after its last pass (any thread).
  EngineStats engine_stats();
  // When the engine thread last went round its loop (it does at least once a second when idle,
  // and after every pass); for the systemd watchdog.
  std::chrono::steady_clock::time_point last_loop() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_loop_.load()));
  }

 private:
  struct InFlight {
    std::string job_id;
    int64_t index = 0;
    BatchRequest request;
    std::vector<Completion> choices;  // [n]: the request's choices, by index
    int32_t finished = 0;             // choices whose final output came: at n, one result line
    absl::Status error;               // the engine failed a choice (FinishReason::kError)
    int64_t prompt_tokens = 0;
    int64_t completion_tokens() const {
      int64_t sum = 0;
      for (const Completion& c : choices) sum += c.completion_tokens;
      return sum;
    }
  };
  void Run();
  void Bump();
  absl::Status Feed();
  absl::Status HandleCancels();
  absl::Status Finish(int64_t request_id, InFlight& flight);
  // Starts the clock of `job` when it has none (its first request is being fed), with the
  // requests still to run (from the store) and the job's max_tokens_total when known.
  void StartClock(const std::string& job);
  // After a request of `job` finished: when none of its requests is in flight and the store says
  // it ended, logs its duration, requests, tokens and rate (from its JobClock) and keeps the
  // clock's final reading for Live (the last kEndedJobsKept jobs).
  void LogIfJobDone(const std::string& job);
  // After a request's result was committed: the bookkeeping of a finished request.
  void Committed(const InFlight& f);
  // Commits the results the storage refused before (the disk full, an I/O error), in order, when
  // their back-off has passed; keeps the rest. Errors other than the storage's are returned.
  absl::Status RetryUnsaved();

  Engine* engine_;
  JobStore* store_;
  WorkerOptions options_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> draining_{false};
  std::atomic<std::chrono::steady_clock::rep> last_loop_{
      std::chrono::steady_clock::now().time_since_epoch().count()};

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool wake_ ABSL_GUARDED_BY(mu_) = true;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, JobState> cancels_ ABSL_GUARDED_BY(mu_);  // job -> its final state
  std::map<std::string, JobLive> live_ ABSL_GUARDED_BY(mu_);      // running jobs: tokens in flight
  // The clock of every running job this process has fed requests of, from the first one fed
  // (after a restart: from the restart). Updated by the engine thread, read by Live.
  std::map<std::string, JobClock> clocks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> max_tokens_ ABSL_GUARDED_BY(mu_);  // SetMaxTokens, until the end
  // Jobs that ended, with their final figures (clock frozen); oldest first in ended_order_.
  std::map<std::string, JobLive> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  EngineStats engine_stats_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_count_ ABSL_GUARDED_BY(mu_) = 0;  // in_flight_.size() after the last loop
  bool drain_seen_ ABSL_GUARDED_BY(mu_) = false;      // that loop skipped feeding: draining

  // Engine thread only.
  std::map<int64_t, InFlight> in_flight_;  // engine request id -> request
  // Finished requests whose result the storage refused (JobStore::IsStorageFailure): kept in
  // order, their keys_ kept, committed again with a back-off (0.5 s doubling to 10 s) until the
  // storage takes them; nothing new is fed meanwhile. Nothing is lost or committed twice: a result
  // is in the store once (CommitResult is idempotent per index) or still here, or, after a stop,
  // its request is still pending in the store and runs again.
  std::deque<InFlight> unsaved_;
  std::chrono::steady_clock::time_point next_commit_retry_{};
  std::chrono::milliseconds commit_backoff_{500};
  std::set<std::pair<std::string, int64_t>> keys_;  // (job, index) in flight
  std::string
      last_fed_tenant_;  // the tenant of the request fed last: the next feed starts after it
};

}  // namespace moebatch
