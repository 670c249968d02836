#include "server/batch_service.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/batch/batch_reader.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

// The largest ListJobs reply, bytes (gRPC clients receive up to 4 MiB by default).
constexpr size_t kMaxListReplyBytes = size_t{3} << 20;

// `s` with every ill-formed UTF-8 sequence replaced by U+FFFD: a proto3 string field must be valid
// UTF-8, or the client cannot parse the reply ("Exception deserializing response"), and a damaged
// store may hold anything.
std::string ValidUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t min = 0;
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, min = 0x10000;
    }
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len == 1 ? c : (c & (0xFF >> (len + 1)));
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xC0) == 0x80;
      cp = cp << 6 | (cc & 0x3F);
    }
    if (ok && len > 1 && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the first byte; the rest is read again
      ++i;
    }
  }
  return out;
}

// `s` cut to at most `chars` Unicode code points.
std::string CutChars(const std::string& s, int64_t chars) {
  size_t i = 0;
  for (int64_t n = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && n++ == chars) break;
  }
  return s.substr(0, i);
}

void ToProto(const JobRecord& r, v1::Job* job) {
  job->set_id(ValidUtf8(r.id));
  job->set_state(static_cast<v1::JobState>(r.state));
  job->set_model(ValidUtf8(r.model));
  // Metadata as CreateJob accepts it (CheckJobMetadata); a store written before those limits may
  // hold more, which is not returned, so that a reply stays within the message size.
  int64_t pairs = 0;
  for (const auto& [key, value] : r.metadata) {
    if (pairs++ == kMaxMetadataPairs) break;
    (*job->mutable_metadata())[ValidUtf8(CutChars(key, kMaxMetadataKeyChars))] =
        ValidUtf8(CutChars(value, kMaxMetadataValueChars));
  }
  job->mutable_request_counts()->set_total(r.total);
  job->mutable_request_counts()->set_completed(r.completed);
  job->mutable_request_counts()->set_failed(r.failed);
  job->mutable_request_counts()->set_cancelled(r.cancelled);
  job->set_created_at(r.created_at);
  job->set_finished_at(r.finished_at);
  job->set_error(ValidUtf8(r.error));
  job->set_started_at(r.started_at);
  job->set_prompt_tokens(r.prompt_tokens);
  job->set_generated_tokens(r.generated_tokens);
  job->set_tenant(ValidUtf8(r.tenant));
  job->set_endpoint(ValidUtf8(r.endpoint));
  job->set_input_file_id(ValidUtf8(r.input_file_id));
  job->set_completion_window(ValidUtf8(r.completion_window));
  job->set_expires_at(r.expires_at);
  job->set_cancelling_at(r.cancelling_at);
  // Bounded like an error message: the first entries (an HTTP client gets them all).
  constexpr size_t kMaxErrors = 100;
  for (size_t i = 0; i < r.errors.size() && i < kMaxErrors; ++i) {
    v1::LineError* e = job->add_errors();
    e->set_line(r.errors[i].line);
    e->set_code(ValidUtf8(r.errors[i].code));
    e->set_param(ValidUtf8(r.errors[i].param));
    e->set_message(ValidUtf8(CutChars(r.errors[i].message, 1024)));
  }
}

// How long a job has run and at what rate: from its job clock when this daemon process ran it
// (sub-second, EngineWorker::Live), else from the store's whole seconds (a job that finished
// before the daemon started, or has not started).
struct JobRate {
  double elapsed_seconds = 0;
  double tokens_per_second = 0;
  double eta_seconds = 0;  // 0 when unknown or done
};

JobRate RateOf(const JobRecord& job, const JobLive& live, int64_t generated) {
  JobRate rate;
  const bool terminal = IsTerminal(job.state);
  if (live.clock) {
    rate.elapsed_seconds = live.clock->elapsed_seconds;
    rate.tokens_per_second = live.clock->tokens_per_second;
    if (!terminal) rate.eta_seconds = live.clock->eta_seconds.value_or(0.0);
    return rate;
  }
  if (job.started_at == 0) return rate;
  const int64_t end =
      job.finished_at != 0 ? job.finished_at : static_cast<int64_t>(std::time(nullptr));
  rate.elapsed_seconds = static_cast<double>(std::max<int64_t>(0, end - job.started_at));
  if (rate.elapsed_seconds > 0) {
    rate.tokens_per_second = static_cast<double>(generated) / rate.elapsed_seconds;
    const int64_t done = job.completed + job.failed;
    if (done > 0 && !terminal) {
      rate.eta_seconds = rate.elapsed_seconds / done * static_cast<double>(job.total - done);
    }
  }
  return rate;
}

