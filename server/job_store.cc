// The durable job store (server/job_store.h) on the SQLite C API.
//
// Schema version 4 (PRAGMA user_version = 4, PRAGMA application_id = kApplicationId):
//   jobs(id, seq, state, model, metadata, total, completed, failed, prompt_tokens,
//        generated_tokens, created_at, started_at, finished_at, error, tenant, cancelled,
//        endpoint, completion_window, input_file_id, expires_at, cancelling_at, errors,
//        output_deleted, errors_deleted)
//     seq: creation order (MAX(seq) + 1 inside the creating transaction); metadata: a JSON object
//     of strings; state: the JobState number; times in Unix seconds; tenant: the owner;
//     cancelled: requests a cancel dropped; errors: JSON (job_store_codec.h);
//     output_deleted / errors_deleted: 1 once DeleteResults removed the successful / failed rows.
//   requests(job_id, idx, custom_id, line, prompt_token_ids, budget_tokens)
//     PRIMARY KEY (job_id, idx); prompt_token_ids: a BLOB of little-endian int32;
//     budget_tokens: prompt tokens + n * max_tokens (what the request may add to the KV cache).
// Version 1 (no tenant, no budget_tokens) is upgraded in place on open: its jobs belong to the
// tenant "local" (the principal when authentication is off) and its requests count 0 tokens.
// Version 2 (no batch columns) is upgraded in place too: its jobs are not HTTP batches.
// Version 3 (no *_deleted columns) is upgraded in place: a job whose counters promise rows of an
// outcome that are gone had them deleted (one pass over the jobs, probing their results).
//   results(job_id, idx, custom_id, line, failed)  PRIMARY KEY (job_id, idx)
//     failed: 1 for error lines, those of requests a cancel dropped included.
// A request is pending while it has no results row and its job is VALIDATING or IN_PROGRESS.
//
// Every statement is constant SQL text with bound parameters. Every write is one transaction
// (BEGIN IMMEDIATE ... COMMIT) on a connection in WAL mode with synchronous=FULL: a write that
// returned OK is on disk, and a crash at any point leaves all of it or none of it. A result is
// inserted with ON CONFLICT DO NOTHING and the counters move only when a row was inserted, so they
// always equal the number of result rows. Column encodings (token BLOBs, metadata JSON, page
// tokens) are in job_store_codec.h.
#include "server/job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <random>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "server/job_store_codec.h"
#include "server/job_store_internal.h"
#include "server/sqlite_db.h"
#include "spdlog/spdlog.h"

namespace moebatch {

using job_store_internal::Blob;
using job_store_internal::Exec;
using job_store_internal::IsKnownState;
using job_store_internal::kSelectJob;
using job_store_internal::NotFound;
using job_store_internal::NowSeconds;
using job_store_internal::ReadJob;
using job_store_internal::Statement;
using job_store_internal::Sv;
using job_store_internal::Transaction;

namespace {

constexpr int kSchemaVersion = 4;
constexpr int64_t kApplicationId = 0x6d6f6562;  // "moeb" in the database header
constexpr int kBusyTimeoutMs = 10000;           // waiting for another process's write lock
constexpr int32_t kMaxPageSize = 1000;
constexpr const char* kDbFileName = "moebatch.db";
// The key that seals ListJobs page tokens (job_store_codec.h), beside the database.
constexpr const char* kPageTokenKeyFileName = "page_token.key";

constexpr const char* kSchemaSql = R"sql(
CREATE TABLE jobs (
  id TEXT PRIMARY KEY NOT NULL,
  seq INTEGER NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  model TEXT NOT NULL,
  metadata TEXT NOT NULL,
  total INTEGER NOT NULL,
  completed INTEGER NOT NULL,
  failed INTEGER NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  generated_tokens INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  started_at INTEGER NOT NULL,
  finished_at INTEGER NOT NULL,
  error TEXT NOT NULL,
  tenant TEXT NOT NULL
);
CREATE INDEX jobs_by_created ON jobs (created_at, seq);
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_tenant ON jobs (tenant, state);
CREATE TABLE requests (
  job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx INTEGER NOT NULL,
  custom_id TEXT NOT NULL,
  line TEXT NOT NULL,
  prompt_token_ids BLOB NOT NULL,
  budget_tokens INTEGER NOT NULL,
  PRIMARY KEY (job_id, idx)
);
CREATE TABLE results (
  job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx INTEGER NOT NULL,
  custom_id TEXT NOT NULL,
  line TEXT NOT NULL,
  failed INTEGER NOT NULL,
  PRIMARY KEY (job_id, idx)
);
PRAGMA application_id = 1836016994;
PRAGMA user_version = 2;
)sql";
static_assert(kApplicationId == 1836016994, "kSchemaSql spells kApplicationId in decimal");
// kSchemaSql makes version 2; kUpgradeV2Sql and kUpgradeV3Sql then make it the current one.
static_assert(kSchemaVersion == 4, "kUpgradeV3Sql spells kSchemaVersion");

// Version 1 -> 2, inside the opening write transaction.
constexpr const char* kUpgradeV1Sql = R"sql(
ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'local';
ALTER TABLE requests ADD COLUMN budget_tokens INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_by_tenant ON jobs (tenant, state);
PRAGMA user_version = 2;
)sql";

