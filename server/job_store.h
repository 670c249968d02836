// The durable job store: SQLite in WAL mode at <data_dir>/moebatch.db.
//
// Guarantees: CreateJob writes the job and all its requests in one transaction before
// returning; each result is committed on its own as its request finishes; a result is stored at
// most once per (job, request index) (a second commit for the same index is ignored and reported),
// so a request is never duplicated after a crash and restart; PendingRequests() lists exactly the
// requests of unfinished jobs that have no result yet, which the daemon queues again on start.
//
// No gRPC or engine types here: job states are the proto's JobState numbers (server/job_state.h).
// Threading: all methods are safe to call from any thread (one SQLite connection guarded by a
// mutex; WAL lets readers of other processes proceed). Errors: absl::Status; NotFound for an
// unknown job id; Internal for SQLite failures (with SQLite's message).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/job_state.h"

namespace moebatch {

// A line of a batch input that failed validation (the OpenAI batch object's errors.data[i]).
struct JobLineError {
  int64_t line = 0;     // 1-based line of the input file; 0 when the error is not of one line
  std::string code;     // "invalid_request", "duplicate_custom_id", "invalid_json", ...
  std::string param;    // the field path ("body.temperature"), "" when none
  std::string message;  // the whole message
};

struct JobRecord {
  std::string id;  // assigned by CreateJob ("job_" + 24 hex chars) when empty
  JobState state = JobState::kInProgress;
  std::string model;
  std::map<std::string, std::string> metadata;
  int64_t total = 0;             // requests
  int64_t completed = 0;         // requests finished successfully
  int64_t failed = 0;            // requests finished with an error
  int64_t prompt_tokens = 0;     // sum over committed results
  int64_t generated_tokens = 0;  // sum over committed results
  int64_t created_at = 0;        // Unix seconds (set by CreateJob when 0)
  int64_t started_at = 0;        // Unix seconds: first result or first scheduling; 0 = not yet
  int64_t finished_at = 0;       // Unix seconds; 0 while not terminal
  std::string error;
  std::string tenant = "local";  // the owner (server/auth.h); "local" when authentication is off
  // Requests dropped by a cancel (their result rows say so: failed, code "batch_cancelled").
  // Once terminal: completed + failed + cancelled == total.
  int64_t cancelled = 0;
  // The OpenAI batch fields (docs/api.md): "" / 0 when the job was not made as a batch over HTTP
  // (endpoint: the url every line of an HTTP batch has).
  std::string endpoint;
  std::string completion_window;  // "24h"
  std::string input_file_id;
  int64_t expires_at = 0;            // Unix seconds; 0 = never
  int64_t cancelling_at = 0;         // Unix seconds of the cancel; 0 = not cancelled
  std::vector<JobLineError> errors;  // why the batch failed validation (state FAILED)
  // DeleteResults removed the successful (output) / failed (errors) result rows; the counters
  // above stay as they were.
  bool output_deleted = false;
  bool errors_deleted = false;
};

// A finished job's result files in the OpenAI Files API (server/http_api.h): its successful result
// lines (the output file, id "file-<job id>-output") and its failed ones, those a cancel or an
// expiry added included (the error file, "file-<job id>-errors").
inline constexpr char kResultFilePrefix[] = "file-";
inline constexpr char kOutputFileSuffix[] = "-output";
inline constexpr char kErrorFileSuffix[] = "-errors";
// The id of the job's output (failed = false) or error file.
std::string ResultFileId(const std::string& job_id, bool failed);
// Whether the job has that file: it is terminal, its counters hold such lines (completed; failed
// + cancelled), and DeleteResults did not remove them. JobStore::ListResultFiles lists exactly
// these (of jobs whose id starts with "job_").
bool HasResultFile(const JobRecord& job, bool failed);

// One request of a job as stored: enough to run it again after a restart and to format its result.
struct StoredRequest {
  int64_t index = 0;  // 0-based position in the job
  std::string custom_id;
  std::string line;                       // the request as an OpenAI batch input line (JSON)
  std::vector<int32_t> prompt_token_ids;  // tokenized at CreateJob
  int64_t budget_tokens = 0;  // prompt tokens + n * max_tokens: the most it adds to the KV cache
                              // (n choices share the prompt's blocks)
};

// A request that failed validation at CreateJob: its result is stored with the job.
struct PrefailedRequest {
  int64_t index = 0;
  std::string custom_id;
  std::string result_line;  // the OpenAI batch output line with the error
};

struct StoredResult {
  int64_t index = 0;
  std::string custom_id;
  std::string line;  // OpenAI batch output line
  bool failed = false;
};

// Per-tenant admission limits checked by CreateJob inside its transaction (0 = no limit).
struct TenantQuota {
  int64_t max_pending_jobs = 0;   // the tenant's unfinished jobs (validating, in progress,
                                  // cancelling), the new one included
  int64_t max_queued_tokens = 0;  // budget_tokens of the tenant's requests without a result
                                  // (unfinished jobs), the new job's included
};

// What a tenant has queued now (the figures TenantQuota limits).
struct TenantUsage {
  int64_t pending_jobs = 0;
  int64_t queued_tokens = 0;
};

// JobStore::PendingRequests leaves out the requests for which it returns true: (job id, index).
using PendingFilter = std::function<bool(const std::string& job_id, int64_t index)>;

struct PendingRequest {
  std::string job_id;
  std::string tenant;  // the job's
  StoredRequest request;
};

class JobStore {
 public:
  // Creates <data_dir> if needed, opens or creates moebatch.db (WAL, synchronous=FULL, foreign
  // keys on), creates or checks the schema. FailedPrecondition when the file is not a moebatch
  // database of a known schema version.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& data_dir);
  ~JobStore();

