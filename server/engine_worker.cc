#include "server/engine_worker.h"

#include <algorithm>
#include <ctime>
#include <iterator>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/metrics.h"
#include "spdlog/spdlog.h"

namespace moebatch {

EngineWorker::EngineWorker(Engine* engine, JobStore* store, const WorkerOptions& options)
    : engine_(engine), store_(store), options_(options) {}

EngineWorker::~EngineWorker() { Stop(); }

void EngineWorker::Start() {
  thread_ = std::thread([this] { Run(); });
}

void EngineWorker::Stop() {
  stop_ = true;
  {
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

int64_t EngineWorker::Drain(absl::Duration timeout) {
  draining_ = true;
  absl::MutexLock lock(&mu_);
  cv_.SignalAll();  // wakes an idle engine thread
  const absl::Time deadline = absl::Now() + timeout;
  // in_flight_count_ is exact once the engine thread has gone past its feeding step with
  // draining_ set (drain_seen_): no request can join after that.
  while ((!drain_seen_ || in_flight_count_ > 0) && health_.ok() && !stop_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return in_flight_count_;
}

void EngineWorker::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
  cv_.SignalAll();
}

void EngineWorker::Cancel(const std::string& job_id, JobState final_state) {
  absl::MutexLock lock(&mu_);
  cancels_.emplace(job_id, final_state);
  cv_.SignalAll();
}

void EngineWorker::SetMaxTokens(const std::string& job_id, int64_t max_tokens_total) {
  absl::MutexLock lock(&mu_);
  // The engine thread may have run the job already (it polls the store): a short job may even
  // have ended.
  if (auto ended = ended_.find(job_id); ended != ended_.end()) {
    ended->second.max_tokens_total = max_tokens_total;
    return;
  }
  max_tokens_[job_id] = max_tokens_total;
  if (auto clock = clocks_.find(job_id); clock != clocks_.end()) {
    clock->second.SetTotals(clock->second.Read().requests_total, max_tokens_total);
  }
}

JobLive EngineWorker::Live(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (auto ended = ended_.find(job_id); ended != ended_.end()) return ended->second;
  JobLive out;
  if (auto it = live_.find(job_id); it != live_.end()) out = it->second;
  if (auto it = max_tokens_.find(job_id); it != max_tokens_.end())
    out.max_tokens_total = it->second;
  if (auto it = clocks_.find(job_id); it != clocks_.end()) out.clock = it->second.Read();
  return out;
}

int64_t EngineWorker::WaitForChange(int64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  while (version_ == seen && !stop_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return version_;
}

int64_t EngineWorker::version() {
  absl::MutexLock lock(&mu_);
  return version_;
}

EngineStats EngineWorker::engine_stats() {
  absl::MutexLock lock(&mu_);
  return engine_stats_;
}

absl::Status EngineWorker::health() {
  absl::MutexLock lock(&mu_);
  return health_;
}

void EngineWorker::Bump() {
  absl::MutexLock lock(&mu_);
  ++version_;
  cv_.SignalAll();
}

absl::Status EngineWorker::HandleCancels() {
  std::map<std::string, JobState> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs.swap(cancels_);
  }
  for (const auto& [job, final_state] : jobs) {
    int aborted = 0;
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (it->second.job_id == job) {
        engine_->Abort(it->first);  // its KV blocks are freed by the next Step
        keys_.erase({job, it->second.index});
        it = in_flight_.erase(it);
        ++aborted;
      } else {
        ++it;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      live_.erase(job);
      // The aborted requests' room in the engine goes to the next pending ones.
      if (aborted > 0) wake_ = true;
    }
    auto record = store_->GetJob(job);
    if (!record.ok()) return record.status();
    if (!IsTerminal(record->state)) {
      // FailedPrecondition: its last result completed it meanwhile; that state stands.
      absl::Status st = store_->SetJobState(job, final_state);
      if (!st.ok() && st.code() != absl::StatusCode::kFailedPrecondition) return st;
    }
    spdlog::info("job {} {} ({} in-flight requests stopped)", job,
                 std::string(JobStateName(final_state)), aborted);
    LogIfJobDone(job);
  }
  if (!jobs.empty()) Bump();
  return absl::OkStatus();
}

absl::Status EngineWorker::Feed() {
  const int64_t room = options_.max_in_flight - static_cast<int64_t>(in_flight_.size());
  if (room <= 0) return absl::OkStatus();
  // In-flight requests are still pending in the store: they are skipped. Tenants take turns: the
  // store's round robin starts after the tenant fed last (JobStore::PendingRequests).
  auto pending = store_->PendingRequests(room, last_fed_tenant_,
                                         [this](const std::string& job, int64_t index) {
                                           return keys_.count({job, index}) != 0;
                                         });
  if (!pending.ok()) return pending.status();
  for (PendingRequest& p : *pending) {
    StartClock(p.job_id);
    ParsedBatchLine parsed = ParseBatchLine(p.request.line);
    InFlight flight;
    flight.job_id = p.job_id;
    flight.index = p.request.index;
    absl::StatusOr<int64_t> id = absl::InternalError("unparsed");
    if (parsed.request.ok()) {
      flight.request = *parsed.request;
      GenerationRequest gen{p.request.prompt_token_ids, flight.request.sampling};
      id = engine_->AddRequest(std::move(gen));
    } else {
      id = parsed.request.status();
    }
    if (!id.ok()) {
      // Validated when the job was created; reaching here means the engine refuses it now (for
      // example a smaller KV cache after a restart): a failed result, not a stuck job.
      StoredResult r{
          p.request.index, p.request.custom_id,
          FormatBatchError(parsed, absl::StrCat("batch_req_", p.job_id, "_", p.request.index),
                           id.status()),
          true};
      auto st = store_->CommitResult(p.job_id, r, 0, 0);
      if (!st.ok()) return st.status();
      if (*st && options_.metrics != nullptr) options_.metrics->ObserveResult(true, 0, 0);
      {
        absl::MutexLock lock(&mu_);
        if (auto clock = clocks_.find(p.job_id); clock != clocks_.end()) {
          clock->second.AddRequests(1);
        }
      }
      LogIfJobDone(p.job_id);
      Bump();
      continue;
    }
    flight.prompt_tokens = static_cast<int64_t>(p.request.prompt_token_ids.size());
    flight.choices.resize(flight.request.sampling.n);
    for (Completion& c : flight.choices) c.prompt_tokens = flight.prompt_tokens;
    {
      absl::MutexLock lock(&mu_);
      live_[p.job_id].prompt_tokens += flight.prompt_tokens;
    }
    keys_.insert({p.job_id, p.request.index});
    in_flight_.emplace(*id, std::move(flight));
    last_fed_tenant_ = p.tenant;
  }
  return absl::OkStatus();
}

absl::Status EngineWorker::Finish(int64_t request_id, InFlight& f) {
  const std::string rid = absl::StrCat("batch_req_", f.job_id, "_", f.index);
  StoredResult r{f.index, f.request.custom_id,
                 FormatBatchOutput(f.request, rid, f.choices,
                                   static_cast<int64_t>(std::time(nullptr)), &engine_->tokenizer()),
                 false};
  if (!f.error.ok()) {  // a failed request: an error line, counted as failed
    ParsedBatchLine line;
    line.custom_id = f.request.custom_id;
    line.json_ok = true;
    line.request = f.error;
    r.line = FormatBatchError(line, rid, f.error);
    r.failed = true;
    spdlog::warn("job {} request {} ({}): {}", f.job_id, f.index, f.request.custom_id,
                 f.error.ToString());
  }
  const int64_t completion_tokens = f.completion_tokens();
  auto committed = store_->CommitResult(f.job_id, r, f.prompt_tokens, completion_tokens);
  if (!committed.ok()) return committed.status();
  if (*committed && options_.metrics != nullptr) {
    options_.metrics->ObserveResult(r.failed, f.prompt_tokens, completion_tokens);
  }
  absl::MutexLock lock(&mu_);
  JobLive& live = live_[f.job_id];
  live.prompt_tokens -= f.prompt_tokens;
  live.generated_tokens -= completion_tokens;
  return absl::OkStatus();
}

void EngineWorker::Committed(const InFlight& f) {
  keys_.erase({f.job_id, f.index});
  {
    absl::MutexLock lock(&mu_);
    if (auto clock = clocks_.find(f.job_id); clock != clocks_.end()) clock->second.AddRequests(1);
  }
  LogIfJobDone(f.job_id);
}

void EngineWorker::StartClock(const std::string& job) {
  {
    absl::MutexLock lock(&mu_);
    if (clocks_.count(job) != 0) return;
  }
  // What is left to run: every request of a new job but the pre-failed ones; after a restart, the
  // ones without a result.
  int64_t remaining = 0;
  if (auto record = store_->GetJob(job); record.ok()) {
    remaining = std::max<int64_t>(0, record->total - record->completed - record->failed);
  }
  absl::MutexLock lock(&mu_);
  auto max_tokens = max_tokens_.find(job);
  clocks_.try_emplace(job, remaining, max_tokens == max_tokens_.end() ? 0 : max_tokens->second);
}

absl::Status EngineWorker::RetryUnsaved() {
  if (unsaved_.empty() || std::chrono::steady_clock::now() < next_commit_retry_) {
    return absl::OkStatus();
  }
  while (!unsaved_.empty()) {
    InFlight& f = unsaved_.front();
    if (absl::Status st = Finish(0, f); !st.ok()) {
      if (!JobStore::IsStorageFailure(st)) return st;
      commit_backoff_ = std::min(commit_backoff_ * 2, std::chrono::milliseconds(10000));
      next_commit_retry_ = std::chrono::steady_clock::now() + commit_backoff_;
      return absl::OkStatus();
    }
    Committed(f);
    unsaved_.pop_front();
    Bump();
  }
  spdlog::info("engine worker: every held result is committed; feeding requests again");
  commit_backoff_ = std::chrono::milliseconds(500);
  return absl::OkStatus();
}

void EngineWorker::LogIfJobDone(const std::string& job) {
  {
    absl::MutexLock lock(&mu_);
    if (clocks_.count(job) == 0 && max_tokens_.count(job) == 0) return;  // not run here
  }
  auto next = keys_.lower_bound({job, std::numeric_limits<int64_t>::min()});
  if (next != keys_.end() && next->first == job) return;  // still running
  auto record = store_->GetJob(job);
  if (!record.ok() || !IsTerminal(record->state)) return;
  JobLive ended;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = max_tokens_.find(job); it != max_tokens_.end()) {
      ended.max_tokens_total = it->second;
      max_tokens_.erase(it);
    }
    // One reading for both the log line and every later JobProgress: the same figures.
    if (auto clock = clocks_.find(job); clock != clocks_.end()) {
      ended.clock = clock->second.Read();
      clocks_.erase(clock);
    }
    live_.erase(job);
    if (ended_.insert_or_assign(job, ended).second) ended_order_.push_back(job);
    while (ended_order_.size() > kEndedJobsKept) {
      ended_.erase(ended_order_.front());
      ended_order_.pop_front();
    }
  }
  if (!ended.clock) return;
  const JobClock::Reading& r = *ended.clock;
  spdlog::info(
      "job {} {} in {:.3f} s: {} requests ({} completed, {} failed; {} run here), {} tokens "
      "generated here, {:.1f} tok/s",
      job, std::string(JobStateName(record->state)), r.elapsed_seconds, record->total,
      record->completed, record->failed, r.requests_done, r.tokens_done, r.tokens_per_second);
}

void EngineWorker::Run() {
  std::vector<GenerationOutput> outputs;
  bool feed = true;
  while (!stop_) {
    last_loop_.store(std::chrono::steady_clock::now().time_since_epoch().count());
    absl::Status st = HandleCancels();
    if (st.ok()) st = RetryUnsaved();
    {
      absl::MutexLock lock(&mu_);
      feed = feed || wake_;
      wake_ = false;
    }
    if (st.ok() && feed && !draining_ && unsaved_.empty()) {
      st = Feed();
      feed = false;
    }
    {
      absl::MutexLock lock(&mu_);
      const bool seen = draining_.load();
      const int64_t held = static_cast<int64_t>(in_flight_.size() + unsaved_.size());
      if (in_flight_count_ != held || seen != drain_seen_) {
        in_flight_count_ = held;
        drain_seen_ = seen;
        cv_.SignalAll();
      }
    }
    if (st.ok() && !engine_->HasUnfinished()) {
      absl::MutexLock lock(&mu_);
      if (!wake_ && cancels_.empty() && !stop_) {
        // (Held results are retried at the top of the loop, at least once a second.)
        // Idle: look at the store again at least once a second, whatever woke us or not.
        cv_.WaitWithTimeout(&mu_, absl::Seconds(1));
        feed = true;
      }
      continue;
    }
    if (st.ok()) {
      outputs.clear();
      st = engine_->Step(&outputs);
    }
    if (!st.ok()) {
      spdlog::error("engine worker: {}", st.ToString());
      absl::MutexLock lock(&mu_);
      health_ = st;
      ++version_;
      cv_.SignalAll();
      return;
    }
    {
      const EngineStats snapshot = engine_->stats();
      if (options_.metrics != nullptr) options_.metrics->ObservePass(snapshot);
      absl::MutexLock lock(&mu_);
      engine_stats_ = snapshot;
    }
    bool committed = false;
    for (GenerationOutput& o : outputs) {
      auto it = in_flight_.find(o.request_id);
      if (it == in_flight_.end()) continue;  // aborted by a cancel
      InFlight& f = it->second;
      if (o.index < 0 || o.index >= static_cast<int32_t>(f.choices.size())) continue;
      Completion& c = f.choices[o.index];
      c.token_ids.insert(c.token_ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      c.logprobs.insert(c.logprobs.end(), std::make_move_iterator(o.new_logprobs.begin()),
                        std::make_move_iterator(o.new_logprobs.end()));
      c.text += o.new_text;
      {
        absl::MutexLock lock(&mu_);
        live_[f.job_id].generated_tokens += static_cast<int64_t>(o.new_token_ids.size());
        if (auto clock = clocks_.find(f.job_id); clock != clocks_.end()) {
          clock->second.AddTokens(static_cast<int64_t>(o.new_token_ids.size()));
        }
      }
      if (!o.finished) continue;
      if (f.error.ok()) f.error = o.error;  // the first failed choice fails the request
      c.finish_reason = FinishReasonName(o.finish_reason);
      c.completion_tokens = o.completion_tokens;
      // One result line per request: committed when its last choice finishes.
      if (++f.finished < static_cast<int32_t>(f.choices.size())) continue;
      if (absl::Status fs = Finish(o.request_id, f); !fs.ok()) {
        if (JobStore::IsStorageFailure(fs)) {
          // The disk is full (or failing): keep the result and go on; it is committed once the
          // storage takes writes again (RetryUnsaved).
          if (unsaved_.empty()) {
            spdlog::error(
                "engine worker: the job store refused a result ({}); holding results "
                "and retrying",
                fs.ToString());
            next_commit_retry_ = std::chrono::steady_clock::now() + commit_backoff_;
          }
          unsaved_.push_back(std::move(f));
          in_flight_.erase(it);
          continue;
        }
        spdlog::error("engine worker: committing a result failed: {}", fs.ToString());
        absl::MutexLock lock(&mu_);
        health_ = fs;
        return;
      }
      Committed(f);
      in_flight_.erase(it);
      committed = true;
      feed = true;
    }
    if (committed) Bump();
  }
}

}  // namespace moebatch