// Version 2 -> 3, inside the opening write transaction.
constexpr const char* kUpgradeV2Sql = R"sql(
ALTER TABLE jobs ADD COLUMN cancelled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN endpoint TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN completion_window TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN input_file_id TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN expires_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cancelling_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN errors TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_by_finished ON jobs (finished_at);
PRAGMA user_version = 3;
)sql";

// Version 3 -> 4, inside the opening write transaction. The counters equal the result rows of each
// outcome until DeleteResults removes them: counters without rows mean deleted rows.
constexpr const char* kUpgradeV3Sql = R"sql(
ALTER TABLE jobs ADD COLUMN output_deleted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN errors_deleted INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET output_deleted = 1 WHERE completed > 0 AND
  NOT EXISTS (SELECT 1 FROM results r WHERE r.job_id = jobs.id AND r.failed = 0);
UPDATE jobs SET errors_deleted = 1 WHERE failed + cancelled > 0 AND
  NOT EXISTS (SELECT 1 FROM results r WHERE r.job_id = jobs.id AND r.failed = 1);
PRAGMA user_version = 4;
)sql";

enum class SchemaCheck { kEmpty, kCurrent, kVersion1, kVersion2, kVersion3 };

// What the file is: empty (a new file: create the schema), a moebatch database of this version,
// or of version 1, 2 or 3 (upgrade it); FailedPrecondition for anything else.
absl::StatusOr<SchemaCheck> CheckSchema(sqlite3* db, const std::string& path) {
  absl::StatusOr<Statement> stmt =
      Statement::Prepare(db,
                         "SELECT (SELECT application_id FROM pragma_application_id), "
                         "(SELECT user_version FROM pragma_user_version), "
                         "(SELECT count(*) FROM sqlite_master), "
                         "(SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                         "name IN ('jobs', 'requests', 'results'))");
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::InternalError("job store: schema query returned no row");
  int64_t application_id = stmt->Int(0), version = stmt->Int(1), objects = stmt->Int(2),
          tables = stmt->Int(3);
  if (application_id == 0 && version == 0 && objects == 0) return SchemaCheck::kEmpty;
  if (application_id != kApplicationId) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is a SQLite database of another program (application_id ",
                     application_id, "), not a moebatch job store"));
  }
  if (version < 1 || version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is a moebatch job store of schema version ", version,
                     "; this build reads versions 1 to ", kSchemaVersion));
  }
  if (tables != 3) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is a moebatch job store missing some of its tables"));
  }
  if (version == 1) return SchemaCheck::kVersion1;
  if (version == 2) return SchemaCheck::kVersion2;
  return version == 3 ? SchemaCheck::kVersion3 : SchemaCheck::kCurrent;
}

}  // namespace

namespace job_store_internal {

absl::Status NotFound(const std::string& job_id) {
  constexpr size_t kMaxIdBytes = 64;
  std::string id = job_id.substr(0, kMaxIdBytes);
  while (!id.empty() && id.size() < job_id.size() &&
         (static_cast<unsigned char>(job_id[id.size()]) & 0xC0) == 0x80) {
    id.pop_back();  // not inside a UTF-8 character
  }
  return absl::NotFoundError(
      absl::StrCat("job ", id, id.size() < job_id.size() ? "..." : "", " not found"));
}

absl::StatusOr<JobRecord> ReadJob(const Statement& stmt, int64_t* seq) {
  JobRecord job;
  job.id = stmt.Text(0);
  job.state = static_cast<JobState>(stmt.Int(1));
  job.model = stmt.Text(2);
  absl::StatusOr<std::map<std::string, std::string>> metadata = DecodeMetadata(stmt.Text(3));
  if (!metadata.ok()) return metadata.status();
  job.metadata = *std::move(metadata);
  job.total = stmt.Int(4);
  job.completed = stmt.Int(5);
  job.failed = stmt.Int(6);
  job.prompt_tokens = stmt.Int(7);
  job.generated_tokens = stmt.Int(8);
  job.created_at = stmt.Int(9);
  job.started_at = stmt.Int(10);
  job.finished_at = stmt.Int(11);
  job.error = stmt.Text(12);
  if (seq != nullptr) *seq = stmt.Int(13);
  job.tenant = stmt.Text(14);
  job.cancelled = stmt.Int(15);
  job.endpoint = stmt.Text(16);
  job.completion_window = stmt.Text(17);
  job.input_file_id = stmt.Text(18);
  job.expires_at = stmt.Int(19);
  job.cancelling_at = stmt.Int(20);
  absl::StatusOr<std::vector<JobLineError>> errors = DecodeLineErrors(stmt.Text(21));
  if (!errors.ok()) return errors.status();
  job.errors = *std::move(errors);
  job.output_deleted = stmt.Int(22) != 0;
  job.errors_deleted = stmt.Int(23) != 0;
  return job;
}

}  // namespace job_store_internal

JobStore::JobStore() : impl_(std::make_unique<Impl>()) {}