  // One transaction: the job row, every runnable request, and the results of the pre-failed ones
  // (counted as failed). Returns the stored job (id and created_at filled). If every request is
  // pre-failed the job is stored COMPLETED at once. A job in state FAILED with no requests is a
  // batch that failed validation (job.errors says why): stored as it is, finished at once. With a
  // quota, ResourceExhausted (naming the limit, the tenant's usage and the job's share) when the
  // job would take job.tenant past it; nothing is stored then. The check and the insert are one
  // transaction.
  absl::StatusOr<JobRecord> CreateJob(JobRecord job, const std::vector<StoredRequest>& requests,
                                      const std::vector<PrefailedRequest>& prefailed,
                                      const TenantQuota& quota = {});

  absl::StatusOr<TenantUsage> Usage(const std::string& tenant);

  absl::StatusOr<JobRecord> GetJob(const std::string& job_id);

  // Newest first (created_at, then creation order), at most page_size (1..1000); `state` filters
  // when set, `tenant` when not empty. `page_token` is the opaque token of the previous page
  // ("" for the first); InvalidArgument for a token this store did not produce.
  struct Page {
    std::vector<JobRecord> jobs;
    std::string next_page_token;  // "" on the last page
    // cursors[i]: where the page after jobs[i] starts, (created_at, creation number); ResumeToken
    // seals one for a caller that returns only the first i + 1 jobs (e.g. to bound a reply).
    std::vector<std::pair<int64_t, int64_t>> cursors;
  };
  absl::StatusOr<Page> ListJobs(int32_t page_size, const std::string& page_token,
                                std::optional<JobState> state, const std::string& tenant = "");
  // The page token of the page that starts after page.jobs[i], for the same `tenant` as ListJobs.
  std::string ResumeToken(const Page& page, size_t i, const std::string& tenant) const;

  // Stores the result of request `index` and updates the job's counters and token sums in one
  // transaction. Returns false (and changes nothing) when that index already has a result.
  // When this result completes the job (every request has a result) the job moves to COMPLETED
  // with finished_at set, unless it is CANCELLING (then CANCELLED).
  absl::StatusOr<bool> CommitResult(const std::string& job_id, const StoredResult& result,
                                    int64_t prompt_tokens, int64_t generated_tokens);

  // Sets the state (and error, finished_at for terminal states; cancelling_at for CANCELLING).
  // NotFound for an unknown job; FailedPrecondition when the job is already in another terminal
  // state (it stays there). CANCELLED gives every request without a result a failed result line
  // (error code "batch_cancelled"), counted in `cancelled`, in the same transaction; EXPIRED
  // likewise (code "batch_expired"), counted in `failed`.
  absl::Status SetJobState(const std::string& job_id, JobState state,
                           const std::string& error = "");

  // Whether the storage works: OK, or the failure of the last write the disk or the file caused
  // (ResourceExhausted: the disk is full; DataLoss: the file is damaged; Unavailable: an I/O
  // error), until a write succeeds again. The daemon reports NOT_SERVING while it is not OK.
  absl::Status health() const;
  // A small write (a row of its own table) that updates health() like any write: how the daemon
  // notices that the disk has space again when nothing else is writing.
  absl::Status ProbeWrite();
  // Whether `status` came from the storage (disk full, damaged file, I/O error), so retrying later
  // may succeed, rather than from the arguments.
  static bool IsStorageFailure(const absl::Status& status);

