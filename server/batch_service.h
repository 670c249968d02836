// moebatch.v1.BatchService on gRPC's synchronous server (one handler thread per call from gRPC's
// pool). Handlers validate, talk to the job store and the engine worker, and map absl::Status to
// gRPC status with the same code (INVALID_ARGUMENT names the line and field; NOT_FOUND for an
// unknown job). Nothing here aborts on input.
#pragma once

#include <mutex>
#include <random>
#include <string>

#include "moebatch/v1/batch.grpc.pb.h"
#include "server/engine_worker.h"
#include "server/job_request.h"
#include "server/job_store.h"

namespace moebatch {

class BatchServiceImpl final : public v1::BatchService::Service {
 public:
  // Borrows all; they must outlive the service.
  BatchServiceImpl(JobStore* store, EngineWorker* worker, const Tokenizer* tokenizer,
                   JobLimits limits);

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

 private:
  std::string NewJobId();
  void FillProgress(const JobRecord& job, v1::JobProgress* progress);

  JobStore* store_;
  EngineWorker* worker_;
  const Tokenizer* tokenizer_;
  JobLimits limits_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
};

// absl::Status -> grpc::Status (the codes are numbered alike).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace moebatch