JobStore::~JobStore() {
  {
    absl::MutexLock lock(&impl_->checkpoint_mu);
    impl_->stopping = true;
  }
  if (impl_->checkpoint_thread.joinable()) impl_->checkpoint_thread.join();
  {
    absl::MutexLock lock(&impl_->checkpoint_mu);
    if (impl_->checkpointer != nullptr) sqlite3_close_v2(impl_->checkpointer);
    impl_->checkpointer = nullptr;
  }
  {
    absl::MutexLock lock(&impl_->read_mu);
    if (impl_->reader != nullptr) sqlite3_close_v2(impl_->reader);
    impl_->reader = nullptr;
  }
  absl::MutexLock lock(&impl_->mu);
  // The last connection to close checkpoints the WAL into the database file.
  if (impl_->db != nullptr && sqlite3_close_v2(impl_->db) != SQLITE_OK) {
    spdlog::warn("job store: close failed: {}", sqlite3_errmsg(impl_->db));
  }
  impl_->db = nullptr;
}

namespace {

// A second connection to the store's file: read-only (the reader) or for checkpoints.
absl::StatusOr<sqlite3*> OpenConnection(const std::string& path, bool read_only) {
  sqlite3* db = nullptr;
  const int flags =
      (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    if (db != nullptr) sqlite3_close_v2(db);
    return absl::InternalError(absl::StrCat("job store: cannot open ", path, ": ", message));
  }
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  if (read_only) {
    if (absl::Status s = Exec(db, "PRAGMA query_only = ON"); !s.ok()) {
      sqlite3_close_v2(db);
      return s;
    }
  }
  return db;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& data_dir) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the data directory ", data_dir, ": ", ec.message()));
  }
  const std::string path = (std::filesystem::path(data_dir) / kDbFileName).string();
  // A store file that exists but is empty held jobs once, or was truncated: worth a warning, since
  // it opens as a new, empty store.
  std::error_code size_ec;
  if (std::filesystem::exists(path, size_ec) && std::filesystem::file_size(path, size_ec) == 0 &&
      !size_ec) {
    spdlog::warn(
        "job store: {} exists but is empty (0 bytes): if this daemon had jobs, they are gone (was "
        "the file truncated, or the disk full when it was made?); starting with an empty store",
        path);
  }

  std::unique_ptr<JobStore> store(new JobStore());
  Impl& impl = *store->impl_;
  absl::MutexLock lock(&impl.mu);
  try {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device(), device(), device()};
    impl.rng.seed(seed);
  } catch (const std::exception&) {
    // No entropy source: ids need only be unique, which the insert checks anyway.
    impl.rng.seed(static_cast<uint64_t>(
        std::chrono::steady_clock::now().time_since_epoch().count() ^ NowSeconds()));
  }

  // The connection is used under impl.mu only: SQLite's own mutexes are not needed.
  int rc =
      sqlite3_open_v2(path.c_str(), &impl.db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = impl.db != nullptr ? sqlite3_errmsg(impl.db) : sqlite3_errstr(rc);
    return absl::InternalError(absl::StrCat("job store: cannot open ", path, ": ", message));
  }
  sqlite3_busy_timeout(impl.db, kBusyTimeoutMs);
  auto codec = PageTokenCodec::FromKeyFile(
      (std::filesystem::path(data_dir) / kPageTokenKeyFileName).string());
  if (!codec.ok()) return codec.status();
  impl.page_tokens = *std::move(codec);

  // Check what the file is before changing anything in it.
  absl::StatusOr<SchemaCheck> schema = CheckSchema(impl.db, path);
  if (!schema.ok()) {
    int code = sqlite3_errcode(impl.db);
    if (code == SQLITE_NOTADB) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is not a moebatch job store: ", sqlite3_errmsg(impl.db)));
    }
    return schema.status();
  }

  {
    absl::StatusOr<Statement> wal = Statement::Prepare(impl.db, "PRAGMA journal_mode = WAL");
    if (!wal.ok()) return wal.status();
    absl::StatusOr<bool> row = wal->Step();
    if (!row.ok()) return row.status();
    std::string mode = *row ? wal->Text(0) : "";
    if (mode != "wal") {
      return absl::InternalError(
          absl::StrCat("job store: ", path, " cannot use WAL mode (journal_mode is ", mode, ")"));
    }
  }
  // SQLite's own check of the file (b-trees, pages, freelist; no index contents): a damaged page
  // found now, with the file named, rather than as INTERNAL on some later CreateJob.
  {
    absl::StatusOr<Statement> check = Statement::Prepare(impl.db, "PRAGMA quick_check(5)");
    if (!check.ok()) return check.status();
    std::vector<std::string> problems;
    for (;;) {
      absl::StatusOr<bool> row = check->Step();
      if (!row.ok()) {
        problems.push_back(std::string(row.status().message()));
        break;
      }
      if (!*row) break;
      if (const std::string text = check->Text(0); text != "ok") problems.push_back(text);
    }
    if (!problems.empty()) {
      return absl::DataLossError(absl::StrCat(
          "job store ", path, " is damaged (SQLite quick_check: ", absl::StrJoin(problems, "; "),
          "); restore it from a backup, or move it away to start with an empty store"));
    }
  }
  if (absl::Status s = Exec(impl.db, "PRAGMA synchronous = FULL"); !s.ok()) return s;
  if (absl::Status s = Exec(impl.db, "PRAGMA foreign_keys = ON"); !s.ok()) return s;

  if (*schema != SchemaCheck::kCurrent) {
    // Check again under the write lock: another process may have created or upgraded it meanwhile.
    Transaction txn(impl.db);
    if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;
    schema = CheckSchema(impl.db, path);
    if (!schema.ok()) return schema.status();
    if (*schema != SchemaCheck::kCurrent) {
      // The steps (from version, to version, SQL) from the file's version (0: empty) to the
      // current one.
      const int from = *schema == SchemaCheck::kEmpty      ? 0
                       : *schema == SchemaCheck::kVersion1 ? 1
                       : *schema == SchemaCheck::kVersion2 ? 2
                                                           : 3;
      struct Step {
        int from, to;
        const char* sql;
      };
      const Step steps[] = {
          {0, 2, kSchemaSql}, {1, 2, kUpgradeV1Sql}, {2, 3, kUpgradeV2Sql}, {3, 4, kUpgradeV3Sql}};
      int at = from;
      for (const Step& step : steps) {
        if (step.from != at) continue;
        if (absl::Status s = Exec(impl.db, step.sql); !s.ok()) return s;
        at = step.to;
      }
      if (from != 0) {
        spdlog::info("job store: upgraded {} from schema version {} to {}", path, from,
                     kSchemaVersion);
      }
    }
    if (absl::Status s = txn.Commit(); !s.ok()) return s;
  }
  // No checkpoint inside a commit (see Impl): the checkpointer thread does them.
  if (absl::Status s = Exec(impl.db, "PRAGMA wal_autocheckpoint = 0"); !s.ok()) return s;
  {
    absl::MutexLock read_lock(&impl.read_mu);
    auto reader = OpenConnection(path, /*read_only=*/true);
    if (!reader.ok()) return reader.status();
    impl.reader = *reader;
  }
  {
    absl::MutexLock checkpoint_lock(&impl.checkpoint_mu);
    auto checkpointer = OpenConnection(path, /*read_only=*/false);
    if (!checkpointer.ok()) return checkpointer.status();
    impl.checkpointer = *checkpointer;
  }
  impl.checkpoint_thread = std::thread([&impl] {
    // Every second, or sooner when stopped: a passive checkpoint (copies what no reader needs
    // from the WAL into the database file; never waits, never blocks a reader or the writer).
    absl::MutexLock lock(&impl.checkpoint_mu);
    while (
        !impl.checkpoint_mu.AwaitWithTimeout(absl::Condition(&impl.stopping), absl::Seconds(1))) {
      int wal_frames = 0, copied = 0;
      const int rc = sqlite3_wal_checkpoint_v2(impl.checkpointer, nullptr,
                                               SQLITE_CHECKPOINT_PASSIVE, &wal_frames, &copied);
      if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
        spdlog::warn("job store: checkpoint: {}", sqlite3_errmsg(impl.checkpointer));
      }
    }
  });
  return store;
}