  // Requests without a result, of jobs in IN_PROGRESS or VALIDATING: round robin over the tenants
  // in name order, starting with the first tenant after `after_tenant` (wrapping around; "" starts
  // with the first), each tenant's in job creation order then index. A caller that passes the
  // tenant it fed last serves tenants in turn, so one tenant's large job does not hold back
  // another's. Requests `skip` names (the engine worker's in flight) are left out before their
  // line and tokens are read, and do not count. At most `limit` (0 = all).
  absl::StatusOr<std::vector<PendingRequest>> PendingRequests(int64_t limit = 0,
                                                              const std::string& after_tenant = "",
                                                              const PendingFilter& skip = {});

  // Results of a job with index >= from_index in index order, at most `limit` (0 = all);
  // `failed` set: only the failed (true) or only the successful (false) ones.
  absl::StatusOr<std::vector<StoredResult>> Results(const std::string& job_id, int64_t from_index,
                                                    int64_t limit = 0,
                                                    std::optional<bool> failed = std::nullopt);

  // The job's result rows by outcome, with their bytes as a JSONL file (each line + '\n'): the
  // sizes of the batch's output and error files (server/http_api.h).
  struct ResultStats {
    int64_t ok_lines = 0, ok_bytes = 0, failed_lines = 0, failed_bytes = 0;
  };
  absl::StatusOr<ResultStats> ResultSizes(const std::string& job_id);

  // Deletes the job's successful (failed = false) or failed result rows and marks them deleted
  // (JobRecord::output_deleted / errors_deleted: that result file is gone); the job's counters
  // stay. Returns the rows deleted. NotFound for an unknown job.
  absl::StatusOr<int64_t> DeleteResults(const std::string& job_id, bool failed);

  // Deletes a finished job with its requests and results. NotFound for an unknown job;
  // FailedPrecondition while it is not terminal (cancel it first).
  absl::Status DeleteJob(const std::string& job_id);

  // Retention: deletes every job that finished before `cutoff` (Unix seconds), with its requests
  // and results. Returns how many.
  absl::StatusOr<int64_t> DeleteJobsFinishedBefore(int64_t cutoff);

  // Jobs older than `after_id` (newest first, as ListJobs), at most `limit` (1..1000), of
  // `tenant` when not empty; `after_id` "" starts with the newest. InvalidArgument when after_id
  // names no job (of that tenant). `has_more`: older jobs remain.
  struct AfterPage {
    std::vector<JobRecord> jobs;
    bool has_more = false;
  };
  absl::StatusOr<AfterPage> ListJobsAfter(const std::string& after_id, int32_t limit,
                                          const std::string& tenant);

  // The result files (HasResultFile) of the jobs of `tenant` ("" = every tenant's) whose id starts
  // with "job_", ordered by (created_at = the job's finished_at, id = ResultFileId), ascending or
  // descending, strictly after the cursor (after_created_at: Unix seconds, after_id) in that order
  // (after_id "" = from the start); at most `limit` (1..10000; InvalidArgument otherwise).
  // `has_more`: more follow. Reads the jobs table only (one row per finished job), never the
  // results: the sizes of the files returned are ResultSizes'.
  struct ResultFile {
    std::string id;  // ResultFileId(job_id, failed)
    std::string job_id;
    bool failed = false;     // the error file
    int64_t created_at = 0;  // the job's finished_at, Unix seconds
  };
  struct ResultFilePage {
    std::vector<ResultFile> files;
    bool has_more = false;
  };
  absl::StatusOr<ResultFilePage> ListResultFiles(const std::string& tenant,
                                                 int64_t after_created_at,
                                                 const std::string& after_id, int32_t limit,
                                                 bool ascending);

  // The number of jobs in each state (states without jobs are absent), for metrics.
  absl::StatusOr<std::map<JobState, int64_t>> CountJobsByState();

  // Jobs not finished whose expires_at is set and not after `now` (Unix seconds): the daemon
  // expires them (EngineWorker::Cancel with JobState::kExpired).
  absl::StatusOr<std::vector<std::string>> JobsToExpire(int64_t now);

  // Jobs that are CANCELLING: on start the daemon finishes their cancellation.
  absl::StatusOr<std::vector<std::string>> JobsInState(JobState state);

 private:
  struct Impl;
  JobStore();
  // The writes, as the public ones but without updating health(), which those do with the result.
  absl::StatusOr<JobRecord> CreateJobUntracked(JobRecord job,
                                               const std::vector<StoredRequest>& requests,
                                               const std::vector<PrefailedRequest>& prefailed,
                                               const TenantQuota& quota);
  absl::StatusOr<bool> CommitResultUntracked(const std::string& job_id, const StoredResult& result,
                                             int64_t prompt_tokens, int64_t generated_tokens);
  absl::Status SetJobStateUntracked(const std::string& job_id, JobState state,
                                    const std::string& error);
  void Track(const absl::Status& status);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch
