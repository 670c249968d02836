#include "server/batch_service.h"

#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace moebatch {
namespace {

void ToProto(const JobRecord& r, v1::Job* job) {
  job->set_id(r.id);
  job->set_state(static_cast<v1::JobState>(r.state));
  job->set_model(r.model);
  job->mutable_metadata()->insert(r.metadata.begin(), r.metadata.end());
  job->mutable_request_counts()->set_total(r.total);
  job->mutable_request_counts()->set_completed(r.completed);
  job->mutable_request_counts()->set_failed(r.failed);
  job->set_created_at(r.created_at);
  job->set_finished_at(r.finished_at);
  job->set_error(r.error);
  job->set_started_at(r.started_at);
  job->set_prompt_tokens(r.prompt_tokens);
  job->set_generated_tokens(r.generated_tokens);
}

grpc::Status MissingJobId() {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: required");
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

BatchServiceImpl::BatchServiceImpl(JobStore* store, EngineWorker* worker,
                                   const Tokenizer* tokenizer, JobLimits limits)
    : store_(store),
      worker_(worker),
      tokenizer_(tokenizer),
      limits_(std::move(limits)),
      rng_(std::random_device{}()) {}

std::string BatchServiceImpl::NewJobId() {
  std::lock_guard<std::mutex> lock(rng_mu_);
  return absl::StrFormat("job_%016x%08x", rng_(), static_cast<uint32_t>(rng_()));
}

grpc::Status BatchServiceImpl::CreateJob(grpc::ServerContext*, const v1::CreateJobRequest* request,
                                         v1::Job* response) {
  JobRecord job;
  job.id = NewJobId();
  auto prepared = PrepareJob(*request, *tokenizer_, limits_, job.id);
  if (!prepared.ok()) return ToGrpc(prepared.status());
  job.state = JobState::kInProgress;
  job.model = limits_.model_name;
  job.metadata.insert(request->metadata().begin(), request->metadata().end());
  job.total = static_cast<int64_t>(prepared->requests.size() + prepared->prefailed.size());
  auto stored = store_->CreateJob(std::move(job), prepared->requests, prepared->prefailed);
  if (!stored.ok()) return ToGrpc(stored.status());
  spdlog::info("job {} created: {} requests ({} failed validation against the context)", stored->id,
               stored->total, prepared->prefailed.size());
  worker_->Wake();
  ToProto(*stored, response);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                      v1::Job* response) {
  if (request->job_id().empty()) return MissingJobId();
  auto job = store_->GetJob(request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  ToProto(*job, response);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                                        v1::ListJobsResponse* response) {
  int32_t page_size = request->page_size() == 0 ? 20 : request->page_size();
  if (page_size < 0 || page_size > 1000) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("page_size: must be in [1, 1000], got ", page_size));
  }
  std::optional<JobState> state;
  if (request->state() != v1::JOB_STATE_UNSPECIFIED) {
    state = static_cast<JobState>(request->state());
  }
  auto page = store_->ListJobs(page_size, request->page_token(), state);
  if (!page.ok()) return ToGrpc(page.status());
  for (const JobRecord& r : page->jobs) ToProto(r, response->add_jobs());
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                                         v1::Job* response) {
  if (request->job_id().empty()) return MissingJobId();
  auto job = store_->GetJob(request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  if (!IsTerminal(job->state) && job->state != JobState::kCancelling) {
    absl::Status st = store_->SetJobState(job->id, JobState::kCancelling);
    // FailedPrecondition: the job finished in the meantime; answer with its final state.
    if (!st.ok() && st.code() != absl::StatusCode::kFailedPrecondition) return ToGrpc(st);
    if (st.ok()) {
      worker_->Cancel(job->id);
      spdlog::info("job {} cancelling", job->id);
    }
    job = store_->GetJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
  }
  ToProto(*job, response);
  return grpc::Status::OK;
}

void BatchServiceImpl::FillProgress(const JobRecord& job, v1::JobProgress* p) {
  const JobLive live = worker_->Live(job.id);
  p->set_job_id(job.id);
  p->set_error(job.error);
  p->set_state(static_cast<v1::JobState>(job.state));
  p->mutable_request_counts()->set_total(job.total);
  p->mutable_request_counts()->set_completed(job.completed);
  p->mutable_request_counts()->set_failed(job.failed);
  p->set_prompt_tokens(job.prompt_tokens + live.prompt_tokens);
  const int64_t generated = job.generated_tokens + live.generated_tokens;
  p->set_generated_tokens(generated);
  const int64_t end =
      job.finished_at != 0 ? job.finished_at : static_cast<int64_t>(std::time(nullptr));
  const double elapsed = job.started_at != 0 ? static_cast<double>(end - job.started_at) : 0.0;
  p->set_tokens_per_second(elapsed > 0 ? generated / elapsed : 0.0);
  const EngineStats e = worker_->engine_stats();
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
  const int64_t done = job.completed + job.failed;
  p->set_eta_seconds(done > 0 && !IsTerminal(job.state) && elapsed > 0
                         ? elapsed / done * static_cast<double>(job.total - done)
                         : 0.0);
}

grpc::Status BatchServiceImpl::WatchJob(grpc::ServerContext* context,
                                        const v1::WatchJobRequest* request,
                                        grpc::ServerWriter<v1::JobProgress>* writer) {
  if (request->job_id().empty()) return MissingJobId();
  int64_t seen = worker_->version();
  std::string last;
  while (!context->IsCancelled()) {
    auto job = store_->GetJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    v1::JobProgress progress;
    FillProgress(*job, &progress);
    std::string bytes = progress.SerializeAsString();
    if (bytes != last) {
      if (!writer->Write(progress)) return grpc::Status::CANCELLED;
      last = std::move(bytes);
    }
    if (IsTerminal(job->state)) return grpc::Status::OK;
    seen = worker_->WaitForChange(seen, absl::Milliseconds(500));
  }
  return grpc::Status::CANCELLED;
}

grpc::Status BatchServiceImpl::GetResults(grpc::ServerContext* context,
                                          const v1::GetResultsRequest* request,
                                          grpc::ServerWriter<v1::Result>* writer) {
  if (request->job_id().empty()) return MissingJobId();
  int64_t next = 0;  // results stream in input order: the next index to send
  int64_t seen = worker_->version();
  while (!context->IsCancelled()) {
    auto job = store_->GetJob(request->job_id());
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
      out.set_custom_id(r.custom_id);
      out.set_line(r.line);
      if (!writer->Write(out)) return grpc::Status::CANCELLED;
      next = r.index + 1;
    }
    if (terminal || !request->wait()) return grpc::Status::OK;
    seen = worker_->WaitForChange(seen, absl::Milliseconds(500));
  }
  return grpc::Status::CANCELLED;
}

}  // namespace moebatch