namespace {

// The tenant's pending jobs and queued tokens (under the store's lock, inside a transaction when
// the caller needs one).
absl::StatusOr<TenantUsage> ReadUsage(sqlite3* db, const std::string& tenant) {
  absl::StatusOr<Statement> stmt = Statement::Prepare(
      db,
      "SELECT (SELECT count(*) FROM jobs WHERE tenant = ?1 AND state IN (?2, ?3, ?4)), "
      "(SELECT COALESCE(SUM(r.budget_tokens), 0) FROM jobs j JOIN requests r ON r.job_id = j.id "
      " LEFT JOIN results s ON s.job_id = r.job_id AND s.idx = r.idx "
      " WHERE j.tenant = ?1 AND j.state IN (?2, ?3) AND s.idx IS NULL)");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(tenant, static_cast<int64_t>(JobState::kValidating),
                                     static_cast<int64_t>(JobState::kInProgress),
                                     static_cast<int64_t>(JobState::kCancelling));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::InternalError("job store: usage query returned no row");
  return TenantUsage{stmt->Int(0), stmt->Int(1)};
}

}  // namespace

absl::StatusOr<TenantUsage> JobStore::Usage(const std::string& tenant) {
  absl::MutexLock lock(&impl_->read_mu);
  return ReadUsage(impl_->reader, tenant);
}