grpc::Status MissingJobId() {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: required");
}

grpc::Status Loading() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "moebatchd is loading its model; try again shortly (grpc.health.v1 says "
                      "SERVING once it is ready)");
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Whatever a message quotes, it must fit gRPC's 16 KiB of metadata once percent-encoded, or the
  // client sees RESOURCE_EXHAUSTED instead of the error: cut at 8 KiB as encoded.
  constexpr size_t kMaxMessageBytes = 8192;
  std::string message(status.message());
  if (GrpcMessageBytes(message) > kMaxMessageBytes) {
    size_t keep = 0, encoded = 0;
    const std::string tail = " ... (message cut)";
    while (keep < message.size()) {
      const size_t cost = GrpcMessageBytes(std::string_view(message).substr(keep, 1));
      if (encoded + cost > kMaxMessageBytes - tail.size()) break;
      encoded += cost;
      ++keep;
    }
    while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
    message = message.substr(0, keep) + tail;
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

BatchServiceImpl::BatchServiceImpl(JobStore* store, const TokenAuthenticator* auth)
    : store_(store), auth_(auth), rng_(std::random_device{}()) {}

void BatchServiceImpl::Attach(EngineWorker* worker, const Tokenizer* tokenizer, JobLimits limits,
                              TenantQuota quota) {
  attached_storage_ =
      std::make_unique<Attached>(Attached{worker, tokenizer, std::move(limits), quota});
  attached_.store(attached_storage_.get(), std::memory_order_release);
}

const BatchServiceImpl::Attached* BatchServiceImpl::attached() const {
  return attached_.load(std::memory_order_acquire);
}

absl::StatusOr<Principal> BatchServiceImpl::Authenticate(const grpc::ServerContext& context) const {
  if (auth_ == nullptr) return LocalPrincipal();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return auth_->Authenticate("");
  return auth_->Authenticate(std::string_view(it->second.data(), it->second.size()));
}

absl::StatusOr<JobRecord> BatchServiceImpl::VisibleJob(const Principal& who,
                                                       const std::string& job_id) {
  auto job = store_->GetJob(job_id);
  if (!job.ok()) return job.status();
  // Another tenant's job answers exactly as an unknown id does.
  if (!who.admin && job->tenant != who.tenant) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));  // a real id: short
  }
  return job;
}

int64_t BatchServiceImpl::WaitForChange(int64_t seen, absl::Duration timeout) {
  if (const Attached* a = attached()) return a->worker->WaitForChange(seen, timeout);
  absl::SleepFor(timeout);
  return seen;
}

std::string BatchServiceImpl::NewJobId() {
  std::lock_guard<std::mutex> lock(rng_mu_);
  return absl::StrFormat("job_%016x%08x", rng_(), static_cast<uint32_t>(rng_()));
}

std::string BatchServiceImpl::model_name() const {
  const Attached* a = attached();
  return a != nullptr ? a->limits.model_name : "";
}

absl::StatusOr<JobRecord> BatchServiceImpl::Submit(const Principal& who,
                                                   const v1::CreateJobRequest& request,
                                                   const BatchFields& batch, bool store_invalid) {
  const Attached* a = attached();
  if (a == nullptr) return absl::UnavailableError(std::string(Loading().error_message()));
  if (!accepting_) {
    return absl::UnavailableError(
        "moebatchd is shutting down and takes no new jobs; submit again once it has restarted");
  }
  JobRecord job;
  job.id = NewJobId();
  job.tenant = who.tenant;
  job.model = a->limits.model_name;
  job.endpoint = batch.endpoint;
  job.completion_window = batch.completion_window;
  job.input_file_id = batch.input_file_id;
  job.expires_at = batch.expires_at;
  job.metadata.insert(request.metadata().begin(), request.metadata().end());
  std::vector<JobLineError> line_errors;
  PrepareOptions options;
  options.endpoint = batch.endpoint;
  options.line_errors = &line_errors;
  auto prepared = PrepareJob(request, *a->tokenizer, a->limits, job.id, options);
  absl::StatusOr<JobRecord> stored = absl::InternalError("not stored");
  int64_t max_tokens_total = 0;
  if (!prepared.ok()) {
    // Bad lines of an HTTP batch: the batch exists, FAILED, and says which lines (OpenAI's
    // errors.data); anything else (no requests at all, too many) is refused like over gRPC.
    if (!store_invalid || line_errors.empty()) return prepared.status();
    job.state = JobState::kFailed;
    job.errors = std::move(line_errors);
    job.error = std::string(prepared.status().message());
    stored = store_->CreateJob(std::move(job), {}, {});
    if (stored.ok()) {
      spdlog::info("job {} of tenant '{}' failed validation: {} bad lines", stored->id,
                   stored->tenant, stored->errors.size());
    }
  } else {
    job.state = JobState::kInProgress;
    job.total = static_cast<int64_t>(prepared->requests.size() + prepared->prefailed.size());
    for (const StoredRequest& r : prepared->requests) {  // the store keeps prompt + max_tokens
      max_tokens_total += r.budget_tokens - static_cast<int64_t>(r.prompt_token_ids.size());
    }
    stored = store_->CreateJob(std::move(job), prepared->requests, prepared->prefailed, a->quota);
    if (stored.ok()) {
      spdlog::info(
          "job {} created for tenant '{}': {} requests ({} failed validation against the "
          "context)",
          stored->id, stored->tenant, stored->total, prepared->prefailed.size());
    }
  }
  if (!stored.ok()) {
    if (stored.status().code() == absl::StatusCode::kResourceExhausted) {
      spdlog::info("job refused: {}", std::string(stored.status().message()));
    }
    return stored.status();
  }
  if (on_job_created_) on_job_created_(*stored);
  if (max_tokens_total > 0) a->worker->SetMaxTokens(stored->id, max_tokens_total);
  a->worker->Wake();
  return stored;
}

absl::StatusOr<JobRecord> BatchServiceImpl::Cancel(const Principal& who,
                                                   const std::string& job_id) {
  const Attached* a = attached();
  if (a == nullptr) return absl::UnavailableError(std::string(Loading().error_message()));
  auto job = VisibleJob(who, job_id);
  if (!job.ok()) return job.status();
  if (!IsTerminal(job->state) && job->state != JobState::kCancelling) {
    absl::Status st = store_->SetJobState(job->id, JobState::kCancelling);
    // FailedPrecondition: the job finished in the meantime; answer with its final state.
    if (!st.ok() && st.code() != absl::StatusCode::kFailedPrecondition) return st;
    if (st.ok()) {
      a->worker->Cancel(job->id);
      spdlog::info("job {} cancelling", job->id);
    }
    job = store_->GetJob(job_id);
  }
  return job;
}

absl::Status BatchServiceImpl::Delete(const Principal& who, const std::string& job_id) {
  auto job = VisibleJob(who, job_id);
  if (!job.ok()) return job.status();
  if (absl::Status st = store_->DeleteJob(job->id); !st.ok()) return st;
  spdlog::info("job {} of tenant '{}' deleted", job->id, job->tenant);
  return absl::OkStatus();
}

grpc::Status BatchServiceImpl::CreateJob(grpc::ServerContext* context,
                                         const v1::CreateJobRequest* request, v1::Job* response) {
  auto who = Authenticate(*context);
  if (!who.ok()) return ToGrpc(who.status());
  auto stored = Submit(*who, *request);
  if (!stored.ok()) return ToGrpc(stored.status());
  ToProto(*stored, response);
  SetRate(*stored, response);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::GetJob(grpc::ServerContext* context,
                                      const v1::GetJobRequest* request, v1::Job* response) {
  auto who = Authenticate(*context);
  if (!who.ok()) return ToGrpc(who.status());
  if (request->job_id().empty()) return MissingJobId();
  auto job = VisibleJob(*who, request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  ToProto(*job, response);
  SetRate(*job, response);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::ListJobs(grpc::ServerContext* context,
                                        const v1::ListJobsRequest* request,
                                        v1::ListJobsResponse* response) {
  auto who = Authenticate(*context);
  if (!who.ok()) return ToGrpc(who.status());
  int32_t page_size = request->page_size() == 0 ? 20 : request->page_size();
  if (page_size < 0 || page_size > 1000) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("page_size: must be in [1, 1000], got ", page_size));
  }
  std::string tenant = request->tenant();
  if (!who->admin) {
    if (!tenant.empty() && tenant != who->tenant) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "tenant: only an admin token may list another tenant's jobs");
    }
    tenant = who->tenant;
  }
  std::optional<JobState> state;
  if (request->state() != v1::JOB_STATE_UNSPECIFIED) {
    state = static_cast<JobState>(request->state());
  }
  auto page = store_->ListJobs(page_size, request->page_token(), state, tenant);
  if (!page.ok()) return ToGrpc(page.status());
  // At most kMaxListReplyBytes a page (clients take 4 MiB by default), whatever the page size:
  // the page ends early, with the token of its last job, when the next one would pass it.
  size_t bytes = 0;
  for (size_t i = 0; i < page->jobs.size(); ++i) {
    v1::Job* job = response->add_jobs();
    ToProto(page->jobs[i], job);
    SetRate(page->jobs[i], job);
    bytes += job->ByteSizeLong() + 8;  // the field's tag and length
    if (i > 0 && bytes > kMaxListReplyBytes) {
      response->mutable_jobs()->RemoveLast();
      response->set_next_page_token(store_->ResumeToken(*page, i - 1, tenant));
      return grpc::Status::OK;
    }
  }
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::CancelJob(grpc::ServerContext* context,
                                         const v1::CancelJobRequest* request, v1::Job* response) {
  auto who = Authenticate(*context);
  if (!who.ok()) return ToGrpc(who.status());
  if (attached() == nullptr) return Loading();
  if (request->job_id().empty()) return MissingJobId();
  auto job = Cancel(*who, request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  ToProto(*job, response);
  SetRate(*job, response);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::DeleteJob(grpc::ServerContext* context,
                                         const v1::DeleteJobRequest* request,
                                         v1::DeleteJobResponse* response) {
  auto who = Authenticate(*context);
  if (!who.ok()) return ToGrpc(who.status());
  if (request->job_id().empty()) return MissingJobId();
  if (absl::Status st = Delete(*who, request->job_id()); !st.ok()) return ToGrpc(st);
  response->set_job_id(request->job_id());
  return grpc::Status::OK;
}

void BatchServiceImpl::SetRate(const JobRecord& job, v1::Job* out) const {
  const Attached* a = attached();
  const JobRate rate =
      RateOf(job, a != nullptr ? a->worker->Live(job.id) : JobLive{}, job.generated_tokens);
  out->set_tokens_per_second(rate.tokens_per_second);
  out->set_elapsed_seconds(rate.elapsed_seconds);
}

void BatchServiceImpl::FillProgress(const Attached& at, const JobRecord& job, v1::JobProgress* p) {
  const JobLive live = at.worker->Live(job.id);
  p->set_job_id(ValidUtf8(job.id));
  p->set_error(ValidUtf8(job.error));
  p->set_state(static_cast<v1::JobState>(job.state));
  p->mutable_request_counts()->set_total(job.total);
  p->mutable_request_counts()->set_completed(job.completed);
  p->mutable_request_counts()->set_failed(job.failed);
  p->mutable_request_counts()->set_cancelled(job.cancelled);
  p->set_prompt_tokens(job.prompt_tokens + live.prompt_tokens);
  const int64_t generated = job.generated_tokens + live.generated_tokens;
  p->set_generated_tokens(generated);
  p->set_max_tokens_total(live.max_tokens_total);
  const JobRate rate = RateOf(job, live, generated);
  p->set_elapsed_seconds(rate.elapsed_seconds);
  p->set_tokens_per_second(rate.tokens_per_second);
  p->set_eta_seconds(rate.eta_seconds);
  const EngineStats e = at.worker->engine_stats();
  v1::EngineActivity* a = p->mutable_engine();
  a->set_backend(e.backend);
  a->set_passes(e.passes);
  a->set_last_pass_tokens(e.last_pass.tokens);
  a->set_last_pass_micro_batches(e.last_pass.micro_batches);
  a->set_last_pass_seconds(e.last_pass.pass_seconds);
  if (e.forward_seconds > 0) {
    a->set_device_busy(e.device_seconds / e.forward_seconds);
    a->set_cpu_attention_busy(e.cpu_attention_seconds / e.forward_seconds);
    a->set_weight_transfer_busy(e.weight_transfer_seconds / e.forward_seconds);
  }
  a->set_kv_blocks_used(e.kv_blocks_total - e.kv_blocks_free);
  a->set_kv_blocks_total(e.kv_blocks_total);
  a->set_preemptions(e.preemptions);
  a->set_prefill_tokens(e.prefill_tokens);
  a->set_decode_tokens(e.decode_tokens);
  a->set_s_mbu(e.last_utilization.s_mbu);
  a->set_s_mfu(e.last_utilization.s_mfu);
  a->set_achieved_gbs(e.last_utilization.bytes_per_second / 1e9);
  a->set_achieved_tflops(e.last_utilization.flops_per_second / 1e12);
}

class BatchServiceImpl::StreamSlot {
 public:
  explicit StreamSlot(BatchServiceImpl* service) : service_(service) {
    taken_ = service_->open_streams_.fetch_add(1) < service_->max_streams_;
    if (!taken_) service_->open_streams_.fetch_sub(1);
  }
  ~StreamSlot() {
    if (taken_) service_->open_streams_.fetch_sub(1);
  }
  bool taken() const { return taken_; }
  grpc::Status Refusal() const {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("moebatchd has ", service_->max_streams_,
                                     " WatchJob/GetResults streams open, its --max_streams; close "
                                     "one or try again later"));
  }

 private:
  BatchServiceImpl* service_;
  bool taken_ = false;
};

grpc::Status BatchServiceImpl::WatchJob(grpc::ServerContext* context,
                                        const v1::WatchJobRequest* request,
                                        grpc::ServerWriter<v1::JobProgress>* writer) {
  auto who = Authenticate(*context);
  if (!who.ok()) return ToGrpc(who.status());
  const Attached* a = attached();
  if (a == nullptr) return Loading();
  if (request->job_id().empty()) return MissingJobId();
  const StreamSlot slot(this);
  if (!slot.taken()) return slot.Refusal();
  int64_t seen = a->worker->version();
  std::string last;
  while (!context->IsCancelled()) {
    // The credentials again at every turn (at least twice a second): a token revoked by SIGHUP
    // ends its open streams.
    if (auto again = Authenticate(*context); !again.ok()) return ToGrpc(again.status());
    auto job = VisibleJob(*who, request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    v1::JobProgress progress;
    FillProgress(*a, *job, &progress);
    std::string bytes = progress.SerializeAsString();
    if (bytes != last) {
      if (!writer->Write(progress)) return grpc::Status::CANCELLED;
      last = std::move(bytes);
    }
    if (IsTerminal(job->state)) return grpc::Status::OK;
    seen = a->worker->WaitForChange(seen, absl::Milliseconds(500));
  }
  return grpc::Status::CANCELLED;
}

grpc::Status BatchServiceImpl::GetResults(grpc::ServerContext* context,
                                          const v1::GetResultsRequest* request,
                                          grpc::ServerWriter<v1::Result>* writer) {
  auto who = Authenticate(*context);
  if (!who.ok()) return ToGrpc(who.status());
  if (request->job_id().empty()) return MissingJobId();
  const StreamSlot slot(this);
  if (!slot.taken()) return slot.Refusal();
  int64_t next = 0;  // results stream in input order: the next index to send
  const Attached* a = attached();
  int64_t seen = a != nullptr ? a->worker->version() : 0;
  while (!context->IsCancelled()) {
    if (auto again = Authenticate(*context); !again.ok()) return ToGrpc(again.status());
    auto job = VisibleJob(*who, request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    const bool terminal = IsTerminal(job->state);
    auto results = store_->Results(job->id, next);
    if (!results.ok()) return ToGrpc(results.status());
    for (const StoredResult& r : *results) {
      // Running: only the contiguous prefix (a later result waits for the earlier ones). Finished:
      // everything there is (a cancelled job has gaps that will never fill).
      if (r.index != next && !terminal) break;
      v1::Result out;
      out.set_index(r.index);
      out.set_custom_id(ValidUtf8(r.custom_id));
      out.set_line(ValidUtf8(r.line));
      if (!writer->Write(out)) return grpc::Status::CANCELLED;
      next = r.index + 1;
    }
    if (terminal || !request->wait()) return grpc::Status::OK;
    seen = WaitForChange(seen, absl::Milliseconds(500));
  }
  return grpc::Status::CANCELLED;
}

}  // namespace moebatch
