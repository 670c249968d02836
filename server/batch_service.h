// moebatch.v1.BatchService on gRPC's synchronous server (one handler thread per call from gRPC's
// pool). Handlers authenticate the caller (server/auth.h), validate, talk to the job store and the
// engine worker, and map absl::Status to gRPC status with the same code (INVALID_ARGUMENT names
// the line and field; NOT_FOUND for an unknown job or another tenant's; RESOURCE_EXHAUSTED names
// the tenant limit). Nothing here aborts on input.
//
// Life cycle: the service is registered before the model loads, so that grpc.health.v1 can say
// NOT_SERVING meanwhile. Until Attach, CreateJob, CancelJob and WatchJob answer UNAVAILABLE;
// GetJob, ListJobs and GetResults already read the store. After StopAccepting (SIGTERM) CreateJob
// answers UNAVAILABLE while the rest keeps working until the server shuts down.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <random>
#include <string>

#include "absl/synchronization/mutex.h"
#include "moebatch/v1/batch.grpc.pb.h"
#include "server/auth.h"
#include "server/engine_worker.h"
#include "server/job_request.h"
#include "server/job_store.h"

namespace moebatch {

// JobRecord's OpenAI batch fields, given by POST /v1/batches.
struct BatchFields {
  std::string endpoint, completion_window, input_file_id;
  int64_t expires_at = 0;
};

class BatchServiceImpl final : public v1::BatchService::Service {
 public:
  // Borrows both; they must outlive the service. `auth` null: authentication off (every caller
  // is LocalPrincipal()).
  BatchServiceImpl(JobStore* store, const TokenAuthenticator* auth);

  // The engine is loaded: serve everything. Borrows worker and tokenizer. Call once.
  void Attach(EngineWorker* worker, const Tokenizer* tokenizer, JobLimits limits,
              TenantQuota quota);
  // Shutting down: CreateJob answers UNAVAILABLE from now on.
  void StopAccepting() { accepting_ = false; }
  // WatchJob and GetResults streams open at once, at most (each holds a server thread while it
  // waits); one more answers RESOURCE_EXHAUSTED at once. Set before serving.
  void set_max_streams(int64_t n) { max_streams_ = n; }
  // Called after each job is stored (for metrics); set before serving.
  void set_on_job_created(std::function<void(const JobRecord&)> f) {
    on_job_created_ = std::move(f);
  }

  // The operations both front doors share (gRPC here, HTTP in server/http_api.h), for a caller
  // already authenticated. Errors as absl::Status: Unavailable while the model loads (Submit,
  // Cancel) and once shutting down (Submit); NotFound for an unknown job or another tenant's.
  // Validates (PrepareJob), stores and queues a job. A job with bad lines is InvalidArgument
  // listing them, unless `store_invalid` (HTTP batches, as OpenAI does): it is then stored FAILED
  // with every bad line in JobRecord::errors and returned.
  absl::StatusOr<JobRecord> Submit(const Principal& who, const v1::CreateJobRequest& request,
                                   const BatchFields& batch = {}, bool store_invalid = false);
  // The job if it exists and the caller may see it; NotFound (the store's message) otherwise.
  absl::StatusOr<JobRecord> VisibleJob(const Principal& who, const std::string& job_id);
  // Cancels (a finished job is returned as it is).
  absl::StatusOr<JobRecord> Cancel(const Principal& who, const std::string& job_id);
  // Deletes a finished job (FailedPrecondition while it runs).
  absl::Status Delete(const Principal& who, const std::string& job_id);
  // The daemon's model name, "" until Attach.
  std::string model_name() const;

  grpc::Status CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobProgress>* writer) override;
  grpc::Status GetResults(grpc::ServerContext* context, const v1::GetResultsRequest* request,
                          grpc::ServerWriter<v1::Result>* writer) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;

 private:
  struct Attached {
    EngineWorker* worker = nullptr;
    const Tokenizer* tokenizer = nullptr;
    JobLimits limits;
    TenantQuota quota;
  };
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContext& context) const;
  // Null until Attach.
  const Attached* attached() const;
  std::string NewJobId();
  // Progress of `job`: the store's counters, the worker's tokens in flight, and the rate and ETA
  // of the job clock (the store's whole seconds for a job this process did not run).
  void FillProgress(const Attached& a, const JobRecord& job, v1::JobProgress* progress);
  // Job.tokens_per_second and elapsed_seconds, as FillProgress reports them.
  void SetRate(const JobRecord& job, v1::Job* out) const;
  // Blocks until the worker reports a change or `timeout` (a plain sleep before Attach).
  int64_t WaitForChange(int64_t seen, absl::Duration timeout);

  JobStore* store_;
  const TokenAuthenticator* auth_;
  std::atomic<const Attached*> attached_{nullptr};
  std::unique_ptr<Attached> attached_storage_;
  std::atomic<bool> accepting_{true};
  int64_t max_streams_ = 256;
  std::atomic<int64_t> open_streams_{0};
  // Counts a stream for its lifetime; false (and counts nothing) when max_streams_ are open.
  class StreamSlot;
  std::function<void(const JobRecord&)> on_job_created_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
};

// absl::Status -> grpc::Status (the codes are numbered alike).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace moebatch