absl::StatusOr<JobRecord> JobStore::CreateJobUntracked(
    JobRecord job, const std::vector<StoredRequest>& requests,
    const std::vector<PrefailedRequest>& prefailed, const TenantQuota& quota) {
  const int64_t total = static_cast<int64_t>(requests.size() + prefailed.size());
  const bool failed_validation = job.state == JobState::kFailed && total == 0;
  if (total == 0 && !failed_validation) {
    return absl::InvalidArgumentError("a job needs at least one request");
  }
  if (job.state != JobState::kValidating && job.state != JobState::kInProgress &&
      !failed_validation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a new job must be validating or in_progress, not ", Sv(JobStateName(job.state))));
  }
  // The indices of requests and pre-failed requests together must be 0 .. total-1, each once.
  std::vector<bool> seen(static_cast<size_t>(total), false);
  auto claim = [&](int64_t index) -> absl::Status {
    if (index < 0 || index >= total) {
      return absl::InvalidArgumentError(
          absl::StrCat("request index ", index, " is outside 0..", total - 1));
    }
    if (seen[static_cast<size_t>(index)]) {
      return absl::InvalidArgumentError(absl::StrCat("request index ", index, " appears twice"));
    }
    seen[static_cast<size_t>(index)] = true;
    return absl::OkStatus();
  };
  for (const StoredRequest& r : requests) {
    if (absl::Status s = claim(r.index); !s.ok()) return s;
  }
  for (const PrefailedRequest& r : prefailed) {
    if (absl::Status s = claim(r.index); !s.ok()) return s;
  }
  absl::StatusOr<std::string> metadata = EncodeMetadata(job.metadata);
  if (!metadata.ok()) return metadata.status();

  const int64_t now = NowSeconds();
  if (job.created_at == 0) job.created_at = now;
  job.total = total;
  job.completed = 0;
  job.failed = static_cast<int64_t>(prefailed.size());
  job.prompt_tokens = 0;
  job.generated_tokens = 0;
  job.started_at = 0;
  job.finished_at = 0;
  job.cancelled = 0;
  job.cancelling_at = 0;
  if (failed_validation) {
    job.finished_at = now;
  } else if (requests.empty()) {  // every request failed validation: the job is done
    job.state = JobState::kCompleted;
    job.started_at = now;
    job.finished_at = now;
  }

  absl::MutexLock lock(&impl_->mu);
  sqlite3* db = impl_->db;
  Transaction txn(db);
  if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;

  if (job.id.empty()) {
    constexpr int kAttempts = 8;  // a collision of 96 random bits is not expected even once
    for (int attempt = 0; attempt < kAttempts && job.id.empty(); ++attempt) {
      std::string id = impl_->NewJobId();
      absl::StatusOr<bool> exists = Impl::JobExists(impl_->db, id);
      if (!exists.ok()) return exists.status();
      if (!*exists) job.id = std::move(id);
    }
    if (job.id.empty()) return absl::InternalError("job store: could not draw an unused job id");
  } else {
    absl::StatusOr<bool> exists = Impl::JobExists(impl_->db, job.id);
    if (!exists.ok()) return exists.status();
    if (*exists) return absl::AlreadyExistsError(absl::StrCat("job ", job.id, " already exists"));
  }
  if (quota.max_pending_jobs > 0 || quota.max_queued_tokens > 0) {
    absl::StatusOr<TenantUsage> usage = ReadUsage(db, job.tenant);
    if (!usage.ok()) return usage.status();
    if (quota.max_pending_jobs > 0 && !requests.empty() &&
        usage->pending_jobs + 1 > quota.max_pending_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant '", job.tenant, "' has ", usage->pending_jobs,
                       " unfinished jobs, the limit (max_pending_jobs_per_tenant) is ",
                       quota.max_pending_jobs, "; wait for one to finish"));
    }
    int64_t job_tokens = 0;
    for (const StoredRequest& r : requests) job_tokens += r.budget_tokens;
    if (quota.max_queued_tokens > 0 && job_tokens > 0 &&
        usage->queued_tokens + job_tokens > quota.max_queued_tokens) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant '", job.tenant, "' has ", usage->queued_tokens,
                       " tokens queued and this job adds ", job_tokens,
                       " (prompt + max_tokens), over the limit (max_queued_tokens_per_tenant) of ",
                       quota.max_queued_tokens));
    }
  }

  {
    absl::StatusOr<Statement> insert = Statement::Prepare(
        db,
        "INSERT INTO jobs (id, seq, state, model, metadata, total, completed, failed, "
        "prompt_tokens, generated_tokens, created_at, started_at, finished_at, error, tenant, "
        "cancelled, endpoint, completion_window, input_file_id, expires_at, cancelling_at, errors) "
        "VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
        "?, ?, ?, 0, ?, ?, ?, ?, 0, ?)");
    if (!insert.ok()) return insert.status();
    if (absl::Status s = insert->BindAll(
            job.id, static_cast<int64_t>(job.state), job.model, *metadata, job.total, job.completed,
            job.failed, job.prompt_tokens, job.generated_tokens, job.created_at, job.started_at,
            job.finished_at, job.error, job.tenant, job.endpoint, job.completion_window,
            job.input_file_id, job.expires_at, EncodeLineErrors(job.errors));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = insert->Run(); !s.ok()) return s;
  }
  {
    absl::StatusOr<Statement> insert =
        Statement::Prepare(db,
                           "INSERT INTO requests (job_id, idx, custom_id, line, prompt_token_ids, "
                           "budget_tokens) VALUES (?, ?, ?, ?, ?, ?)");
    if (!insert.ok()) return insert.status();
    for (const StoredRequest& r : requests) {
      const std::string ids = EncodeTokenIds(r.prompt_token_ids);
      if (absl::Status s =
              insert->BindAll(job.id, r.index, r.custom_id, r.line, Blob{ids}, r.budget_tokens);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = insert->Run(); !s.ok()) return s;
      insert->Reset();
    }
  }
  {
    absl::StatusOr<Statement> insert = Statement::Prepare(
        db, "INSERT INTO results (job_id, idx, custom_id, line, failed) VALUES (?, ?, ?, ?, 1)");
    if (!insert.ok()) return insert.status();
    for (const PrefailedRequest& r : prefailed) {
      if (absl::Status s = insert->BindAll(job.id, r.index, r.custom_id, r.result_line); !s.ok()) {
        return s;
      }
      if (absl::Status s = insert->Run(); !s.ok()) return s;
      insert->Reset();
    }
  }
  if (absl::Status s = txn.Commit(); !s.ok()) return s;
  return job;
}

absl::StatusOr<JobRecord> JobStore::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&impl_->read_mu);
  absl::StatusOr<Statement> stmt =
      Statement::Prepare(impl_->reader, std::string(kSelectJob) + "WHERE id = ?");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(job_id); !s.ok()) return s;
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return NotFound(job_id);
  return ReadJob(*stmt);
}

absl::StatusOr<JobStore::Page> JobStore::ListJobs(int32_t page_size, const std::string& page_token,
                                                  std::optional<JobState> state,
                                                  const std::string& tenant) {
  if (page_size < 1 || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be 1..", kMaxPageSize, ", got ", page_size));
  }
  if (state.has_value() && !IsKnownState(*state)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job state ", static_cast<int>(*state)));
  }
  // Jobs strictly older than (created_at, seq) of the previous page's last job.
  std::pair<int64_t, int64_t> after(std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::max());
  if (!page_token.empty()) {
    std::optional<std::pair<int64_t, int64_t>> decoded =
        impl_->page_tokens->Decode(page_token, tenant);
    if (!decoded.has_value()) return absl::InvalidArgumentError("invalid page_token");
    after = *decoded;
  }

  absl::MutexLock lock(&impl_->read_mu);
  absl::StatusOr<Statement> stmt = Statement::Prepare(
      impl_->reader,
      std::string(kSelectJob) +
          "WHERE (?1 = 0 OR state = ?1) AND (created_at, seq) < (?2, ?3) "
          "AND (?5 = '' OR tenant = ?5) ORDER BY created_at DESC, seq DESC LIMIT ?4");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(state.has_value() ? static_cast<int64_t>(*state) : int64_t{0},
                                     after.first, after.second, int64_t{page_size} + 1, tenant);
      !s.ok()) {
    return s;
  }
  Page page;
  int64_t last_seq = 0;
  for (;;) {
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    if (static_cast<int64_t>(page.jobs.size()) == page_size) {  // there is a next page
      page.next_page_token =
          impl_->page_tokens->Encode(page.cursors.back().first, page.cursors.back().second, tenant);
      break;
    }
    absl::StatusOr<JobRecord> job = ReadJob(*stmt, &last_seq);
    if (!job.ok()) return job.status();
    page.cursors.emplace_back(job->created_at, last_seq);
    page.jobs.push_back(*std::move(job));
  }
  return page;
}

std::string JobStore::ResumeToken(const Page& page, size_t i, const std::string& tenant) const {
  return impl_->page_tokens->Encode(page.cursors[i].first, page.cursors[i].second, tenant);
}

absl::Status JobStore::SetJobStateUntracked(const std::string& job_id, JobState state,
                                            const std::string& error) {
  if (!IsKnownState(state)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job state ", static_cast<int>(state)));
  }
  absl::MutexLock lock(&impl_->mu);
  sqlite3* db = impl_->db;
  Transaction txn(db);
  if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;

  JobState current;
  int64_t finished_at;
  {
    absl::StatusOr<Statement> stmt =
        Statement::Prepare(db, "SELECT state, finished_at FROM jobs WHERE id = ?");
    if (!stmt.ok()) return stmt.status();
    if (absl::Status s = stmt->BindAll(job_id); !s.ok()) return s;
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) return NotFound(job_id);
    current = static_cast<JobState>(stmt->Int(0));
    finished_at = stmt->Int(1);
  }
  // A terminal state is final: e.g. a cancel racing with the last result finds the job completed.
  if (IsTerminal(current) && current != state) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is already ", Sv(JobStateName(current)),
                     "; it cannot become ", Sv(JobStateName(state))));
  }
  const int64_t now = NowSeconds();
  if (IsTerminal(state)) {
    if (finished_at == 0) finished_at = now;
  } else {
    finished_at = 0;
  }
  int64_t cancelled = 0, expired = 0;
  if ((state == JobState::kCancelled || state == JobState::kExpired) && current != state) {
    // Every request without a result gets an error line (OpenAI's batch output line with
    // "response": null), built by SQLite's json_object so that custom_id is escaped as JSON.
    const bool cancel = state == JobState::kCancelled;
    absl::StatusOr<Statement> fill = Statement::Prepare(
        db,
        "INSERT INTO results (job_id, idx, custom_id, line, failed) "
        "SELECT r.job_id, r.idx, r.custom_id, json_object('id', 'batch_req_' || r.job_id || '_' "
        "|| r.idx, 'custom_id', r.custom_id, 'response', NULL, 'error', json_object('code', ?2, "
        "'message', ?3)), 1 FROM requests r LEFT JOIN results s ON s.job_id = r.job_id AND "
        "s.idx = r.idx WHERE r.job_id = ?1 AND s.idx IS NULL");
    if (!fill.ok()) return fill.status();
    if (absl::Status s = fill->BindAll(
            job_id, cancel ? "batch_cancelled" : "batch_expired",
            cancel ? "the batch was cancelled before this request finished"
                   : "the batch expired (its completion_window passed) before this request "
                     "finished");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = fill->Run(); !s.ok()) return s;
    (cancel ? cancelled : expired) = sqlite3_changes(db);
  }
  {
    // An empty `error` keeps the stored one; cancelling_at is set once.
    absl::StatusOr<Statement> update = Statement::Prepare(
        db,
        "UPDATE jobs SET state = ?1, finished_at = ?2, "
        "error = CASE WHEN ?3 = '' THEN error ELSE ?3 END, cancelled = cancelled + ?5, "
        "failed = failed + ?8, "
        "cancelling_at = CASE WHEN ?1 = ?6 AND cancelling_at = 0 THEN ?7 ELSE cancelling_at END "
        "WHERE id = ?4");
    if (!update.ok()) return update.status();
    if (absl::Status s =
            update->BindAll(static_cast<int64_t>(state), finished_at, error, job_id, cancelled,
                            static_cast<int64_t>(JobState::kCancelling), now, expired);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = update->Run(); !s.ok()) return s;
  }
  return txn.Commit();
}

absl::StatusOr<std::map<JobState, int64_t>> JobStore::CountJobsByState() {
  absl::MutexLock lock(&impl_->read_mu);
  absl::StatusOr<Statement> stmt =
      Statement::Prepare(impl_->reader, "SELECT state, count(*) FROM jobs GROUP BY state");
  if (!stmt.ok()) return stmt.status();
  std::map<JobState, int64_t> counts;
  for (;;) {
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    counts[static_cast<JobState>(stmt->Int(0))] = stmt->Int(1);
  }
  return counts;
}

namespace {

// The first column of every row, as text.
absl::StatusOr<std::vector<std::string>> FirstColumn(Statement& stmt) {
  std::vector<std::string> values;
  for (;;) {
    absl::StatusOr<bool> row = stmt.Step();
    if (!row.ok()) return row.status();
    if (!*row) return values;
    values.push_back(stmt.Text(0));
  }
}

}  // namespace

absl::StatusOr<std::vector<std::string>> JobStore::JobsToExpire(int64_t now) {
  absl::MutexLock lock(&impl_->read_mu);
  absl::StatusOr<Statement> stmt = Statement::Prepare(
      impl_->reader,
      "SELECT id FROM jobs WHERE expires_at > 0 AND expires_at <= ? AND state IN (?, ?, ?, ?) "
      "ORDER BY seq");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(now, static_cast<int64_t>(JobState::kValidating),
                                     static_cast<int64_t>(JobState::kInProgress),
                                     static_cast<int64_t>(JobState::kFinalizing),
                                     static_cast<int64_t>(JobState::kCancelling));
      !s.ok()) {
    return s;
  }
  return FirstColumn(*stmt);
}

absl::StatusOr<std::vector<std::string>> JobStore::JobsInState(JobState state) {
  if (!IsKnownState(state)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown job state ", static_cast<int>(state)));
  }
  absl::MutexLock lock(&impl_->read_mu);
  absl::StatusOr<Statement> stmt =
      Statement::Prepare(impl_->reader, "SELECT id FROM jobs WHERE state = ? ORDER BY seq");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(static_cast<int64_t>(state)); !s.ok()) return s;
  return FirstColumn(*stmt);
}

absl::Status JobStore::DeleteJob(const std::string& job_id) {
  absl::Status st = [&]() -> absl::Status {
    absl::MutexLock lock(&impl_->mu);
    Transaction txn(impl_->db);
    if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;
    absl::StatusOr<Statement> stmt =
        Statement::Prepare(impl_->db, "SELECT state FROM jobs WHERE id = ?");
    if (!stmt.ok()) return stmt.status();
    if (absl::Status s = stmt->BindAll(job_id); !s.ok()) return s;
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) return NotFound(job_id);
    const JobState state = static_cast<JobState>(stmt->Int(0));
    if (!IsTerminal(state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", Sv(JobStateName(state)),
                       "; only a finished job can be deleted (cancel it first)"));
    }
    // Requests and results go with it (ON DELETE CASCADE).
    absl::StatusOr<Statement> del = Statement::Prepare(impl_->db, "DELETE FROM jobs WHERE id = ?");
    if (!del.ok()) return del.status();
    if (absl::Status s = del->BindAll(job_id); !s.ok()) return s;
    if (absl::Status s = del->Run(); !s.ok()) return s;
    return txn.Commit();
  }();
  Track(st);
  return st;
}

absl::StatusOr<int64_t> JobStore::DeleteJobsFinishedBefore(int64_t cutoff) {
  absl::StatusOr<int64_t> deleted = [&]() -> absl::StatusOr<int64_t> {
    absl::MutexLock lock(&impl_->mu);
    Transaction txn(impl_->db);
    if (absl::Status s = txn.Begin(/*write=*/true); !s.ok()) return s;
    absl::StatusOr<Statement> del = Statement::Prepare(
        impl_->db,
        "DELETE FROM jobs WHERE state IN (?, ?, ?, ?) AND finished_at > 0 AND finished_at < ?");
    if (!del.ok()) return del.status();
    if (absl::Status s = del->BindAll(static_cast<int64_t>(JobState::kCompleted),
                                      static_cast<int64_t>(JobState::kFailed),
                                      static_cast<int64_t>(JobState::kCancelled),
                                      static_cast<int64_t>(JobState::kExpired), cutoff);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = del->Run(); !s.ok()) return s;
    const int64_t n = sqlite3_changes(impl_->db);
    if (absl::Status s = txn.Commit(); !s.ok()) return s;
    return n;
  }();
  Track(deleted.status());
  return deleted;
}

absl::StatusOr<JobStore::AfterPage> JobStore::ListJobsAfter(const std::string& after_id,
                                                            int32_t limit,
                                                            const std::string& tenant) {
  if (limit < 1 || limit > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit must be 1..", kMaxPageSize, ", got ", limit));
  }
  absl::MutexLock lock(&impl_->read_mu);
  Transaction txn(impl_->reader);
  if (absl::Status s = txn.Begin(/*write=*/false); !s.ok()) return s;
  std::pair<int64_t, int64_t> after(std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::max());
  if (!after_id.empty()) {
    absl::StatusOr<Statement> cursor = Statement::Prepare(
        impl_->reader,
        "SELECT created_at, seq FROM jobs WHERE id = ?1 AND (?2 = '' OR tenant = ?2)");
    if (!cursor.ok()) return cursor.status();
    if (absl::Status s = cursor->BindAll(after_id, tenant); !s.ok()) return s;
    absl::StatusOr<bool> row = cursor->Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::InvalidArgumentError("after: no such batch");
    after = {cursor->Int(0), cursor->Int(1)};
  }
  absl::StatusOr<Statement> stmt = Statement::Prepare(
      impl_->reader, std::string(kSelectJob) +
                         "WHERE (created_at, seq) < (?1, ?2) AND (?3 = '' OR tenant = ?3) "
                         "ORDER BY created_at DESC, seq DESC LIMIT ?4");
  if (!stmt.ok()) return stmt.status();
  if (absl::Status s = stmt->BindAll(after.first, after.second, tenant, int64_t{limit} + 1);
      !s.ok()) {
    return s;
  }
  AfterPage page;
  absl::StatusOr<bool> has_more = sqlite::ReadPage(*stmt, limit, [&](const Statement& row) {
    absl::StatusOr<JobRecord> job = ReadJob(row);
    if (!job.ok()) return job.status();
    page.jobs.push_back(*std::move(job));
    return absl::OkStatus();
  });
  if (!has_more.ok()) return has_more.status();
  page.has_more = *has_more;
  if (absl::Status s = txn.Commit(); !s.ok()) return s;
  return page;
}

bool JobStore::IsStorageFailure(const absl::Status& status) {
  return status.GetPayload(sqlite::kStorageFailurePayload).has_value();
}

void JobStore::Track(const absl::Status& status) {
  if (!status.ok() && !IsStorageFailure(status)) return;  // the caller's argument, not the disk
  absl::MutexLock lock(&impl_->health_mu);
  if (status.ok() != impl_->health.ok()) {
    if (status.ok()) {
      spdlog::info("job store: writes succeed again");
    } else {
      spdlog::error("job store: {}", status.ToString());
    }
  }
  impl_->health = status;
}

absl::Status JobStore::ProbeWrite() {
  absl::Status st;
  {
    absl::MutexLock lock(&impl_->mu);
    st = Exec(impl_->db,
              "CREATE TABLE IF NOT EXISTS health_probe(id INTEGER PRIMARY KEY, at INTEGER); "
              "INSERT OR REPLACE INTO health_probe(id, at) VALUES (1, strftime('%s', 'now'))");
  }
  Track(st);
  return st;
}

absl::Status JobStore::health() const {
  absl::MutexLock lock(&impl_->health_mu);
  return impl_->health;
}

absl::StatusOr<JobRecord> JobStore::CreateJob(JobRecord job,
                                              const std::vector<StoredRequest>& requests,
                                              const std::vector<PrefailedRequest>& prefailed,
                                              const TenantQuota& quota) {
  auto created = CreateJobUntracked(std::move(job), requests, prefailed, quota);
  Track(created.status());
  return created;
}

absl::StatusOr<bool> JobStore::CommitResult(const std::string& job_id, const StoredResult& result,
                                            int64_t prompt_tokens, int64_t generated_tokens) {
  auto committed = CommitResultUntracked(job_id, result, prompt_tokens, generated_tokens);
  Track(committed.status());
  return committed;
}

absl::Status JobStore::SetJobState(const std::string& job_id, JobState state,
                                   const std::string& error) {
  absl::Status st = SetJobStateUntracked(job_id, state, error);
  Track(st);
  return st;
}

}  // namespace moebatch
